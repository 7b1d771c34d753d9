package siphon_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/siphondb/siphon"
	"github.com/siphondb/siphon/canonical"
	"github.com/siphondb/siphon/siphontest"
)

// transaction is a streamed transaction: its begin, changes and commit.
type transaction struct {
	begin, commit canonical.Change
	changes       []canonical.Change
}

// transactions groups a stream's changes into transactions, checking the
// framing as it goes.
func transactions(t *testing.T, changes []canonical.Change) []transaction {
	t.Helper()
	var (
		out []transaction
		cur *transaction
	)
	for _, ch := range changes {
		switch {
		case ch.Op == canonical.OpBegin:
			require.Nil(t, cur, "begin inside a transaction")
			cur = &transaction{begin: ch}
		case ch.Op == canonical.OpCommit:
			require.NotNil(t, cur, "commit without begin")
			cur.commit = ch
			out = append(out, *cur)
			cur = nil
		case ch.Op == canonical.OpMessage && !ch.Message.Transactional:
			require.Nil(t, cur, "non-transactional message inside a transaction")
		default:
			require.NotNil(t, cur, "%v outside a transaction", ch.Op)
			cur.changes = append(cur.changes, ch)
		}
	}
	require.Nil(t, cur, "transaction left open")
	return out
}

// text returns a present value's text, failing on NULL or unchanged.
func text(t *testing.T, v canonical.Value) string {
	t.Helper()
	s, ok := v.Text()
	require.True(t, ok, "value %v is not present", v)
	return s
}

func TestStreamValuesPositionsAndTOAST(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn, admin := newDatabase(t)
	// A default time zone that is not UTC: the stream must still print UTC.
	var db string
	require.NoError(t, admin.QueryRow(ctx, "SELECT current_database()").Scan(&db))
	execSQL(t, admin,
		`ALTER DATABASE `+pgx.Identifier{db}.Sanitize()+` SET timezone = 'Asia/Tokyo'`,
		`ALTER DATABASE `+pgx.Identifier{db}.Sanitize()+` SET extra_float_digits = 0`,
		`CREATE TYPE mood AS ENUM ('sad', 'happy')`,
		`CREATE TABLE vals (id int8 PRIMARY KEY, ts timestamptz, f8 float8, f4 real, b bytea, n numeric(20,5),
			iv interval, d date, arr text[], j jsonb, u uuid, m mood, t text, e text, big text)`,
		`CREATE TABLE full_ident (a int, b text)`,
		`ALTER TABLE full_ident REPLICA IDENTITY FULL`,
		`CREATE TABLE idx_ident (a int NOT NULL, b text NOT NULL, c text)`,
		`CREATE UNIQUE INDEX idx_ident_ab ON idx_ident (b, a)`,
		`ALTER TABLE idx_ident REPLICA IDENTITY USING INDEX idx_ident_ab`,
	)
	c, slot, from := captureConnAt(t, dsn)

	// Incompressible, so it is stored out of line (TOAST).
	execSQL(t, admin,
		`INSERT INTO vals VALUES (9007199254740993, '2026-03-01 12:34:56.789012+02', 0.30000000000000004, 1.1, '\x00ff10', 12345678901234.56789,
			'1 year 2 mons 3 days 04:05:06.5', 'infinity', ARRAY['a', NULL, 'c"d'], '{"k": [1, 2.50]}',
			'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', 'happy', 'ünïcødé', '',
			(SELECT string_agg(md5(i::text), '') FROM generate_series(1, 300) i))`,
		`INSERT INTO vals (id) VALUES (2)`,
		`UPDATE vals SET f8 = 'NaN', f4 = '-Infinity' WHERE id = 9007199254740993`,
		`INSERT INTO full_ident VALUES (1, 'x')`,
		`UPDATE full_ident SET b = 'y'`,
		`INSERT INTO idx_ident VALUES (1, 'k', 'c1')`,
		`UPDATE idx_ident SET c = 'c2'`,
		`DELETE FROM idx_ident`,
		`ALTER TABLE vals ADD COLUMN added int DEFAULT 7`,
		`INSERT INTO vals (id) VALUES (3)`,
		`BEGIN`,
		`SELECT pg_logical_emit_message(true, 'app', 'in tx')`,
		`TRUNCATE vals, full_ident RESTART IDENTITY CASCADE`,
		`COMMIT`,
	)
	emitMarker(t, admin, "end")
	changes, pos := streamUntil(t, c, from, "end")
	txs := transactions(t, changes)
	require.Len(t, txs, 11)
	assert.Equal(t, txs[len(txs)-1].commit.Position, pos, "stop returns the last acknowledged commit")

	for _, tx := range txs {
		assert.Equal(t, tx.begin.XID, tx.commit.XID)
		assert.NotZero(t, tx.begin.XID)
		assert.Less(t, tx.begin.Position, tx.commit.Position, "commit LSN before end LSN")
		assert.Greater(t, tx.begin.Position, from)
		assert.WithinDuration(t, time.Now(), tx.commit.CommitTime, time.Minute)
		for _, ch := range tx.changes {
			assert.Equal(t, tx.begin.Position, ch.Position, "row changes carry the commit LSN")
			assert.Equal(t, tx.begin.XID, ch.XID)
			assert.True(t, tx.begin.CommitTime.Equal(ch.CommitTime))
		}
	}

	// Values print exactly as a siphon session prints them.
	sess := siphonSession(t, dsn)
	ins := txs[0].changes[0]
	require.Equal(t, canonical.OpInsert, ins.Op)
	assert.Equal(t, "vals", ins.Table)
	assert.Equal(t, "public", ins.Schema)
	var want []string
	for _, col := range ins.Columns {
		var s *string
		q := fmt.Sprintf(`SELECT %s::text FROM (VALUES (9007199254740993::int8, '2026-03-01 12:34:56.789012+02'::timestamptz,
			0.30000000000000004::float8, 1.1::real, '\x00ff10'::bytea, 12345678901234.56789::numeric(20,5), '1 year 2 mons 3 days 04:05:06.5'::interval,
			'infinity'::date, ARRAY['a', NULL, 'c"d'], '{"k": [1, 2.50]}'::jsonb, 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'::uuid,
			'happy'::mood, 'ünïcødé'::text, ''::text, 'x'::text)) v(id, ts, f8, f4, b, n, iv, d, arr, j, u, m, t, e, big)`,
			pgx.Identifier{col.Name}.Sanitize())
		require.NoError(t, sess.QueryRow(ctx, q).Scan(&s))
		want = append(want, *s)
	}
	for i, col := range ins.Columns {
		if col.Name == "big" {
			continue
		}
		assert.Equal(t, want[i], text(t, ins.New[i]), "column %s", col.Name)
	}
	assert.Equal(t, "2026-03-01 10:34:56.789012+00", text(t, ins.New[1]), "UTC, whatever the database's time zone")
	assert.Equal(t, "0.30000000000000004", text(t, ins.New[2]), "extra_float_digits 3, whatever the database's default")
	assert.Equal(t, canonical.Text(""), ins.New[13], "empty string is present, not NULL")
	assert.Len(t, text(t, ins.New[14]), 300*32)
	assert.Equal(t, []canonical.Column{
		{Name: "id", Type: "bigint", TypeOID: 20, Nullable: false},
		{Name: "ts", Type: "timestamp with time zone", TypeOID: 1184, Nullable: true},
	}, ins.Columns[:2])
	assert.Equal(t, "numeric(20,5)", ins.Columns[5].Type)
	assert.Equal(t, "public.mood", ins.Columns[11].Type, "a type outside pg_catalog is named with its schema, whatever the database's search_path")
	schema, err := c.InspectSchema(ctx)
	require.NoError(t, err)
	assert.Equal(t, schema.Table("public", "full_ident").Columns, txs[3].changes[0].Columns, "columns as InspectSchema describes them")

	nulls := txs[1].changes[0]
	assert.True(t, nulls.New[1].IsNull())

	toast := txs[2].changes[0]
	require.Equal(t, canonical.OpUpdate, toast.Op)
	assert.Equal(t, "NaN", text(t, toast.New[2]))
	assert.Equal(t, "-Infinity", text(t, toast.New[3]))
	assert.True(t, toast.New[14].IsUnchanged(), "unchanged TOAST value is not NULL")
	assert.Equal(t, []string{"big"}, toast.Unchanged())
	assert.Nil(t, toast.Old, "default identity, key unchanged: no old row")

	full := txs[4].changes[0]
	assert.Equal(t, canonical.Row{canonical.Text("1"), canonical.Text("x")}, full.Old, "REPLICA IDENTITY FULL: whole old row")
	assert.Equal(t, canonical.Row{canonical.Text("1"), canonical.Text("y")}, full.New)

	idxUpdate := txs[6].changes[0]
	assert.Nil(t, idxUpdate.Old, "identity columns unchanged: no old row")
	idxDelete := txs[7].changes[0]
	assert.Equal(t, canonical.Row{canonical.Text("1"), canonical.Text("k"), canonical.Null()}, idxDelete.Old, "identity index columns only")

	ddl := txs[8].changes
	require.Len(t, ddl, 1, "the schema change is a change of its own transaction")
	require.Equal(t, canonical.OpDDL, ddl[0].Op)
	assert.Equal(t, &canonical.DDL{Tag: "ALTER TABLE", Statement: "ALTER TABLE vals ADD COLUMN added int DEFAULT 7",
		SearchPath: `"public"`, Role: "postgres", SessionRole: "postgres", Superuser: true, Installer: "postgres",
		Objects: []canonical.DDLObject{{Type: "table", Identity: "public.vals"}}}, ddl[0].DDL)

	added := txs[9].changes[0]
	require.Len(t, added.Columns, 16, "a column added mid-stream is decoded from the next change on")
	assert.Equal(t, canonical.Column{Name: "added", Type: "integer", TypeOID: 23, Nullable: true, Default: true}, added.Columns[15])
	assert.Equal(t, "7", text(t, added.New[15]))

	last := txs[10].changes
	require.Len(t, last, 2)
	assert.Equal(t, canonical.OpMessage, last[0].Op)
	assert.Equal(t, &canonical.Message{Transactional: true, Prefix: "app", Content: []byte("in tx")}, last[0].Message)
	assert.Equal(t, canonical.OpTruncate, last[1].Op)
	assert.ElementsMatch(t, []canonical.TableName{{Schema: "public", Name: "vals"}, {Schema: "public", Name: "full_ident"}}, last[1].Truncated)
	assert.True(t, last[1].Cascade)
	assert.True(t, last[1].RestartIdentity)

	require.NoError(t, c.Close())
	assertNoLeaks(t, dsn, slot)
}

// slotConfirmed reads the slot's confirmed flush position.
func slotConfirmed(t *testing.T, conn *pgx.Conn, slot string) canonical.Position {
	t.Helper()
	var s *string
	err := conn.QueryRow(context.Background(), "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&s)
	require.NoError(t, err)
	require.NotNil(t, s)
	pos, err := canonical.ParsePosition(*s)
	require.NoError(t, err)
	return pos
}

// insertPosition reads pg_current_wal_insert_lsn().
func insertPosition(t *testing.T, conn *pgx.Conn) canonical.Position {
	t.Helper()
	var s string
	require.NoError(t, conn.QueryRow(context.Background(), "SELECT pg_current_wal_insert_lsn()::text").Scan(&s))
	pos, err := canonical.ParsePosition(s)
	require.NoError(t, err)
	return pos
}

// streamPastAResumePoint streams, from start, an insert into t and then
// another, each followed by a marker, in two streams: pos1 is where the
// first ended, pos2 where the second did (and the slot stands), and
// second what the second delivered. A resume from pos1 is then behind the
// slot, and no heartbeat vouches for it.
func streamPastAResumePoint(t *testing.T, c *siphon.Conn, admin *pgx.Conn, start canonical.Position) (pos1, pos2 canonical.Position, second []canonical.Change) {
	t.Helper()
	execSQL(t, admin, "INSERT INTO t VALUES (1)")
	emitMarker(t, admin, "one")
	_, pos1 = streamUntil(t, c, start, "one")
	execSQL(t, admin, "INSERT INTO t VALUES (2)")
	emitMarker(t, admin, "two")
	second, pos2 = streamUntil(t, c, pos1, "two")
	require.Greater(t, pos2, pos1)
	return pos1, pos2, second
}

func TestStreamResumeGap(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn, admin := newDatabase(t)
	execSQL(t, admin, "CREATE TABLE t (id int PRIMARY KEY)")
	c, slot, start := streamConnAt(t, dsn)

	pos1, pos2, changes := streamPastAResumePoint(t, c, admin, start)
	require.Len(t, transactions(t, changes), 1, "only the transaction after pos1")
	require.Equal(t, pos2, slotConfirmed(t, admin, slot), "a stream that returned has had the server confirm its last handled transaction")

	emitted := 0
	count := func(canonical.Change) error { emitted++; return nil }
	began := time.Now()
	_, err := c.StreamChanges(ctx, pos1, count)
	var gap *siphon.ResumeGapError
	require.ErrorAs(t, err, &gap, "resuming from before the slot's position")
	assert.Equal(t, siphon.ResumeGapError{Slot: slot, Requested: pos1, Confirmed: pos2, Reason: siphon.GapBehindSlot}, *gap)
	assert.Contains(t, err.Error(), "take a new snapshot")
	assert.Less(t, time.Since(began), time.Minute, "the gap is found at the start, not after a timeout")
	assert.Zero(t, emitted, "nothing emitted before the gap is reported")

	_, err = c.StreamChanges(ctx, insertPosition(t, admin)+1<<32, count)
	require.Error(t, err, "a position from the future (another server's)")
	assert.Contains(t, err.Error(), "ahead of the server's WAL")
	assert.Zero(t, emitted)

	execSQL(t, admin, "INSERT INTO t VALUES (3)")
	emitMarker(t, admin, "three")
	changes, pos3 := streamUntil(t, c, pos2, "three")
	require.Len(t, transactions(t, changes), 1, "resuming from the slot's own position works")

	execSQL(t, admin, "SELECT pg_drop_replication_slot('"+slot+"')")
	_, err = c.StreamChanges(ctx, pos3, count)
	require.ErrorAs(t, err, &gap, "dropped slot")
	assert.Equal(t, siphon.GapSlotMissing, gap.Reason)
	assert.Equal(t, pos3, gap.Requested)

	recreated, err := c.CurrentPosition(ctx)
	require.NoError(t, err)
	require.Greater(t, recreated, pos3)
	_, err = c.StreamChanges(ctx, pos3, count)
	require.ErrorAs(t, err, &gap, "a recreated slot starts past any earlier position")
	assert.Equal(t, siphon.GapBehindSlot, gap.Reason)
	assert.Equal(t, recreated, gap.Confirmed)
	assert.Zero(t, emitted)

	require.NoError(t, c.Close())
	assertNoLeaks(t, dsn, slot)
}

func TestStreamLostSlotIsAGap(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := siphontest.Start(t, siphontest.WithPrivateServer(),
		siphontest.WithSetting("max_slot_wal_keep_size", "1MB"), siphontest.WithSetting("wal_keep_size", "0"))
	dsn := srv.NewDatabase(t)
	admin, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer admin.Close(ctx)
	c, slot, from := streamConnAt(t, dsn)

	execSQL(t, admin, "CREATE TABLE filler (x text)")
	waitFor(t, "the slot is invalidated", func() bool {
		execSQL(t, admin, "INSERT INTO filler SELECT repeat('x', 1000) FROM generate_series(1, 2000)",
			"SELECT pg_switch_wal()", "CHECKPOINT")
		var status string
		require.NoError(t, admin.QueryRow(ctx, "SELECT wal_status FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&status))
		return status == "lost"
	})

	for _, pos := range []canonical.Position{from, 0} {
		_, err = c.StreamChanges(ctx, pos, func(canonical.Change) error { return nil })
		var gap *siphon.ResumeGapError
		require.ErrorAs(t, err, &gap)
		assert.Equal(t, siphon.GapSlotLost, gap.Reason)
	}
}

func TestStreamIdleSlotAdvancesAndResumeFromLastCommitWorks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn, admin := newDatabase(t)
	execSQL(t, admin, "CREATE TABLE pub (id int PRIMARY KEY)", "CREATE TABLE unpub (x text)")
	c, slot, start := streamConnAt(t, dsn, siphon.WithTables("pub"), siphon.WithStatusInterval(20*time.Millisecond))

	// Stream in the background; the test writes only to an unpublished
	// table after the first transaction until the slot moves past it.
	runCtx, stop := context.WithCancel(ctx)
	commits := make(chan canonical.Position, 10)
	type result struct {
		pos canonical.Position
		err error
	}
	done := make(chan result, 1)
	var delivered atomic.Int64
	go func() {
		pos, err := c.StreamChanges(runCtx, start, func(ch canonical.Change) error {
			delivered.Add(1)
			if ch.Op == canonical.OpCommit {
				commits <- ch.Position
			}
			return nil
		})
		done <- result{pos, err}
	}()
	execSQL(t, admin, "INSERT INTO pub VALUES (1)")
	var last canonical.Position
	select {
	case last = <-commits:
	case <-time.After(waitDeadline):
		t.Fatal("the first transaction was not streamed")
	}
	waitFor(t, "the slot advances while only unpublished tables change", func() bool {
		execSQL(t, admin, "INSERT INTO unpub SELECT repeat('y', 200) FROM generate_series(1, 100)")
		return slotConfirmed(t, admin, slot) > last
	})
	stop()
	res := <-done
	require.NoError(t, res.err)
	assert.Equal(t, last, res.pos, "the returned position is the last transaction's end, behind the slot")
	assert.Equal(t, int64(3), delivered.Load(), "begin, insert, commit: heartbeats are never emitted")

	// A consumer that kept only its last OpCommit Position (it crashed, say)
	// resumes from it although the slot has moved on.
	execSQL(t, admin, "INSERT INTO pub VALUES (2)")
	emitMarker(t, admin, "after")
	changes, _ := streamUntil(t, c, last, "after")
	txs := transactions(t, changes)
	require.Len(t, txs, 1, "nothing repeated, nothing missed")
	assert.Equal(t, "2", text(t, txs[0].changes[0].New[0]))

	// From before the last transaction, it is a gap.
	_, err := c.StreamChanges(ctx, start, func(canonical.Change) error { return nil })
	var gap *siphon.ResumeGapError
	require.ErrorAs(t, err, &gap)

	require.NoError(t, c.Close())
	assertNoLeaks(t, dsn, slot)
}

func TestStreamHeartbeatMovesAnIdleSlot(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn, admin := newDatabase(t)
	c, slot, start := streamConnAt(t, dsn, siphon.WithHeartbeat(20*time.Millisecond), siphon.WithStatusInterval(20*time.Millisecond))
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	var emitted atomic.Int64
	done := make(chan error, 1)
	go func() {
		_, err := c.StreamChanges(runCtx, start, func(canonical.Change) error { emitted.Add(1); return nil })
		done <- err
	}()
	waitFor(t, "heartbeats advance a slot with no changes at all", func() bool { return slotConfirmed(t, admin, slot) > start })
	stop()
	require.NoError(t, <-done)
	assert.Zero(t, emitted.Load(), "heartbeat messages are not emitted")

	require.NoError(t, c.Close())
	assertNoLeaks(t, dsn, slot)
}

func TestStreamEmitErrorStopsAndResumeRedelivers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn, admin := newDatabase(t)
	execSQL(t, admin, "CREATE TABLE t (id int PRIMARY KEY)")
	c, slot, start := streamConnAt(t, dsn)
	execSQL(t, admin, "INSERT INTO t VALUES (1)", "INSERT INTO t VALUES (2)")

	boom := errors.New("disk full")
	var firstEnd canonical.Position
	pos, err := c.StreamChanges(ctx, start, func(ch canonical.Change) error {
		if ch.Op == canonical.OpCommit && firstEnd == 0 {
			firstEnd = ch.Position
		}
		if ch.Op == canonical.OpInsert && text(t, ch.New[0]) == "2" {
			return boom
		}
		return nil
	})
	require.ErrorIs(t, err, boom, "the emit error is returned wrapped")
	assert.NotErrorAs(t, err, new(*siphon.StreamInterruptedError))
	assert.Equal(t, firstEnd, pos, "the position of the last transaction whose commit was handled")
	require.Equal(t, firstEnd, slotConfirmed(t, admin, slot), "confirmed by the server before the stream returned")

	emitMarker(t, admin, "end")
	changes, _ := streamUntil(t, c, pos, "end")
	txs := transactions(t, changes)
	require.Len(t, txs, 1, "the failed transaction comes again, the handled one does not")
	assert.Equal(t, "2", text(t, txs[0].changes[0].New[0]))

	require.NoError(t, c.Close())
	assertNoLeaks(t, dsn, slot)
}

func TestStreamTerminatedWalsenderIsRetryable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn, admin := newDatabase(t)
	execSQL(t, admin, "CREATE TABLE t (id int PRIMARY KEY)")
	c, slot, start := streamConnAt(t, dsn)
	// The walsender is what is terminated: a catch-up, which the shared
	// server's WAL of other tests may start, holds no active_pid.
	c.NoCatchUpForTest()
	execSQL(t, admin, "INSERT INTO t VALUES (1)", "INSERT INTO t VALUES (2)")

	var firstEnd canonical.Position
	pos, err := c.StreamChanges(ctx, start, func(ch canonical.Change) error {
		if ch.Op == canonical.OpCommit && firstEnd == 0 {
			firstEnd = ch.Position
			execSQL(t, admin, "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = '"+slot+"'")
		}
		return nil
	})
	var intr *siphon.StreamInterruptedError
	require.ErrorAs(t, err, &intr)
	assert.ErrorAs(t, err, new(*siphon.StreamInterruptedError))
	assert.Equal(t, intr.Position, pos)
	assert.GreaterOrEqual(t, pos, firstEnd)

	emitMarker(t, admin, "end")
	changes, _ := streamUntil(t, c, pos, "end")
	var ids []string
	for _, tx := range transactions(t, changes) {
		ids = append(ids, text(t, tx.changes[0].New[0]))
	}
	if pos == firstEnd {
		assert.Equal(t, []string{"2"}, ids, "resumed right after the handled transaction")
	} else {
		assert.Empty(t, ids, "both were handled before the walsender died")
	}

	require.NoError(t, c.Close())
	assertNoLeaks(t, dsn, slot)
}

func TestStreamSlotInUse(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn, admin := newDatabase(t)
	c, slot, start := streamConnAt(t, dsn)
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := c.StreamChanges(runCtx, start, func(canonical.Change) error { return nil })
		done <- err
	}()
	waitFor(t, "the stream takes the slot", func() bool {
		var active bool
		err := admin.QueryRow(ctx, "SELECT active FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&active)
		return err == nil && active
	})

	_, err := c.StreamChanges(ctx, start, func(canonical.Change) error { return nil })
	assert.ErrorIs(t, err, siphon.ErrAlreadyStreaming, "the same Conn says so at once")
	var durable siphon.DurablePosition
	durable.Set(start + 1)
	_, err = c.StreamChangesWith(ctx, start, siphon.StreamOptions{Durable: &durable}, func(canonical.Change) error { return nil })
	assert.ErrorIs(t, err, siphon.ErrAlreadyStreaming)
	assert.Equal(t, start+1, durable.Position(), "a refused call changed the durable position")
	_, err = c.BackupIncremental(ctx, start, io.Discard)
	assert.ErrorIs(t, err, siphon.ErrAlreadyStreaming, "an incremental reads the slot too")
	other, err := siphon.Connect(ctx, dsn, siphon.WithSlot(slot))
	require.NoError(t, err)
	_, err = other.StreamChanges(ctx, start, func(canonical.Change) error { return nil })
	assert.ErrorIs(t, err, siphon.ErrSlotInUse, "another Conn finds the slot active")
	require.NoError(t, other.Close())
	stop()
	require.NoError(t, <-done)
	require.NoError(t, c.Close())
	assertNoLeaks(t, dsn, slot)
}

func TestStreamSlowEmitKeepsTheSession(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := siphontest.Start(t, siphontest.WithPrivateServer(), siphontest.WithSetting("wal_sender_timeout", "2s"))
	dsn := srv.NewDatabase(t)
	admin, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer admin.Close(ctx)
	execSQL(t, admin, "CREATE TABLE t (id int PRIMARY KEY, pad text)")
	c, slot, start := streamConnAt(t, dsn)
	c.NoCatchUpForTest() // the walsender's timeout is the subject: no catch-up of the 5 MB backlog
	// Enough rows that the decoded batches fill up while emit sleeps, so
	// the reader is held back too and cannot see the server's keepalives.
	const rows = 20000
	execSQL(t, admin, fmt.Sprintf("INSERT INTO t SELECT i, repeat('p', 100) FROM generate_series(1, %d) i", rows))
	execSQL(t, admin, "INSERT INTO t VALUES (0, 'after')")

	var pids []int
	inserts := 0
	slept := false
	ctxRun, cancel := context.WithTimeout(ctx, 2*waitDeadline)
	defer cancel()
	_, err = c.StreamChanges(ctxRun, start, func(ch canonical.Change) error {
		switch ch.Op {
		case canonical.OpInsert:
			inserts++
			if !slept {
				slept = true
				var pid int
				var held time.Time
				require.NoError(t, admin.QueryRow(ctx, "SELECT active_pid, now() FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&pid, &held))
				pids = append(pids, pid)
				// A consumer slower than wal_sender_timeout: emit returns
				// once the walsender has had a reply sent one and a half
				// timeouts after emit began to hold (a walsender left
				// without replies ends after one, and its row with it).
				waitFor(t, "a reply to the walsender 1.5 wal_sender_timeout after emit began to hold", func() bool {
					var past bool
					err := admin.QueryRow(ctx, `SELECT coalesce(reply_time > $2::timestamptz + 1.5 * current_setting('wal_sender_timeout')::interval, false)
						FROM pg_stat_replication WHERE pid = $1`, pid, held).Scan(&past)
					require.NoError(t, err, "the walsender is gone")
					return past
				})
				t.Logf("emit held for %v", time.Since(held).Round(time.Millisecond))
			}
		case canonical.OpCommit:
			if inserts == rows+1 {
				var pid int
				require.NoError(t, admin.QueryRow(ctx, "SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&pid))
				pids = append(pids, pid)
				cancel()
			}
		}
		return nil
	})
	require.NoError(t, err, "the walsender did not time out")
	assert.Equal(t, rows+1, inserts)
	require.Len(t, pids, 2)
	assert.Equal(t, pids[0], pids[1], "the same walsender all along")

	// Idle for longer than wal_sender_timeout, with status updates due only
	// every 10 s: answering the server's keepalives keeps the session.
	idle, cancelIdle := context.WithTimeout(ctx, 5*time.Second)
	defer cancelIdle()
	_, err = c.StreamChanges(idle, 0, func(canonical.Change) error { return nil })
	require.ErrorIs(t, err, context.DeadlineExceeded, "an idle stream outlives wal_sender_timeout: it ends at ctx's deadline, and says so")
	var intr *siphon.StreamInterruptedError
	assert.False(t, errors.As(err, &intr), "not an interruption")

	require.NoError(t, c.Close())
	assertNoLeaks(t, dsn, slot)
}

// readIncremental decodes a BackupIncremental output: its header, its
// transactions, and the end record's Position.
func readIncremental(t *testing.T, b []byte) (canonical.Header, []transaction, canonical.Position) {
	t.Helper()
	dec := canonical.NewDecoder(bytes.NewReader(b))
	h, err := dec.Header()
	require.NoError(t, err)
	var (
		changes []canonical.Change
		end     canonical.Position
	)
	for {
		rec, err := dec.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
		switch rec.Type {
		case canonical.RecordChange:
			changes = append(changes, *rec.Change)
		case canonical.RecordEnd:
			end = rec.Position
		}
	}
	return h, transactions(t, changes), end
}

func TestBackupIncrementalBound(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn, admin := newDatabase(t)
	execSQL(t, admin, "CREATE TABLE t (id int PRIMARY KEY, note text)")
	c, slot, since := streamConnAt(t, dsn)
	// The test waits for the walsender to take the slot; a catch-up would
	// read up to the bound without one.
	c.NoCatchUpForTest()

	execSQL(t, admin, "INSERT INTO t VALUES (1)", "INSERT INTO t VALUES (2)",
		"INSERT INTO t SELECT i, 'bulk' FROM generate_series(100, 30099) i")
	// Begun before the bound, committed after it: the next incremental's.
	straddler, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer straddler.Close(ctx)
	execSQL(t, straddler, "BEGIN", "INSERT INTO t VALUES (3, 'straddles')")

	var buf bytes.Buffer
	done := make(chan error, 1)
	var end1 canonical.Position
	go func() {
		var err error
		end1, err = c.BackupIncremental(ctx, since, &buf)
		done <- err
	}()
	// The bound is read before the slot is taken: commit a transaction
	// after it, while the capture is busy with the bulk insert.
	waitFor(t, "the incremental takes the slot", func() bool {
		var active bool
		err := admin.QueryRow(ctx, "SELECT active FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&active)
		return err == nil && active
	})
	execSQL(t, admin, "INSERT INTO t VALUES (4, 'after the bound')")
	require.NoError(t, <-done)

	h, txs, end := readIncremental(t, buf.Bytes())
	assert.Equal(t, canonical.KindIncremental, h.Kind)
	assert.Equal(t, since, h.Start)
	assert.Zero(t, h.End, "the end is known only at the end: see the end record")
	assert.Equal(t, slot, h.Slot)
	assert.NotEmpty(t, h.SystemID)
	assert.NotEmpty(t, h.ServerVersion)
	require.Len(t, txs, 3, "the transactions committed before the bound, none after")
	assert.Equal(t, "1", text(t, txs[0].changes[0].New[0]))
	assert.Equal(t, "2", text(t, txs[1].changes[0].New[0]))
	assert.Len(t, txs[2].changes, 30000)
	assert.Equal(t, txs[2].commit.Position, end, "the end record carries the last commit's end")
	assert.Equal(t, end, end1)
	assert.Equal(t, since, slotConfirmed(t, admin, slot), "nothing past since is acknowledged")

	execSQL(t, straddler, "COMMIT")
	buf.Reset()
	end2, err := c.BackupIncremental(ctx, end1, &buf)
	require.NoError(t, err)
	h, txs, end = readIncremental(t, buf.Bytes())
	assert.Equal(t, end1, h.Start, "the next incremental starts where the previous ended")
	require.Len(t, txs, 2)
	assert.Equal(t, "4", text(t, txs[0].changes[0].New[0]), "committed after the first bound")
	assert.Equal(t, "3", text(t, txs[1].changes[0].New[0]), "the straddling transaction")
	assert.Equal(t, end2, end)
	assert.Equal(t, end1, slotConfirmed(t, admin, slot), "starting the next incremental acknowledges the previous one")

	// A failed or lost incremental can be taken again from the same since.
	buf.Reset()
	again, err := c.BackupIncremental(ctx, end1, &buf)
	require.NoError(t, err)
	assert.Equal(t, end2, again)
	_, err = c.BackupIncremental(ctx, since, &buf)
	var gap *siphon.ResumeGapError
	assert.ErrorAs(t, err, &gap, "an incremental from before the slot's position")

	require.NoError(t, c.Close())
	assertNoLeaks(t, dsn, slot)
}

func TestBackupIncrementalIdleReturnsPromptly(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn, admin := newDatabase(t)
	execSQL(t, admin, "CREATE TABLE t (id int PRIMARY KEY)")
	// A status interval far longer than an idle incremental takes, even on
	// a loaded machine: the capture must not wait for it (nor for a
	// keepalive, every wal_sender_timeout/3 at most, 20 s by default).
	const interval = 30 * time.Second
	c, slot, since := streamConnAt(t, dsn, siphon.WithStatusInterval(interval))
	for range 3 {
		var buf bytes.Buffer
		began := time.Now()
		end, err := c.BackupIncremental(ctx, since, &buf)
		require.NoError(t, err)
		took := time.Since(began)
		t.Logf("idle incremental took %v", took)
		assert.Less(t, took, interval/2, "an idle database does not hold the capture")
		assert.Equal(t, since, end, "nothing committed: it ends where it started")
		h, txs, recEnd := readIncremental(t, buf.Bytes())
		assert.Equal(t, since, h.Start)
		assert.Empty(t, txs)
		assert.Equal(t, since, recEnd)
	}

	// A transaction left open after writing: its WAL stays unflushed on a
	// server with no other commits, and the walsender sends only flushed
	// WAL. The incremental has the server flush to its bound first, and
	// streams leave out the message that does it.
	writer := connectOrFail(t, dsn)
	execSQL(t, writer, "BEGIN", "INSERT INTO t SELECT generate_series(1, 100)")
	before := insertPosition(t, admin)
	var buf bytes.Buffer
	end, err := c.BackupIncremental(ctx, since, &buf)
	require.NoError(t, err)
	assert.Equal(t, since, end, "nothing committed")
	var flushed string
	require.NoError(t, admin.QueryRow(ctx, "SELECT pg_current_wal_flush_lsn()::text").Scan(&flushed))
	flushedPos, err := canonical.ParsePosition(flushed)
	require.NoError(t, err)
	assert.GreaterOrEqual(t, flushedPos, before, "the server flushed its WAL past the open transaction's")
	execSQL(t, writer, "ROLLBACK")
	emitMarker(t, admin, "after")
	changes, _ := streamUntil(t, c, since, "after")
	for _, ch := range changes {
		if ch.Op == canonical.OpMessage {
			assert.NotEqual(t, "siphon.flush", ch.Message.Prefix, "the flush is never emitted")
		}
	}

	require.NoError(t, c.Close())
	assertNoLeaks(t, dsn, slot)
}
