package siphon_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/siphondb/siphon"
	"github.com/siphondb/siphon/canonical"
)

// The tests of this file load snapshots into a target database, then
// stream changes from the snapshot's Position and check that the target
// ends up identical to the source.

// snapStreamApply streams changes from pos and applies those that skip
// does not reject, until the message with prefix "snaptest.end" arrives.
func snapStreamApply(t testing.TB, c *siphon.Conn, pos canonical.Position, a *snapApplier, schema *canonical.Schema,
	skip func(canonical.Change) bool) int {
	t.Helper()
	key := func(n canonical.TableName) []string { return schema.Table(n.Schema, n.Name).PrimaryKey }
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	applied := 0
	_, err := c.StreamChanges(ctx, pos, func(ch canonical.Change) error {
		if ch.Op == canonical.OpMessage && ch.Message.Prefix == "snaptest.end" {
			cancel()
			return nil
		}
		if skip != nil && skip(ch) {
			return nil
		}
		applied++
		return a.change(ch, key)
	})
	require.NoError(t, err)
	return applied
}

// snapWriter writes to the shop continuously, in small transactions of
// every kind, until stopped.
type snapWriter struct {
	commits atomic.Int64
	stopped chan struct{}
	done    chan error
}

func startSnapWriter(t testing.TB, dsn string) *snapWriter {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), dsn)
	require.NoError(t, err)
	w := &snapWriter{stopped: make(chan struct{}), done: make(chan error, 1)}
	go func() {
		defer conn.Close(context.Background())
		r := mrand.New(mrand.NewPCG(3, 4))
		next := 100000
		pace := time.NewTicker(time.Millisecond) // a steady stream, not a flood to apply
		defer pace.Stop()
		for {
			select {
			case <-w.stopped:
				w.done <- nil
				return
			case <-pace.C:
			}
			id := 1 + r.IntN(20000)
			var stmts []string
			switch r.IntN(9) {
			case 0:
				next++
				stmts = []string{fmt.Sprintf(`INSERT INTO accounts VALUES (%d, 1, 'new', NULL, now())`, next)}
			case 1:
				stmts = []string{fmt.Sprintf(`UPDATE accounts SET balance = balance + 1, note = note || 'x' WHERE id = %d`, id)}
			case 2: // the TOASTed doc stays unchanged
				stmts = []string{fmt.Sprintf(`UPDATE accounts SET seen = now() WHERE id IN (%d, %d)`, id, 500*(1+r.IntN(40)))}
			case 3:
				stmts = []string{fmt.Sprintf(`DELETE FROM accounts WHERE id = %d`, id)}
			case 4: // the key changes
				stmts = []string{fmt.Sprintf(`UPDATE accounts SET id = id + 1000000 WHERE id = %d`, id)}
			case 5:
				stmts = []string{fmt.Sprintf(`INSERT INTO events (account, payload) VALUES (%d, '{"w": true}')`, id),
					fmt.Sprintf(`DELETE FROM events WHERE account = %d`, 1+r.IntN(2000))}
			case 6:
				stmts = []string{fmt.Sprintf(`UPDATE parted SET qty = qty + 1 WHERE id = %d`, 1+r.IntN(2000)),
					fmt.Sprintf(`INSERT INTO parted VALUES (%d, 'eu', 0) ON CONFLICT DO NOTHING`, 2000+r.IntN(5000))}
			case 7:
				stmts = []string{fmt.Sprintf(`UPDATE parted SET region = 'eu' WHERE id = %d AND region = 'us'`, 1+r.IntN(2000))}
			case 8:
				stmts = []string{fmt.Sprintf(`UPDATE "Odd ""Name"" ü" SET "Val ue" = "Val ue" || %d WHERE "Key" = 'k %d'`, id, 1+r.IntN(500))}
			}
			tx, err := conn.Begin(context.Background())
			for _, s := range stmts {
				if err == nil {
					_, err = tx.Exec(context.Background(), s)
				}
			}
			if err == nil {
				err = tx.Commit(context.Background())
			}
			if err != nil {
				w.done <- err
				return
			}
			w.commits.Add(1)
		}
	}()
	t.Cleanup(func() { w.stop(t) })
	return w
}

// waitFor waits until the writer has committed n transactions.
func (w *snapWriter) waitFor(t testing.TB, n int64) {
	t.Helper()
	waitFor(t, fmt.Sprintf("the writers commit %d transactions", n), func() bool { return w.commits.Load() >= n || len(w.done) > 0 })
	require.GreaterOrEqual(t, w.commits.Load(), n, "the writer failed")
}

// stop stops the writer and checks that it wrote without error.
func (w *snapWriter) stop(t testing.TB) {
	select {
	case <-w.stopped:
		return
	default:
		close(w.stopped)
	}
	require.NoError(t, <-w.done)
}

func TestSnapshotThenStreamMatchesSource(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srcDSN, src := newDatabase(t)
	dstDSN, dst := newDatabase(t)
	execSQL(t, src, snapShop...)
	execSQL(t, dst, snapShop...)
	execSQL(t, src, snapShopRows...)
	var reports []siphon.Progress
	c, slot := snapConnect(t, srcDSN, siphon.WithCopySessions(4),
		siphon.WithProgress(func(p siphon.Progress) { reports = append(reports, p) }))
	schema, err := c.InspectSchema(ctx)
	require.NoError(t, err)

	w := startSnapWriter(t, srcDSN)
	w.waitFor(t, 20)
	snap, err := c.TakeSnapshot(ctx)
	require.NoError(t, err)
	atSnapshot := w.commits.Load()
	a := newSnapApplier(t, dstDSN)
	copied := map[canonical.TableName]int64{}
	err = snap.CopyTables(ctx, schema, siphon.CopyOptions{}, func(table *canonical.Table, row canonical.Row) error {
		if len(copied) == 0 {
			w.waitFor(t, atSnapshot+30) // the source changes under the copy
		}
		copied[table.TableName()]++
		return a.row(table, row)
	})
	require.NoError(t, err)
	require.NoError(t, a.flush())
	require.NoError(t, snap.Close(ctx))
	require.NoError(t, snap.Close(ctx), "Close twice is fine")
	w.waitFor(t, w.commits.Load()+20)
	w.stop(t)
	execSQL(t, src, `SELECT pg_logical_emit_message(true, 'snaptest.end', '')`)

	applied := snapStreamApply(t, c, snap.Position(), a, schema, nil)
	assert.Positive(t, applied)
	t.Logf("%d changes applied, %d transactions written", applied, w.commits.Load())
	assert.Equal(t, snapDigests(t, src, schema), snapDigests(t, dst, schema))

	assert.EqualValues(t, 0, copied[canonical.TableName{Schema: "public", Name: "parted"}], "a partitioned table's rows come through its partitions")
	assert.Positive(t, copied[canonical.TableName{Schema: "public", Name: "parted_eu"}])
	done := map[canonical.TableName]siphon.Progress{}
	for _, p := range reports {
		if p.Done {
			done[p.Table] = p
		}
	}
	require.Len(t, done, len(schema.Tables), "one final report per table")
	accounts := done[canonical.TableName{Schema: "public", Name: "accounts"}]
	assert.Equal(t, copied[accounts.Table], accounts.Rows)
	assert.Positive(t, accounts.Bytes)
	assert.InDelta(t, 20000, accounts.EstimatedRows, 2000)
	assert.Positive(t, accounts.EstimatedBytes)

	require.NoError(t, c.Close())
	assertNoLeaks(t, srcDSN, slot)
}

// snapLoader loads a copy into a target in transactions that commit with
// each checkpoint, the way a consumer of a resumable copy must.
type snapLoader struct {
	a     *snapApplier
	saved []byte // the last checkpoint, as JSON, committed with the rows it covers
	rows  map[canonical.TableName]int
}

func (l *snapLoader) exec(sql string) error {
	_, err := l.a.conn.Exec(context.Background(), sql)
	return err
}

// run copies from a new snapshot, resuming from the saved checkpoint if
// any, and stops with errInterrupted after stopAfter rows of stopAt.
func (l *snapLoader) run(t *testing.T, c *siphon.Conn, schema *canonical.Schema, stopAt string, stopAfter int) (restarted []string, err error) {
	t.Helper()
	snap := snapTake(t, c)
	defer snap.Close(context.Background())
	l.rows = map[canonical.TableName]int{}
	require.NoError(t, l.exec("BEGIN"))
	opt := siphon.CopyOptions{Checkpoint: func(cp *siphon.CopyCheckpoint) error {
		if err := l.a.flush(); err != nil {
			return err
		}
		saved, err := json.Marshal(cp)
		require.NoError(t, err)
		if err := l.exec("COMMIT"); err != nil {
			return err
		}
		l.saved = saved
		return l.exec("BEGIN")
	}}
	if l.saved != nil {
		var cp siphon.CopyCheckpoint
		require.NoError(t, json.Unmarshal(l.saved, &cp))
		opt.Resume = &cp
		opt.Restart = func(old siphon.TableCheckpoint) error {
			restarted = append(restarted, old.Relation.Name)
			return l.exec("DELETE FROM " + pgx.Identifier{old.Relation.Schema, old.Relation.Name}.Sanitize())
		}
	}
	err = snap.CopyTables(context.Background(), schema, opt, func(table *canonical.Table, row canonical.Row) error {
		l.rows[table.TableName()]++
		if table.Name == stopAt && l.rows[table.TableName()] > stopAfter {
			return errSnapInterrupted
		}
		return l.a.row(table, row)
	})
	l.a.batch = &pgx.Batch{}
	require.NoError(t, l.exec("ROLLBACK"))
	return restarted, err
}

var errSnapInterrupted = errors.New("interrupted")

func TestSnapshotCopyResumes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srcDSN, src := newDatabase(t)
	dstDSN, dst := newDatabase(t)
	ddl := []string{
		`CREATE TABLE items (id int PRIMARY KEY, v int, filler char(400))`,
		`CREATE TABLE rewritten (id int PRIMARY KEY, v int)`,
		`CREATE TABLE toasted (id int PRIMARY KEY, doc text)`,
	}
	execSQL(t, src, ddl...)
	execSQL(t, dst, ddl...)
	execSQL(t, src,
		`INSERT INTO items SELECT i, i, md5(i::text) FROM generate_series(1, 6000) i`,
		`INSERT INTO rewritten SELECT i, i FROM generate_series(1, 3000) i`,
		`INSERT INTO toasted SELECT i, CASE WHEN i % 100 = 0 THEN (SELECT string_agg(md5(i::text || j), '') FROM generate_series(1, 200) j) ELSE 'short' END FROM generate_series(1, 3000) i`,
		`ANALYZE`)
	c, _ := snapConnect(t, srcDSN, siphon.WithCopySessions(2))
	schema, err := c.InspectSchema(ctx)
	require.NoError(t, err)
	l := &snapLoader{a: newSnapApplier(t, dstDSN)}
	changes := func(table string, seed int) {
		execSQL(t, src,
			fmt.Sprintf(`UPDATE %s SET v = v + 1 WHERE id %% 37 = %d`, table, seed),
			fmt.Sprintf(`DELETE FROM %s WHERE id %% 53 = %d`, table, seed),
			fmt.Sprintf(`INSERT INTO %s (id, v) SELECT 10000 * %d + i, i FROM generate_series(1, 300) i`, table, seed+1))
	}

	// Interrupted in items, with some of its ranges delivered.
	restarted, err := l.run(t, c, schema, "items", 2500)
	require.ErrorIs(t, err, errSnapInterrupted)
	assert.Empty(t, restarted)
	changes("items", 1)

	// items resumes where it stopped; interrupted in rewritten.
	restarted, err = l.run(t, c, schema, "rewritten", 1500)
	require.ErrorIs(t, err, errSnapInterrupted)
	assert.Empty(t, restarted)
	assert.Less(t, l.rows[canonical.TableName{Schema: "public", Name: "items"}], 6000-2000, "items resumed, not copied again")
	changes("items", 2)
	changes("rewritten", 2)
	execSQL(t, src, `VACUUM FULL rewritten`)

	// rewritten starts again (its file changed); interrupted in toasted.
	restarted, err = l.run(t, c, schema, "toasted", 1500)
	require.ErrorIs(t, err, errSnapInterrupted)
	assert.Equal(t, []string{"rewritten"}, restarted)
	assert.Zero(t, l.rows[canonical.TableName{Schema: "public", Name: "items"}], "items is done")
	execSQL(t, src, `UPDATE toasted SET doc = doc || 'x' WHERE id % 3 = 0`, `DELETE FROM toasted WHERE id % 11 = 0`)

	// toasted starts again (it has TOAST values); the copy completes.
	restarted, err = l.run(t, c, schema, "", 0)
	require.NoError(t, err)
	assert.Equal(t, []string{"toasted"}, restarted)

	var cp siphon.CopyCheckpoint
	require.NoError(t, json.Unmarshal(l.saved, &cp))
	for _, tc := range cp.Tables {
		assert.True(t, tc.Done, tc.Relation.String())
	}
	execSQL(t, src, `SELECT pg_logical_emit_message(true, 'snaptest.end', '')`)
	snapStreamApply(t, c, cp.Position, l.a, schema, func(ch canonical.Change) bool {
		return ch.Op != canonical.OpMessage && cp.Covers(ch.TableName(), ch.Position)
	})
	assert.Equal(t, snapDigests(t, src, schema), snapDigests(t, dst, schema))
}
