package siphon_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/siphondb/siphon"
	"github.com/siphondb/siphon/canonical"
)

// chainFixture is a source database and a chain taken from it: a base
// backup, then two incrementals of three ticks each.
type chainFixture struct {
	dsn          string
	src          *pgx.Conn
	c            *siphon.Conn // on the source, with the chain's slot
	slot         string
	base         []byte
	incrementals [][]byte
	end          canonical.Position // the last incremental's end
	// after[k] is what the source looked like right after tick k
	// committed (after[0]: at the base backup).
	after []sourceState
}

// sourceState is the source as of one moment.
type sourceState struct {
	insertLSN canonical.Position // pg_current_wal_insert_lsn()
	at        time.Time          // clock_timestamp()
	digest    string             // of tbl
}

// tick commits one transaction on the source: a row in ticks, and a change
// to tbl.
func tick(t *testing.T, src *pgx.Conn, k int) sourceState {
	t.Helper()
	execSQL(t, src, fmt.Sprintf(`WITH t AS (INSERT INTO ticks VALUES (%d) RETURNING k)
		UPDATE tbl SET v = v || '.' || (SELECT k FROM t) WHERE id %% 3 = %d`, k, k%3))
	return readState(t, src)
}

func readState(t *testing.T, src *pgx.Conn) sourceState {
	t.Helper()
	var s sourceState
	var lsn string
	require.NoError(t, src.QueryRow(context.Background(),
		"SELECT pg_current_wal_insert_lsn()::text, clock_timestamp()").Scan(&lsn, &s.at))
	var err error
	s.insertLSN, err = canonical.ParsePosition(lsn)
	require.NoError(t, err)
	s.digest = digest(t, src, "tbl")
	return s
}

func newChainFixture(t *testing.T) *chainFixture {
	t.Helper()
	ctx := context.Background()
	dsn, src := newDatabase(t)
	execSQL(t, src,
		`CREATE TABLE tbl (id int PRIMARY KEY, v text NOT NULL)`,
		`INSERT INTO tbl SELECT g, 'v' || g FROM generate_series(1, 30) g`,
		`CREATE TABLE ticks (k int PRIMARY KEY)`)
	c, slot := backupConn(t, dsn)
	f := &chainFixture{dsn: dsn, src: src, c: c, slot: slot, base: backup(t, c, siphon.BackupOptions{StartChain: true})}
	rep, err := c.Verify(ctx, bytes.NewReader(f.base))
	require.NoError(t, err)
	require.True(t, rep.OK, "%v", rep.Problems)
	f.after = append(f.after, readState(t, src))
	prev := rep.ChainLink()
	for link := range 2 {
		for k := 3*link + 1; k <= 3*link+3; k++ {
			f.after = append(f.after, tick(t, src, k))
		}
		var incr bytes.Buffer
		prev, err = c.BackupIncrementalAfter(ctx, prev, &incr)
		require.NoError(t, err)
		f.incrementals = append(f.incrementals, incr.Bytes())
	}
	f.end = prev.End
	return f
}

// readers returns fresh readers of the given backups.
func readers(links ...[]byte) []io.ReadSeeker {
	out := make([]io.ReadSeeker, len(links))
	for i, l := range links {
		out[i] = bytes.NewReader(l)
	}
	return out
}

// chainOf is readers of a chain: its base, then its incrementals.
func chainOf(base []byte, incrementals ...[]byte) []io.ReadSeeker {
	return readers(append([][]byte{base}, incrementals...)...)
}

// restoreTarget returns a fresh database, a Conn on it and a session.
func restoreTarget(t *testing.T) (string, *siphon.Conn, *pgx.Conn) {
	t.Helper()
	dsn, conn := newDatabase(t)
	c, err := siphon.Connect(context.Background(), dsn)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return dsn, c, conn
}

func ticksOf(t *testing.T, conn *pgx.Conn) []int {
	t.Helper()
	rows, err := conn.Query(context.Background(), "SELECT k FROM ticks ORDER BY k")
	require.NoError(t, err)
	ks, err := pgx.CollectRows(rows, pgx.RowTo[int])
	require.NoError(t, err)
	return ks
}

func TestRestoreChainInFull(t *testing.T) {
	t.Parallel()
	skipUnlessDumpClients(t)
	f := newChainFixture(t)
	dsn, c, dst := restoreTarget(t)
	ctx := context.Background()

	pos, err := c.RestoreChain(ctx, siphon.RestoreChainOptions{}, chainOf(f.base, f.incrementals...)...)
	require.NoError(t, err)
	assert.Equal(t, f.end, pos, "the chain's end")
	assert.Equal(t, digest(t, f.src, "tbl"), digest(t, dst, "tbl"))
	assert.Equal(t, digest(t, f.src, "ticks"), digest(t, dst, "ticks"))
	assert.Equal(t, []int{1, 2, 3, 4, 5, 6}, ticksOf(t, dst))
	applied, err := c.AppliedPosition(ctx)
	require.NoError(t, err)
	assert.Equal(t, f.end, applied, "the database records where it stands")

	require.NoError(t, c.Close())
	assertNoLeaks(t, dsn)
}

func TestRestoreChainToAPosition(t *testing.T) {
	t.Parallel()
	skipUnlessDumpClients(t)
	f := newChainFixture(t)
	for _, k := range []int{0, 2, 5, 6} { // before, inside the first incremental, inside the second, at the end
		t.Run(fmt.Sprintf("after tick %d", k), func(t *testing.T) {
			t.Parallel()
			dsn, c, dst := restoreTarget(t)
			target := f.after[k].insertLSN
			pos, err := c.RestoreChain(context.Background(), siphon.RestoreChainOptions{TargetPosition: target},
				chainOf(f.base, f.incrementals...)...)
			require.NoError(t, err)
			assert.LessOrEqual(t, pos, target, "the target is not passed")
			if k > 0 {
				assert.Greater(t, pos, f.after[k-1].insertLSN, "tick %d's commit is reached", k)
			}
			want := []int{}
			for i := 1; i <= k; i++ {
				want = append(want, i)
			}
			assert.Equal(t, want, ticksOf(t, dst), "exactly the transactions before the target")
			assert.Equal(t, f.after[k].digest, digest(t, dst, "tbl"), "the source as it was at the target")
			require.NoError(t, c.Close())
			assertNoLeaks(t, dsn)
		})
	}
}

func TestRestoreChainToATime(t *testing.T) {
	t.Parallel()
	skipUnlessDumpClients(t)
	f := newChainFixture(t)
	dsn, c, dst := restoreTarget(t)
	pos, err := c.RestoreChain(context.Background(), siphon.RestoreChainOptions{TargetTime: f.after[4].at},
		chainOf(f.base, f.incrementals...)...)
	require.NoError(t, err)
	assert.Equal(t, []int{1, 2, 3, 4}, ticksOf(t, dst), "the transactions committed by then")
	assert.LessOrEqual(t, pos, f.after[4].insertLSN, "the Position returned is tick 4's commit")
	assert.Greater(t, pos, f.after[3].insertLSN, "the Position returned is tick 4's commit")
	assert.Equal(t, f.after[4].digest, digest(t, dst, "tbl"))
	require.NoError(t, c.Close())
	assertNoLeaks(t, dsn)
}

func TestRestoreChainRefusesABrokenChain(t *testing.T) {
	t.Parallel()
	skipUnlessDumpClients(t)
	f := newChainFixture(t)
	for _, tc := range []struct {
		name  string
		links [][]byte
		bad   int
	}{
		{"missing link", [][]byte{f.incrementals[1]}, 2},
		{"out of order", [][]byte{f.incrementals[1], f.incrementals[0]}, 2},
		{"repeated link", [][]byte{f.incrementals[0], f.incrementals[0]}, 3},
		{"cut link", [][]byte{f.incrementals[0], f.incrementals[1][:len(f.incrementals[1])-20]}, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dsn, c, dst := restoreTarget(t)
			_, err := c.RestoreChain(context.Background(), siphon.RestoreChainOptions{TargetPosition: f.end},
				chainOf(f.base, tc.links...)...)
			var chainErr *siphon.ChainError
			require.ErrorAs(t, err, &chainErr)
			assert.ErrorAs(t, err, new(*siphon.ChainError))
			assert.Equal(t, tc.bad, chainErr.Link, "%v", err)
			assert.NotEmpty(t, chainErr.Problems)
			assert.Empty(t, userTables(t, dst), "the target stays untouched")
			require.NoError(t, c.Close())
			assertNoLeaks(t, dsn)
		})
	}
}

func TestRestoreChainRefusesATargetBeforeTheBase(t *testing.T) {
	t.Parallel()
	skipUnlessDumpClients(t)
	f := newChainFixture(t)
	_, c, dst := restoreTarget(t)
	_, err := c.RestoreChain(context.Background(), siphon.RestoreChainOptions{TargetPosition: 1},
		chainOf(f.base, f.incrementals...)...)
	require.ErrorIs(t, err, siphon.ErrTargetBeforeBase)
	assert.Empty(t, userTables(t, dst), "the target stays untouched")
}
