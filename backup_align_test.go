package siphon_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/siphondb/siphon"
	"github.com/siphondb/siphon/canonical"
)

// writers runs n sessions that each commit transactions in a loop (an
// event insert and an account update each) until stop is called, and
// counts the commits.
type writers struct {
	commits atomic.Int64
	stop    func()
	wg      sync.WaitGroup
	errs    chan error
}

func startWriters(t *testing.T, dsn string, n int) *writers {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	w := &writers{stop: cancel, errs: make(chan error, n)}
	for i := range n {
		conn, err := pgx.Connect(ctx, dsn)
		require.NoError(t, err)
		w.wg.Add(1)
		go func() {
			defer w.wg.Done()
			defer conn.Close(context.Background())
			// The statement runs to its end even when the writers are halted:
			// a cancelled Exec returns at once while the server may still
			// commit it, after the test has moved on.
			for k := 0; ctx.Err() == nil; k++ {
				_, err := conn.Exec(context.Background(), `WITH e AS (INSERT INTO events (account, amount, note) VALUES ($1, $2, $3) RETURNING account, amount)
					UPDATE accounts a SET balance = a.balance + e.amount, updates = a.updates + 1 FROM e WHERE a.id = e.account`,
					1+(i*7+k)%10, k%50-20, fmt.Sprintf("writer %d commit %d", i, k))
				if err != nil {
					w.errs <- err
					return
				}
				w.commits.Add(1)
			}
		}()
	}
	t.Cleanup(w.halt)
	return w
}

// halt stops the writers and waits for them.
func (w *writers) halt() {
	w.stop()
	w.wg.Wait()
}

// waitCommits waits until the writers have committed n more
// transactions. It may run on any goroutine: it fails nothing itself.
func (w *writers) waitCommits(n int64) error {
	target := w.commits.Load() + n
	deadline := time.Now().Add(waitDeadline)
	for w.commits.Load() < target {
		select {
		case err := <-w.errs:
			return fmt.Errorf("writer: %w", err)
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the writers did not commit %d transactions within %v", n, waitDeadline)
		}
		time.Sleep(time.Millisecond)
	}
	return nil
}

// pausingWriter holds the first body write until resume returns, so that
// the writers commit while pg_dump runs inside its snapshot.
type pausingWriter struct {
	w      io.Writer
	writes int
	resume func()
}

func (p *pausingWriter) Write(b []byte) (int, error) {
	p.writes++
	if p.writes == 2 { // the first is the envelope's header
		p.resume()
	}
	return p.w.Write(b)
}

// TestBackupAlignsWithTheFirstIncremental is the alignment guarantee:
// with transactions committing all through the dump, restoring the backup
// and applying the first incremental from its Position gives the source
// exactly. Inserts are applied as plain INSERTs, so a transaction in both
// (an overlap) fails on the primary key, and one in neither (a gap) makes
// the digests differ.
func TestBackupAlignsWithTheFirstIncremental(t *testing.T) {
	t.Parallel()
	skipUnlessDumpClients(t)
	dsn, src := newDatabase(t)
	execSQL(t, src,
		`CREATE TABLE accounts (id int PRIMARY KEY, balance bigint NOT NULL, updates int NOT NULL)`,
		`INSERT INTO accounts SELECT g, 1000, 0 FROM generate_series(1, 10) g`,
		`CREATE TABLE events (id bigserial PRIMARY KEY, account int NOT NULL REFERENCES accounts, amount int, note text)`,
		`INSERT INTO events (account, amount, note) SELECT 1 + g % 10, 0, md5(g::text) FROM generate_series(1, 20000) g`)
	c, slot := backupConn(t, dsn)
	ctx := context.Background()

	w := startWriters(t, dsn, 3)
	require.NoError(t, w.waitCommits(50)) // committed before the backup starts
	var base bytes.Buffer
	var duringDump error
	require.NoError(t, c.Backup(ctx, siphon.BackupOptions{StartChain: true}, &pausingWriter{w: &base, resume: func() { duringDump = w.waitCommits(200) }}))
	require.NoError(t, duringDump)
	require.NoError(t, w.waitCommits(50)) // after the backup
	w.halt()

	rep, err := c.Verify(ctx, bytes.NewReader(base.Bytes()))
	require.NoError(t, err)
	require.True(t, rep.OK, "%v", rep.Problems)
	require.Greater(t, rep.BodyBytes, int64(300<<10), "big enough that the writers commit while pg_dump still runs")
	var incr bytes.Buffer
	end, err := c.BackupIncremental(ctx, rep.Start, &incr)
	require.NoError(t, err)
	assert.Greater(t, end, rep.Start)

	dstDSN, dst := newDatabase(t)
	target, _ := backupConn(t, dstDSN)
	require.NoError(t, target.Restore(ctx, siphon.RestoreOptions{}, bytes.NewReader(base.Bytes())))
	var inBase int64
	require.NoError(t, dst.QueryRow(ctx, "SELECT count(*) FROM events WHERE amount <> 0 OR note LIKE 'writer%'").Scan(&inBase))
	assert.Positive(t, inBase, "the base holds the commits made before it")
	applied := applyChanges(t, dst, incr.Bytes())
	assert.GreaterOrEqual(t, applied, 2*200, "the incremental holds the commits made during and after the dump")
	assert.Equal(t, tableDigests(t, src), tableDigests(t, dst), "base + first incremental = source at the incremental's end")

	chain, err := c.VerifyChain(ctx, bytes.NewReader(base.Bytes()), bytes.NewReader(incr.Bytes()))
	require.NoError(t, err)
	assert.True(t, chain.OK, "%v", chain.Problems)
	assert.Equal(t, rep.Start, chain.Start)
	assert.Equal(t, end, chain.End)
	require.NoError(t, c.Close())
	assertNoLeaks(t, dsn, slot)
}

// applyChanges applies the row changes of a JSONL change stream to conn,
// each transaction in one transaction: inserts as plain INSERTs, updates
// and deletes by primary key. It returns the number of transactions.
func applyChanges(t *testing.T, conn *pgx.Conn, data []byte) int {
	t.Helper()
	ctx := context.Background()
	d := canonical.NewDecoder(bytes.NewReader(data))
	var tx pgx.Tx
	txs := 0
	for {
		rec, err := d.Next()
		if errors.Is(err, io.EOF) {
			return txs
		}
		require.NoError(t, err)
		if rec.Type != canonical.RecordChange {
			continue
		}
		ch := rec.Change
		switch ch.Op {
		case canonical.OpBegin:
			tx, err = conn.Begin(ctx)
			require.NoError(t, err)
		case canonical.OpCommit:
			require.NoError(t, tx.Commit(ctx))
			txs++
		case canonical.OpInsert, canonical.OpUpdate, canonical.OpDelete:
			query, args := changeSQL(t, rec.Table, ch)
			_, err := tx.Exec(ctx, query, args...)
			require.NoError(t, err, "%v %s at %v", ch.Op, ch.TableName(), ch.Position)
		}
	}
}

// changeSQL builds the statement that applies a row change.
func changeSQL(t *testing.T, table *canonical.Table, ch *canonical.Change) (string, []any) {
	t.Helper()
	require.NotEmpty(t, table.PrimaryKey, "test tables have primary keys")
	name := pgx.Identifier{table.Schema, table.Name}.Sanitize()
	var args []any
	param := func(i int, row canonical.Row) string {
		if s, ok := row[i].Text(); ok {
			args = append(args, s)
		} else {
			args = append(args, nil)
		}
		return fmt.Sprintf("$%d::text::%s", len(args), ch.Columns[i].Type)
	}
	var cols, vals, sets, where []string
	keyRow := ch.Old
	if keyRow == nil {
		keyRow = ch.New
	}
	for i, col := range ch.Columns {
		ident := pgx.Identifier{col.Name}.Sanitize()
		switch ch.Op {
		case canonical.OpInsert:
			cols, vals = append(cols, ident), append(vals, param(i, ch.New))
		case canonical.OpUpdate:
			sets = append(sets, ident+" = "+param(i, ch.New))
		}
	}
	for _, key := range table.PrimaryKey {
		i := table.ColumnIndex(key)
		if ch.Op != canonical.OpInsert {
			where = append(where, pgx.Identifier{key}.Sanitize()+" = "+param(i, keyRow))
		}
	}
	switch ch.Op {
	case canonical.OpInsert:
		return "INSERT INTO " + name + " (" + strings.Join(cols, ", ") + ") VALUES (" + strings.Join(vals, ", ") + ")", args
	case canonical.OpUpdate:
		return "UPDATE " + name + " SET " + strings.Join(sets, ", ") + " WHERE " + strings.Join(where, " AND "), args
	}
	return "DELETE FROM " + name + " WHERE " + strings.Join(where, " AND "), args
}
