package siphon_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"strconv"
	"testing"
	"time"

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
	require.NoError(t, target.ConsumeCanonical(ctx, bytes.NewReader(snap.Bytes())))
	first := target.KeptApplyPIDForTest()
	require.NotZero(t, first, "the snapshot's session is kept")
	require.NoError(t, target.ConsumeCanonical(ctx, bytes.NewReader(incrementals[0].Bytes())))
	assert.Equal(t, first, target.KeptApplyPIDForTest(), "the first incremental applied on the snapshot's backend")
	assert.Equal(t, 200, count(t, dst, "SELECT count(*) FROM t"))
	assert.Equal(t, 0, count(t, dst, "SELECT count(*) FROM audit"), "siphon's rows fire no trigger")

	// Nothing of the apply holds the source: another Conn applies it at once.
	other := connect(t, dstDSN)
	require.NoError(t, other.ConsumeCanonical(ctx, bytes.NewReader(incrementals[1].Bytes())), "the source's origin is free")
	require.NoError(t, other.Close())
	assert.Equal(t, 300, count(t, dst, "SELECT count(*) FROM t"))

	// A kept backend ended meanwhile: the next apply opens another.
	execSQL(t, dst, "SELECT pg_terminate_backend("+strconv.Itoa(int(first))+")")
	waitFor(t, "the kept backend ended", func() bool {
		return count(t, dst, "SELECT count(*) FROM pg_stat_activity WHERE pid = "+strconv.Itoa(int(first))) == 0
	})
	require.NoError(t, target.ConsumeCanonical(ctx, bytes.NewReader(incrementals[1].Bytes())), "a new session, not the ended one")
	second := target.KeptApplyPIDForTest()
	require.NotZero(t, second)
	assert.NotEqual(t, first, second)
	assert.Equal(t, 300, count(t, dst, "SELECT count(*) FROM t"), "applied once")
	assert.Equal(t, 0, count(t, dst, "SELECT count(*) FROM audit"))
	execSQL(t, dst, "INSERT INTO t VALUES (0, 'application')")
	assert.Equal(t, 1, count(t, dst, "SELECT count(*) FROM audit"), "the application's own insert fires the trigger")

	require.NoError(t, target.Close())
	assertNoLeaks(t, dstDSN)
}

// TestKeptApplySessionStartsAfresh: the session an apply keeps carries
// nothing of it into the next: not session_replication_role = replica
// (which the apply set, as a role allowed to), not the apply's prepared
// statements (pgx's caches are emptied with them: a cached statement the
// server no longer has would fail the next apply on the session, which
// TestConsumeCanonicalKeepsItsSessionWarm runs).
func TestKeptApplySessionStartsAfresh(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srcDSN, src := newDatabase(t)
	dstDSN, dst := newDatabase(t)
	const table = `CREATE TABLE t (id int PRIMARY KEY, v text)`
	execSQL(t, src, table, "INSERT INTO t SELECT g, 'row' FROM generate_series(1, 50) g")
	execSQL(t, dst, table)
	c, _ := streamConn(t, srcDSN)
	var snap bytes.Buffer
	_, err := c.EmitCanonical(ctx, nil, &snap)
	require.NoError(t, err)
	target := connect(t, dstDSN)
	require.NoError(t, target.ConsumeCanonical(ctx, bytes.NewReader(snap.Bytes())))

	conn := target.TakeKeptApplySessionForTest(ctx)
	require.NotNil(t, conn)
	defer conn.Close(ctx)
	var role string
	var prepared int
	require.NoError(t, conn.QueryRow(ctx, `SELECT current_setting('session_replication_role'),
		(SELECT count(*) FROM pg_prepared_statements)`).Scan(&role, &prepared))
	assert.Equal(t, "origin", role, "the apply's replica role was reset")
	assert.Equal(t, 1, prepared, "only the statement just run: the apply's were deallocated")
	assert.Equal(t, 50, count(t, dst, "SELECT count(*) FROM t"))
}

// pausingReader reads r up to at bytes, then calls pause once before it
// reads on.
type pausingReader struct {
	r      io.Reader
	at     int
	pause  func()
	read   int
	paused bool
}

func (p *pausingReader) Read(b []byte) (int, error) {
	if !p.paused && p.read >= p.at {
		p.paused = true
		p.pause()
	}
	if !p.paused {
		b = b[:min(len(b), p.at-p.read)]
	}
	n, err := p.r.Read(b)
	p.read += n
	return n, err
}

// TestConsumeCanonicalOutlivesTheTargetsTimeouts: a target database whose
// sessions get timeouts of 500 ms still takes a snapshot, and then an
// incremental on the kept session (which DISCARD ALL gave the database's
// timeouts back), from streams that stop for a second half way: the load
// waits for the stream inside its transaction, as pg_restore's would.
func TestConsumeCanonicalOutlivesTheTargetsTimeouts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srcDSN, src, dstDSN, dst := twinDatabases(t, `CREATE TABLE a (id int PRIMARY KEY, v text)`, `CREATE TABLE b (id int PRIMARY KEY, v text)`)
	execSQL(t, src, "INSERT INTO a SELECT g, 'snapshot' FROM generate_series(1, 1000) g",
		"INSERT INTO b SELECT g, 'snapshot' FROM generate_series(1, 1000) g")
	shortDatabaseTimeouts(t, dst)
	c, _ := streamConn(t, srcDSN)
	var snap, incremental bytes.Buffer
	pos, err := c.EmitCanonical(ctx, nil, &snap)
	require.NoError(t, err)
	execSQL(t, src, "BEGIN", "INSERT INTO a SELECT g, 'incremental' FROM generate_series(1001, 2000) g",
		"UPDATE b SET v = 'incremental'", "COMMIT")
	_, err = c.BackupIncremental(ctx, pos, &incremental)
	require.NoError(t, err)
	require.NoError(t, c.Close())

	target := connect(t, dstDSN)
	for _, stream := range []*bytes.Buffer{&snap, &incremental} {
		slow := &pausingReader{r: bytes.NewReader(stream.Bytes()), at: stream.Len() / 2, pause: func() { time.Sleep(1500 * time.Millisecond) }}
		require.NoError(t, target.ConsumeCanonical(ctx, slow))
	}
	assert.Equal(t, tableDigests(t, src), tableDigests(t, dst), "every table's rows")
	require.NoError(t, target.Close())
}
