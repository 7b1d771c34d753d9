package siphon_test

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestConsumeCanonicalKeepsItsSessionWarm applies a snapshot and an
// incremental with one target Conn, as a chain is restored: the
// incremental applies on the snapshot's backend (a new backend costs more
// per row), which holds nothing of the apply once it returned (another
// Conn applies the next incremental of the same source at once: the
// origin is free). A kept backend that was ended meanwhile is not an
// error: the next apply opens a new one. Triggers fire for none of
// siphon's rows. Closing the Conn leaves no session behind.
func TestConsumeCanonicalKeepsItsSessionWarm(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srcDSN, src := newDatabase(t)
	dstDSN, dst := newDatabase(t)
	const table = `CREATE TABLE t (id int PRIMARY KEY, v text)`
	execSQL(t, src, table, "INSERT INTO t SELECT g, 'snapshot' FROM generate_series(1, 100) g")
	execSQL(t, dst, table, `CREATE TABLE audit (id int)`,
		`CREATE FUNCTION audit() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN INSERT INTO audit VALUES (NEW.id); RETURN NEW; END$$`,
		`CREATE TRIGGER audit AFTER INSERT ON t FOR EACH ROW EXECUTE FUNCTION audit()`)
	c, _ := streamConn(t, srcDSN)
	var snap bytes.Buffer
	pos, err := c.EmitCanonical(ctx, nil, &snap)
	require.NoError(t, err)
	var incrementals [2]bytes.Buffer
	for k := range incrementals {
		lo := 101 + 100*k
		execSQL(t, src, fmt.Sprintf("INSERT INTO t SELECT g, 'incremental' FROM generate_series(%d, %d) g", lo, lo+99))
		pos, err = c.BackupIncremental(ctx, pos, &incrementals[k])
		require.NoError(t, err)
	}
	require.NoError(t, c.Close())

	target := connect(t, dstDSN)
	// The kept backend is the one whose last statement reset it.
	kept := func() []int32 {
		rows, err := dst.Query(ctx, `SELECT pid FROM pg_stat_activity
			WHERE datname = current_database() AND application_name = 'siphon' AND query = 'deallocate all'`)
		require.NoError(t, err)
		var pids []int32
		for rows.Next() {
			var pid int32
			require.NoError(t, rows.Scan(&pid))
			pids = append(pids, pid)
		}
		require.NoError(t, rows.Err())
		return pids
	}
	require.NoError(t, target.ConsumeCanonical(ctx, bytes.NewReader(snap.Bytes())))
	first := kept()
	require.Len(t, first, 1, "the snapshot's session is kept")
	require.NoError(t, target.ConsumeCanonical(ctx, bytes.NewReader(incrementals[0].Bytes())))
	assert.Equal(t, first, kept(), "the first incremental applied on the snapshot's backend")
	assert.Equal(t, 200, count(t, dst, "SELECT count(*) FROM t"))
	assert.Equal(t, 0, count(t, dst, "SELECT count(*) FROM audit"), "siphon's rows fire no trigger")

	// Nothing of the apply holds the source: another Conn applies it at once.
	other := connect(t, dstDSN)
	require.NoError(t, other.ConsumeCanonical(ctx, bytes.NewReader(incrementals[1].Bytes())), "the source's origin is free")
	require.NoError(t, other.Close())
	assert.Equal(t, 300, count(t, dst, "SELECT count(*) FROM t"))

	// A kept backend ended meanwhile: the next apply opens another.
	execSQL(t, dst, "SELECT pg_terminate_backend("+strconv.Itoa(int(first[0]))+")")
	waitFor(t, "the kept backend ended", func() bool { return len(kept()) == 0 })
	require.NoError(t, target.ConsumeCanonical(ctx, bytes.NewReader(incrementals[1].Bytes())), "a new session, not the ended one")
	second := kept()
	require.Len(t, second, 1)
	assert.NotEqual(t, first, second)
	assert.Equal(t, 300, count(t, dst, "SELECT count(*) FROM t"), "applied once")
	assert.Equal(t, 0, count(t, dst, "SELECT count(*) FROM audit"))
	execSQL(t, dst, "INSERT INTO t VALUES (0, 'application')")
	assert.Equal(t, 1, count(t, dst, "SELECT count(*) FROM audit"), "the application's own insert fires the trigger")

	require.NoError(t, target.Close())
	assertNoLeaks(t, dstDSN)
}
