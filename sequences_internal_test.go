package siphon

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/siphondb/siphon/canonical"
)

// TestReadSequenceStatesNamesTheMissingOne: a sequence dropped between the
// list and the read (a deploy dropping a table with an identity column)
// is reported as missing, by its place in the list, whether the statement
// that reads it fails when it is prepared (a new one, as the first read
// after the list's is) or when it runs (prepared already by an earlier
// read, then dropped): readSequences leaves it out and goes on.
func TestReadSequenceStatesNamesTheMissingOne(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn := newSessions(t, 1)[0]
	_, err := conn.Exec(ctx, "CREATE SEQUENCE kept; CREATE SEQUENCE dropped; CREATE SEQUENCE also_kept")
	require.NoError(t, err)
	seqs := []canonical.Sequence{
		{Schema: "public", Name: "kept"}, {Schema: "public", Name: "dropped"}, {Schema: "public", Name: "also_kept"},
	}
	_, err = readSequenceStates(ctx, conn, seqs)
	require.NoError(t, err, "all three there: each statement is prepared and cached")
	_, err = conn.Exec(ctx, "DROP SEQUENCE dropped")
	require.NoError(t, err)

	_, err = readSequenceStates(ctx, conn, seqs)
	var missing *missingSequenceError
	require.ErrorAs(t, err, &missing, "prepared already, fails when it runs")
	require.Equal(t, 1, missing.index)

	fresh := []canonical.Sequence{{Schema: "public", Name: "also_kept"}, {Schema: "public", Name: "never_made"}}
	_, err = readSequenceStates(ctx, conn, fresh)
	require.ErrorAs(t, err, &missing, "new, fails when it is prepared")
	require.Equal(t, 1, missing.index)
}
