package siphon_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/siphondb/siphon"
	"github.com/siphondb/siphon/canonical"
)

// The log messages of the SQL catch-up.
const (
	catchUpStarted  = "stream catching up through the SQL interface"
	catchUpSwitched = "stream switching from the SQL interface to the walsender"
)

// copySlot makes a copy of slot (same positions) named name.
func copySlot(t *testing.T, admin *pgx.Conn, slot, name string) {
	t.Helper()
	execSQL(t, admin, fmt.Sprintf("SELECT pg_copy_logical_replication_slot('%s', '%s')", slot, name))
}

// collectUntilEnd streams c's slot from from until the marker "end" and
// returns the changes before it (markers left out) and the Position
// StreamChanges returned. onMarker, when set, runs at every other marker.
func collectUntilEnd(t *testing.T, c *siphon.Conn, from canonical.Position, onMarker func(string)) ([]canonical.Change, canonical.Position) {
	t.Helper()
	return collectUntil(t, c, from, "end", onMarker)
}

// collectUntil is collectUntilEnd until the marker end.
func collectUntil(t *testing.T, c *siphon.Conn, from canonical.Position, end string, onMarker func(string)) ([]canonical.Change, canonical.Position) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitDeadline)
	defer cancel()
	var got []canonical.Change
	seen := false
	pos, err := c.StreamChanges(ctx, from, func(ch canonical.Change) error {
		if ch.Op == canonical.OpMessage && ch.Message.Prefix == markerPrefix {
			switch m := string(ch.Message.Content); {
			case m == end:
				seen = true
				cancel()
			case onMarker != nil:
				onMarker(m)
			}
			return nil
		}
		got = append(got, ch)
		return nil
	})
	require.NoError(t, err)
	require.True(t, seen, "marker %s not reached in time", end)
	return got, pos
}

// requireSameChanges fails unless got is want, saying where they part.
func requireSameChanges(t *testing.T, want, got []canonical.Change, what string) {
	t.Helper()
	for i := range min(len(want), len(got)) {
		require.Equal(t, want[i], got[i], "%s: change %d of %d", what, i, len(want))
	}
	require.Len(t, got, len(want), what)
}

// catchUpBacklog makes a backlog on the tables items, wide and open_tx: many small
// transactions of inserts, updates, deletes, transactional and
// non-transactional messages (heartbeat-looking ones of the slots named
// too, which the stream must swallow), a truncate, a schema change, one
// transaction of a few MB, and one transaction open across all of it. It
// ends with the marker "backlog".
func catchUpBacklog(t *testing.T, dsn string, admin *pgx.Conn, slots []string) {
	t.Helper()
	straddler := connectOrFail(t, dsn)
	execSQL(t, straddler, "BEGIN", "INSERT INTO open_tx VALUES (1, 'open across the backlog')")
	var heartbeats strings.Builder
	for _, s := range slots {
		fmt.Fprintf(&heartbeats, "PERFORM pg_logical_emit_message(false, 'siphon.heartbeat', json_build_object('slot', '%s', 'last', '0/1', 'at', '0/1')::text);\n", s)
	}
	execSQL(t, admin, `DO $$
		BEGIN
		FOR i IN 1..300 LOOP
			INSERT INTO items SELECT i * 100 + k, 'item ' || i || '.' || k, k FROM generate_series(1, 8) k;
			UPDATE items SET qty = qty + 1, name = name || ' (more)' WHERE id BETWEEN (i - 1) * 100 + 1 AND (i - 1) * 100 + 3;
			DELETE FROM items WHERE id = (i - 1) * 100 + 8;
			IF i % 50 = 0 THEN
				PERFORM pg_logical_emit_message(true, 'app.tx', 'in transaction ' || i);
			END IF;
			COMMIT;
			IF i % 70 = 0 THEN
				PERFORM pg_logical_emit_message(false, 'app.note', 'between transactions ' || i);
				`+heartbeats.String()+`
			END IF;
		END LOOP;
		END $$`,
		"INSERT INTO wide SELECT i, repeat(md5(i::text), 4) FROM generate_series(1, 5) i",
		"TRUNCATE wide",
		"ALTER TABLE items ADD COLUMN note text",
		"INSERT INTO items VALUES (100000, 'after the schema change', 1, 'noted')",
		"INSERT INTO wide SELECT i, repeat(md5(i::text), 4) FROM generate_series(1, 20000) i",
	)
	execSQL(t, straddler, "UPDATE open_tx SET note = 'committed at the end'", "COMMIT")
	emitMarker(t, admin, "backlog")
}

// insertWide commits txs transactions of rows inserts each into the table
// wide (id int PRIMARY KEY, pad text): transaction i (from 1) inserts the
// ids i*1000+1 to i*1000+rows, with a 960-byte pad.
func insertWide(t *testing.T, admin *pgx.Conn, txs, rows int) {
	t.Helper()
	execSQL(t, admin, fmt.Sprintf(`DO $$ BEGIN
		FOR i IN 1..%d LOOP INSERT INTO wide SELECT i * 1000 + k, repeat(md5(k::text), 30) FROM generate_series(1, %d) k; COMMIT; END LOOP;
		END $$`, txs, rows))
}

// requireWide fails unless changes are insertWide's txs transactions of
// rows inserts, whole and in order.
func requireWide(t *testing.T, changes []canonical.Change, txs, rows int) {
	t.Helper()
	got := transactions(t, changes)
	require.Len(t, got, txs)
	for i, tx := range got {
		require.Len(t, tx.changes, rows, "transaction %d", i)
		assert.Equal(t, fmt.Sprint((i+1)*1000+1), text(t, tx.changes[0].New[0]), "transaction %d", i)
	}
}

// TestCatchUpDeliversWhatTheWalsenderDelivers takes one backlog through the
// walsender alone and through the SQL catch-up in three ways (chunks far
// smaller than the large transaction read by two workers in turn, chunks
// growing with what they decode again read by one worker, and chunks held
// so small that the open transaction makes the catch-up give way to the
// walsender), each on a copy of the same slot: every way delivers the same
// changes with the same Positions and returns the same Position, and the
// slots end at it. The first also goes on through the walsender with what
// is written while it catches up.
func TestCatchUpDeliversWhatTheWalsenderDelivers(t *testing.T) {
	t.Parallel()
	dsn, admin := newDatabase(t)
	execSQL(t, admin, "CREATE TABLE items (id int PRIMARY KEY, name text, qty int)", "CREATE TABLE wide (id int PRIMARY KEY, pad text)",
		"CREATE TABLE open_tx (id int PRIMARY KEY, note text)")
	walsender, slot, start := captureConnAt(t, dsn)
	walsender.NoCatchUpForTest()
	ways := []struct {
		name  string
		tune  siphon.CatchUpForTest
		why   string // of the switch to the walsender, if it switches
		slot  string
		after bool // writes the rest at the marker "backlog"
	}{
		{name: "small chunks, two workers", tune: siphon.CatchUpForTest{MinChunk: 64 << 10, MaxChunk: 64 << 10, Workers: 2}, why: "reason=\"caught up\"", after: true},
		{name: "growing chunks, one worker", tune: siphon.CatchUpForTest{MinChunk: 64 << 10, MaxChunk: 1 << 30, RedecodeRatio: 2, Workers: 1}},
		{name: "too far to decode again", tune: siphon.CatchUpForTest{MinChunk: 64 << 10, MaxChunk: 512 << 10, RedecodeRatio: 2, Workers: 2}, why: "too far back"},
	}
	var slots []string
	for i := range ways {
		ways[i].slot = fmt.Sprintf("%s_way%d", slot, i)
		copySlot(t, admin, slot, ways[i].slot)
		slots = append(slots, ways[i].slot)
	}
	catchUpBacklog(t, dsn, admin, append(slots, slot))

	type delivered struct {
		changes []canonical.Change
		pos     canonical.Position
	}
	var got []delivered
	for _, way := range ways {
		logs := &logRecorder{}
		c, err := siphon.Connect(context.Background(), dsn, siphon.WithSlot(way.slot), siphon.WithLogger(logs.logger()))
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		c.SetCatchUpForTest(way.tune)
		onMarker := func(string) {}
		wrote := make(chan error, 1)
		if way.after {
			// Once the walsender goes on, more changes come.
			onMarker = func(m string) {
				if m == "backlog" {
					go func() { wrote <- writeOnceStarted(admin, logs, "end") }()
				}
			}
		}
		changes, pos := collectUntilEnd(t, c, start, onMarker)
		if way.after {
			require.NoError(t, <-wrote)
		}
		assert.NotEmpty(t, logs.find(slog.LevelInfo, catchUpStarted), way.name)
		if switched := logs.find(slog.LevelInfo, catchUpSwitched); way.why == "" {
			assert.Empty(t, switched, "%s: the marker comes first", way.name)
		} else if assert.Len(t, switched, 1, way.name) {
			assert.Contains(t, switched[0], way.why, way.name)
		}
		got = append(got, delivered{changes, pos})
		require.NoError(t, c.Close())
	}
	want, wantPos := collectUntilEnd(t, walsender, start, nil)

	txs := transactions(t, want)
	require.Greater(t, len(txs), 300)
	var ddl, large, truncates int
	for _, tx := range txs {
		for _, ch := range tx.changes {
			switch ch.Op {
			case canonical.OpDDL:
				ddl++
			case canonical.OpTruncate:
				truncates++
			}
		}
		if len(tx.changes) == 20000 {
			large++
		}
	}
	assert.Equal(t, 1, ddl, "the schema change")
	assert.Equal(t, 1, truncates)
	assert.Equal(t, 1, large, "the large transaction")
	assert.Equal(t, "after the catch-up", text(t, txs[len(txs)-2].changes[0].New[1]), "what came after the backlog")
	for i, way := range ways {
		requireSameChanges(t, want, got[i].changes, way.name)
		assert.Equal(t, wantPos, got[i].pos, way.name)
		assert.Equal(t, wantPos, slotConfirmed(t, admin, way.slot), "%s: once the stream returned, the slot stands at the last transaction handled", way.name)
	}
	assert.Equal(t, wantPos, slotConfirmed(t, admin, slot), "once the stream returned, the slot stands at the last transaction handled")
}

// writeOnceStarted waits until the log says the walsender started, then
// writes a transaction, an update and the marker end.
func writeOnceStarted(admin *pgx.Conn, logs *logRecorder, end string) error {
	if !waitUntil(func() bool { return len(logs.find(slog.LevelInfo, "stream started")) > 0 }) {
		return errors.New("the walsender did not start")
	}
	for _, sql := range []string{
		"INSERT INTO items VALUES (200000, 'after the catch-up', 2, NULL)",
		"UPDATE wide SET pad = 'changed' WHERE id = 1",
		fmt.Sprintf("SELECT pg_logical_emit_message(false, '%s', '%s')", markerPrefix, end),
	} {
		if _, err := admin.Exec(context.Background(), sql); err != nil {
			return err
		}
	}
	return nil
}

// catchUpConn connects to slot with a catch-up of small chunks forced on
// every backlog, and records the log.
func catchUpConn(t *testing.T, dsn, slot string, opts ...siphon.Option) (*siphon.Conn, *logRecorder) {
	t.Helper()
	logs := &logRecorder{}
	c, err := siphon.Connect(context.Background(), dsn, append([]siphon.Option{siphon.WithSlot(slot), siphon.WithLogger(logs.logger())}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	c.SetCatchUpForTest(siphon.CatchUpForTest{MinChunk: 64 << 10, MaxChunk: 64 << 10, Workers: 2})
	return c, logs
}

// catchUpConnAt is catchUpConn on a slot unique to the test, made with its
// publication (CurrentPosition), and returns the slot and the Position to
// stream from.
func catchUpConnAt(t *testing.T, dsn string, opts ...siphon.Option) (*siphon.Conn, *logRecorder, string, canonical.Position) {
	t.Helper()
	slot := streamSlot(t)
	c, logs := catchUpConn(t, dsn, slot, opts...)
	start, err := c.CurrentPosition(context.Background())
	require.NoError(t, err)
	return c, logs, slot, start
}

// TestCatchUpIncrementalBound is TestBackupIncrementalBound through the
// SQL catch-up: exactly the transactions committed before the bound, the
// one committed after it and the one open across it in the next
// incremental, and nothing acknowledged past since.
func TestCatchUpIncrementalBound(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn, admin := newDatabase(t)
	execSQL(t, admin, "CREATE TABLE t (id int PRIMARY KEY, note text)")
	c, logs, slot, since := catchUpConnAt(t, dsn)

	execSQL(t, admin, "INSERT INTO t VALUES (1)", "INSERT INTO t VALUES (2)",
		"INSERT INTO t SELECT i, 'bulk' FROM generate_series(100, 30099) i")
	straddler := connectOrFail(t, dsn)
	execSQL(t, straddler, "BEGIN", "INSERT INTO t VALUES (3, 'straddles')")

	var buf bytes.Buffer
	done := make(chan error, 1)
	var end1 canonical.Position
	go func() {
		var err error
		end1, err = c.BackupIncremental(ctx, since, &buf)
		done <- err
	}()
	// The bound is read before the catch-up starts.
	waitFor(t, "the catch-up starts", func() bool { return len(logs.find(slog.LevelInfo, catchUpStarted)) > 0 })
	execSQL(t, admin, "INSERT INTO t VALUES (4, 'after the bound')")
	require.NoError(t, <-done)

	_, txs, end := readIncremental(t, buf.Bytes())
	require.Len(t, txs, 3, "the transactions committed before the bound, none after")
	assert.Equal(t, "1", text(t, txs[0].changes[0].New[0]))
	assert.Equal(t, "2", text(t, txs[1].changes[0].New[0]))
	assert.Len(t, txs[2].changes, 30000)
	assert.Equal(t, txs[2].commit.Position, end)
	assert.Equal(t, end, end1)
	assert.Equal(t, since, slotConfirmed(t, admin, slot), "nothing past since is acknowledged")
	assert.Empty(t, logs.find(slog.LevelInfo, catchUpSwitched), "the catch-up ends at the bound")

	execSQL(t, straddler, "COMMIT")
	buf.Reset()
	end2, err := c.BackupIncremental(ctx, end1, &buf)
	require.NoError(t, err)
	h, txs, end := readIncremental(t, buf.Bytes())
	assert.Equal(t, end1, h.Start)
	require.Len(t, txs, 2)
	assert.Equal(t, "4", text(t, txs[0].changes[0].New[0]), "committed after the first bound")
	assert.Equal(t, "3", text(t, txs[1].changes[0].New[0]), "the straddling transaction")
	assert.Equal(t, end2, end)
	assert.Equal(t, end1, slotConfirmed(t, admin, slot), "starting the next incremental acknowledges the previous one")

	buf.Reset()
	again, err := c.BackupIncremental(ctx, end1, &buf)
	require.NoError(t, err)
	assert.Equal(t, end2, again, "a lost incremental can be taken again")
	_, err = c.BackupIncremental(ctx, since, &buf)
	var gap *siphon.ResumeGapError
	assert.ErrorAs(t, err, &gap, "an incremental from before the slot's position")

	require.NoError(t, c.Close())
	assertNoLeaks(t, dsn, slot)
}

// TestCatchUpCancelAndResume cancels a stream in the middle of its
// catch-up: it returns the end of the last transaction handled, with no
// error, leaves no session or copy of the slot behind, the slot stands at
// that Position, and a resume from it delivers the rest with nothing
// repeated.
func TestCatchUpCancelAndResume(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn, admin := newDatabase(t)
	execSQL(t, admin, "CREATE TABLE t (id int PRIMARY KEY, pad text)")
	c, logs, slot, start := catchUpConnAt(t, dsn)
	execSQL(t, admin, `DO $$ BEGIN
		FOR i IN 1..400 LOOP INSERT INTO t SELECT i * 10 + k, repeat('p', 200) FROM generate_series(1, 5) k; COMMIT; END LOOP;
		END $$`)
	emitMarker(t, admin, "end")

	runCtx, cancel := context.WithCancel(ctx)
	var handled canonical.Position
	commits := 0
	pos, err := c.StreamChanges(runCtx, start, func(ch canonical.Change) error {
		if ch.Op == canonical.OpCommit {
			if commits++; commits == 150 {
				cancel()
			}
			handled = ch.Position
		}
		return nil
	})
	require.NoError(t, err, "cancelling is the normal stop")
	require.NotEmpty(t, logs.find(slog.LevelInfo, catchUpStarted))
	assert.Equal(t, handled, pos, "the end of the last transaction handled")
	assert.Equal(t, 150, commits, "nothing handled after the cancel")
	assert.Equal(t, pos, slotConfirmed(t, admin, slot), "confirmed by the server before the stream returned")
	require.NoError(t, c.Close())
	assertNoLeaks(t, dsn, slot)

	c, _ = catchUpConn(t, dsn, slot)
	changes, _ := streamUntil(t, c, pos, "end")
	txs := transactions(t, changes)
	require.Len(t, txs, 250, "the rest, once")
	assert.Equal(t, fmt.Sprint(151*10+1), text(t, txs[0].changes[0].New[0]))
	require.NoError(t, c.Close())
	assertNoLeaks(t, dsn, slot)
}

// TestCatchUpSlotInUse: a slot another session streams is refused as the
// walsender refuses it, after the same wait; a slot another session takes
// while siphon catches up (the catch-up holds only copies of it) stops the
// stream with ErrSlotInUse when it next moves the slot, before anything of
// a later transaction is acknowledged.
func TestCatchUpSlotInUse(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn, admin := newDatabase(t)
	execSQL(t, admin, "CREATE TABLE t (id int PRIMARY KEY)")
	c, logs, slot, start := catchUpConnAt(t, dsn, siphon.WithStatusInterval(20*time.Millisecond))
	execSQL(t, admin, `DO $$ BEGIN FOR i IN 1..200 LOOP INSERT INTO t VALUES (i); COMMIT; END LOOP; END $$`)

	holder, err := siphon.Connect(ctx, dsn, siphon.WithSlot(slot))
	require.NoError(t, err)
	defer holder.Close()
	holder.NoCatchUpForTest()
	holding, release := context.WithCancel(ctx)
	held := make(chan error, 1)
	go func() {
		_, err := holder.StreamChanges(holding, start, func(canonical.Change) error { <-holding.Done(); return nil })
		held <- err
	}()
	slotActive := func() bool {
		var active bool
		err := admin.QueryRow(ctx, "SELECT active FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&active)
		return err == nil && active
	}
	waitFor(t, "the holder takes the slot", slotActive)
	_, err = c.StreamChanges(ctx, start, func(canonical.Change) error { return nil })
	assert.ErrorIs(t, err, siphon.ErrSlotInUse, "a slot in use is refused")
	assert.Empty(t, logs.find(slog.LevelInfo, catchUpStarted))
	release()
	require.NoError(t, <-held)
	require.NoError(t, holder.Close())

	// Taken while siphon catches up: the emit of the second transaction
	// waits until another stream holds the slot.
	var commits atomic.Int64
	taken := make(chan struct{})
	other, err := siphon.Connect(ctx, dsn, siphon.WithSlot(slot))
	require.NoError(t, err)
	defer other.Close()
	other.NoCatchUpForTest()
	otherCtx, stopOther := context.WithCancel(ctx)
	otherDone := make(chan error, 1)
	_, err = c.StreamChanges(ctx, start, func(ch canonical.Change) error {
		if ch.Op == canonical.OpCommit && commits.Add(1) == 1 {
			go func() {
				_, err := other.StreamChanges(otherCtx, 0, func(canonical.Change) error { return nil })
				otherDone <- err
			}()
			waitFor(t, "the other stream takes the slot", slotActive)
			close(taken)
		}
		return nil
	})
	assert.ErrorIs(t, err, siphon.ErrSlotInUse, "the slot was taken meanwhile")
	select {
	case <-taken:
	default:
		t.Fatal("the stream ended before the slot was taken")
	}
	stopOther()
	require.NoError(t, <-otherDone)
	require.NoError(t, other.Close())
	require.NoError(t, c.Close())
	assertNoLeaks(t, dsn, slot)
}

// TestCatchUpEmitErrorStopsAndResumeRedelivers: an emit error in the
// catch-up stops the stream, returns the end of the last transaction
// handled and leaves the slot there; a resume delivers the failed
// transaction again.
func TestCatchUpEmitErrorStopsAndResumeRedelivers(t *testing.T) {
	t.Parallel()
	dsn, admin := newDatabase(t)
	execSQL(t, admin, "CREATE TABLE t (id int PRIMARY KEY)")
	c, _, slot, start := catchUpConnAt(t, dsn)
	execSQL(t, admin, `DO $$ BEGIN FOR i IN 1..300 LOOP INSERT INTO t VALUES (i); COMMIT; END LOOP; END $$`)

	boom := errors.New("disk full")
	var lastEnd canonical.Position
	pos, err := c.StreamChanges(context.Background(), start, func(ch canonical.Change) error {
		switch {
		case ch.Op == canonical.OpInsert && text(t, ch.New[0]) == "200":
			return boom
		case ch.Op == canonical.OpCommit:
			lastEnd = ch.Position
		}
		return nil
	})
	require.ErrorIs(t, err, boom)
	assert.Equal(t, lastEnd, pos)
	require.Equal(t, pos, slotConfirmed(t, admin, slot), "confirmed by the server before the stream returned")

	emitMarker(t, admin, "end")
	changes, _ := streamUntil(t, c, pos, "end")
	txs := transactions(t, changes)
	require.Len(t, txs, 101)
	assert.Equal(t, "200", text(t, txs[0].changes[0].New[0]))
	require.NoError(t, c.Close())
	assertNoLeaks(t, dsn, slot)
}

// catchUpLeftovers lists, at once (no waiting), the copies of slots the
// catch-up made that still exist on admin's database, and the sessions
// holding them.
func catchUpLeftovers(t *testing.T, admin *pgx.Conn) []string {
	t.Helper()
	rows, err := admin.Query(context.Background(), `SELECT slot_name || coalesce(' (active pid ' || active_pid || ')', '')
		FROM pg_replication_slots WHERE database = current_database() AND starts_with(slot_name, $1)`, siphon.CatchUpSlotPrefixForTest)
	require.NoError(t, err)
	left, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return left
}

// TestCatchUpSwitchWhileTheSlotAdvances switches from the catch-up to the
// walsender while the slot is being advanced all the time (a status
// interval of a millisecond, over a backlog the server takes a while to
// fast-forward through): the walsender must find the slot free, every
// time, and no copy of the slot may remain once StreamChanges returns.
func TestCatchUpSwitchWhileTheSlotAdvances(t *testing.T) {
	t.Parallel()
	dsn, admin := newDatabase(t)
	execSQL(t, admin, "CREATE TABLE items (id int PRIMARY KEY, name text, qty int, note text)",
		"CREATE TABLE wide (id int PRIMARY KEY, pad text)")
	c, logs, slot, start := catchUpConnAt(t, dsn, siphon.WithStatusInterval(time.Millisecond))
	c.SetCatchUpForTest(siphon.CatchUpForTest{MinChunk: 1 << 20, MaxChunk: 1 << 20, Workers: 2})
	insertWide(t, admin, 150, 100)
	pos := start
	for round := range 3 {
		// Markers of the round's own: a resume from the last commit reads
		// the markers of the round before again.
		backlog, endMarker := fmt.Sprint("backlog", round), fmt.Sprint("end", round)
		emitMarker(t, admin, backlog)
		wrote := make(chan error, 1)
		changes, end := collectUntil(t, c, pos, endMarker, func(m string) {
			if m == backlog {
				go func() { wrote <- writeOnceStarted(admin, logs, endMarker) }()
			}
		})
		require.NoError(t, <-wrote)
		assert.Empty(t, catchUpLeftovers(t, admin), "round %d: copies of the slot left once StreamChanges returned", round)
		txs := transactions(t, changes)
		want := 3 // the round's backlog, what came after the switch
		if round == 0 {
			want = 151
		}
		require.Len(t, txs, want, "round %d", round)
		assert.Equal(t, "after the catch-up", text(t, txs[len(txs)-1].changes[0].New[1]), "round %d", round)
		// The next round starts behind again.
		execSQL(t, admin, "DELETE FROM items", "UPDATE wide SET pad = pad || 'x' WHERE id % 1000 <= 40")
		logs.reset()
		pos = end
	}
	require.NoError(t, c.Close())
	assertNoLeaks(t, dsn, slot)
}

// reset forgets the lines logged so far.
func (r *logRecorder) reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lines = nil
}

// TestCatchUpAdvanceCutShortFreesTheSlot: an advance of the slot that ctx
// cuts short (the catch-up stopping, or switching to the walsender, while
// the server fast-forwards the slot through a long backlog) returns only
// once the slot is free again: the walsender that follows must not find
// it active.
func TestCatchUpAdvanceCutShortFreesTheSlot(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn, admin := newDatabase(t)
	execSQL(t, admin, "CREATE TABLE wide (id int PRIMARY KEY, pad text)")
	c, _, slot, _ := catchUpConnAt(t, dsn)
	insertWide(t, admin, 200, 100)
	var flushed string
	require.NoError(t, admin.QueryRow(ctx, "SELECT pg_current_wal_flush_lsn()::text").Scan(&flushed))
	to, err := canonical.ParsePosition(flushed) // an advance goes no further
	require.NoError(t, err)
	short, cancel := context.WithTimeout(ctx, 2*time.Millisecond)
	began := time.Now()
	err = c.AdvanceSlotForTest(short, to)
	took := time.Since(began)
	cancel()
	var active bool
	require.NoError(t, admin.QueryRow(ctx, "SELECT active FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&active))
	assert.False(t, active, "the slot is free once the advance returned (%v, %v)", took, err)
	if err == nil {
		t.Logf("the advance finished within %v: nothing was cut short", took)
	}
	require.NoError(t, c.AdvanceSlotForTest(ctx, to))
	assert.Equal(t, to, slotConfirmed(t, admin, slot))
	require.NoError(t, c.Close())
	assertNoLeaks(t, dsn, slot)
}

// blockingWriter passes writes on to w, but its second write first waits
// until hold returns.
type blockingWriter struct {
	w      io.Writer
	writes int
	hold   func()
}

func (b *blockingWriter) Write(p []byte) (int, error) {
	if b.writes++; b.writes == 2 {
		b.hold()
	}
	return b.w.Write(p)
}

// TestCatchUpIncrementalSlotTakenMeanwhile: an incremental backup moves
// the slot no further than since, but a walsender that takes the slot
// while it catches up still stops it with ErrSlotInUse, as it would the
// walsender's own start.
func TestCatchUpIncrementalSlotTakenMeanwhile(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn, admin := newDatabase(t)
	execSQL(t, admin, "CREATE TABLE wide (id int PRIMARY KEY, pad text)")
	c, logs, slot, since := catchUpConnAt(t, dsn, siphon.WithStatusInterval(20*time.Millisecond))
	insertWide(t, admin, 100, 20)

	other, err := siphon.Connect(ctx, dsn, siphon.WithSlot(slot))
	require.NoError(t, err)
	defer other.Close()
	other.NoCatchUpForTest()
	otherCtx, stopOther := context.WithCancel(ctx)
	otherDone := make(chan error, 1)
	w := &blockingWriter{w: io.Discard, hold: func() {
		go func() {
			_, err := other.StreamChanges(otherCtx, since, func(canonical.Change) error { return nil })
			otherDone <- err
		}()
		waitFor(t, "the other stream takes the slot", func() bool { return slotIsActive(t, admin, slot) })
	}}
	_, err = c.BackupIncremental(ctx, since, w)
	assert.ErrorIs(t, err, siphon.ErrSlotInUse, "the slot was taken meanwhile")
	assert.NotEmpty(t, logs.find(slog.LevelInfo, catchUpStarted))
	assert.Equal(t, 2, min(w.writes, 2), "the slot was taken during the backup")
	assert.Empty(t, catchUpLeftovers(t, admin), "copies of the slot left once BackupIncremental returned")
	stopOther()
	require.NoError(t, <-otherDone)
	require.NoError(t, other.Close())
	require.NoError(t, c.Close())
	assertNoLeaks(t, dsn, slot)
}

// slotIsActive reads whether a session holds slot.
func slotIsActive(t *testing.T, admin *pgx.Conn, slot string) bool {
	var active bool
	err := admin.QueryRow(context.Background(), "SELECT active FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&active)
	return err == nil && active
}

// withSessionOptions returns dsn with server settings ("name=value")
// added to every session's startup options.
func withSessionOptions(t *testing.T, dsn string, settings ...string) string {
	t.Helper()
	options := "-c " + strings.Join(settings, " -c ")
	if !strings.Contains(dsn, "://") {
		return dsn + " options='" + options + "'"
	}
	u, err := url.Parse(dsn)
	require.NoError(t, err)
	q := u.Query()
	q.Set("options", options)
	u.RawQuery = strings.ReplaceAll(q.Encode(), "+", "%20") // pgx reads no + as a space
	return u.String()
}

// TestCatchUpChunkTheServerCannotHoldGoesToTheWalsender: a chunk whose
// result the server cannot materialize (here past temp_file_limit) is read
// by the walsender instead of failing the stream, with nothing delivered
// twice.
func TestCatchUpChunkTheServerCannotHoldGoesToTheWalsender(t *testing.T) {
	t.Parallel()
	dsn, admin := newDatabase(t)
	execSQL(t, admin, "CREATE TABLE wide (id int PRIMARY KEY, pad text)")
	first, _, slot, start := catchUpConnAt(t, dsn)
	require.NoError(t, first.Close())
	limited := withSessionOptions(t, dsn, "temp_file_limit=1024")
	c, logs := catchUpConn(t, limited, slot)
	c.SetCatchUpForTest(siphon.CatchUpForTest{MinChunk: 64 << 20, MaxChunk: 64 << 20})
	insertWide(t, admin, 100, 100)
	emitMarker(t, admin, "end")
	changes, _ := collectUntilEnd(t, c, start, nil)
	requireWide(t, changes, 100, 100)
	assert.NotEmpty(t, logs.find(slog.LevelInfo, catchUpStarted))
	if switched := logs.find(slog.LevelInfo, catchUpSwitched); assert.Len(t, switched, 1) {
		assert.Contains(t, switched[0], "could not materialize")
	}
	require.NoError(t, c.Close())
	assertNoLeaks(t, dsn, slot)
}
