package siphon_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/siphondb/siphon"
	"github.com/siphondb/siphon/canonical"
)

// These tests run no server: verifying a backup needs none.

func TestVerifyStreamNeedsNoDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const sys, tl = "7301234567890123456", 1
	bare := []struct {
		name string
		data []byte
	}{
		{"bare", incremental(t, sys, tl, 0x100, 0x200, "-")},
		{"enveloped", incremental(t, sys, tl, 0x100, 0x200, "")},
	}
	for _, tc := range bare {
		rep, err := siphon.VerifyStream(ctx, siphon.VerifyOptions{}, bytes.NewReader(tc.data))
		require.NoError(t, err, tc.name)
		assert.True(t, rep.OK, "%s: %v", tc.name, rep.Problems)
		assert.True(t, rep.Checked, tc.name)
		assert.Equal(t, canonical.KindIncremental, rep.Kind, tc.name)
		assert.NotEmpty(t, rep.Link, tc.name)

		damaged := bytes.Replace(tc.data, []byte(`"position":"0/100"`), []byte(`"position":"0/101"`), 1)
		rep, err = siphon.VerifyStream(ctx, siphon.VerifyOptions{}, bytes.NewReader(damaged))
		require.NoError(t, err, "%s: a damaged stream is a report, not an error", tc.name)
		assert.False(t, rep.OK, tc.name)
		assert.NotEmpty(t, rep.Problems, tc.name)
	}

	first := incremental(t, sys, tl, 0x100, 0x200, "-")
	second := incremental(t, sys, tl, 0x200, 0x300, "-")
	late := incremental(t, sys, tl, 0x250, 0x300, "-")
	chain, err := siphon.VerifyStreamChain(ctx, siphon.VerifyOptions{}, bytes.NewReader(first), bytes.NewReader(second))
	require.NoError(t, err)
	assert.True(t, chain.OK, "%v", chain.Problems)
	assert.Equal(t, canonical.Position(0x100), chain.Start)
	assert.Equal(t, canonical.Position(0x300), chain.End)

	chain, err = siphon.VerifyStreamChain(ctx, siphon.VerifyOptions{}, bytes.NewReader(first), bytes.NewReader(late))
	require.NoError(t, err)
	assert.False(t, chain.OK)
	assert.Equal(t, []string{"link 2: starts at 0/250, but link 1 ends at 0/200: a gap, the changes between them are missing"}, chain.Problems)
}

func TestVerifyStreamFlagsUncheckedStreams(t *testing.T) {
	t.Parallel()
	unchecked := `{"t":"header","format":"siphon.jsonl","version":1,"kind":"incremental","position":"0/100"}
{"t":"end","position":"0/100","records":0}
`
	rep, err := siphon.VerifyStream(context.Background(), siphon.VerifyOptions{}, strings.NewReader(unchecked))
	require.NoError(t, err)
	assert.False(t, rep.OK)
	assert.False(t, rep.Checked)
	require.Len(t, rep.Problems, 1)
	assert.Contains(t, rep.Problems[0], "carries no checksums")
	assert.Contains(t, rep.Problems[0], "ApplyOptions.Unchecked", "the problem says how to apply it anyway")

	chain, err := siphon.VerifyStreamChain(context.Background(), siphon.VerifyOptions{}, strings.NewReader(unchecked))
	require.NoError(t, err)
	assert.False(t, chain.OK)
	assert.Contains(t, chain.Problems[0], "link 1: the JSONL stream carries no checksums")
}

func TestVerifyStreamRefusesShortKeys(t *testing.T) {
	t.Parallel()
	_, err := siphon.VerifyStream(context.Background(), siphon.VerifyOptions{Keys: [][]byte{[]byte("short")}}, strings.NewReader(""))
	var opt *siphon.OptionError
	require.ErrorAs(t, err, &opt)
	assert.Equal(t, "VerifyOptions.Keys", opt.Option)
	assert.Contains(t, err.Error(), "fewer than 32")
}

// Check a chain of backups in a process that has no database to connect
// to: verifying reads only the streams (and runs pg_restore --list on a
// dump's archive).
func ExampleVerifyStreamChain() {
	// Two incremental backups, as BackupIncremental writes them; the second
	// starts later than the first ends.
	backup := func(start, end canonical.Position) io.ReadSeeker {
		var buf bytes.Buffer
		enc := canonical.NewEncoder(&buf)
		_ = enc.WriteHeader(canonical.Header{Kind: canonical.KindIncremental, Start: start, SystemID: "7301234567890123456", Timeline: 1})
		_ = enc.WriteEnd(end)
		return bytes.NewReader(buf.Bytes())
	}
	chain, err := siphon.VerifyStreamChain(context.Background(), siphon.VerifyOptions{}, backup(0x100, 0x200), backup(0x280, 0x300))
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(chain.OK, chain.Start, chain.End)
	for _, p := range chain.Problems {
		fmt.Println(p)
	}
	// Output:
	// false 0/100 0/300
	// link 2: starts at 0/280, but link 1 ends at 0/200: a gap, the changes between them are missing
}
