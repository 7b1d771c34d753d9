package siphon_test

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/siphondb/siphon"
	"github.com/siphondb/siphon/canonical"
	"github.com/siphondb/siphon/siphontest"
)

// TestStreamReturnsOnceTheServerConfirmed holds the walsender still
// (SIGSTOP) while the stream stops: a stream that only sent its final
// status update and closed would return with the slot behind, and the
// walsender, terminated while stopped, would never read the update. The
// stream returns only once the server confirmed the last transaction it
// handled, so the slot stands there the moment StreamChanges returns, and
// BackupIncremental's slot stands at its since.
func TestStreamReturnsOnceTheServerConfirmed(t *testing.T) {
	t.Parallel()
	dsn, admin := newDatabase(t)
	execSQL(t, admin, "CREATE TABLE t (id int PRIMARY KEY)")
	// No periodic status update could confirm anything meanwhile.
	c, slot, start := streamConnAt(t, dsn, siphon.WithStatusInterval(time.Hour))

	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	commits := make(chan canonical.Position, 1)
	type result struct {
		pos canonical.Position
		err error
	}
	done := make(chan result, 1)
	go func() {
		pos, err := c.StreamChanges(ctx, start, func(ch canonical.Change) error {
			if ch.Op == canonical.OpCommit {
				commits <- ch.Position
			}
			return nil
		})
		done <- result{pos, err}
	}()
	execSQL(t, admin, "INSERT INTO t VALUES (1)")
	var last canonical.Position
	select {
	case last = <-commits:
	case <-time.After(time.Minute):
		t.Fatal("the transaction was not streamed")
	}
	var walsender int
	require.NoError(t, admin.QueryRow(context.Background(), "SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&walsender))
	if err := syscall.Kill(walsender, syscall.SIGSTOP); err != nil {
		t.Skipf("cannot stop the walsender (pid %d) of this server: %v", walsender, err)
	}
	resumed := false
	resume := func() {
		if !resumed {
			require.NoError(t, syscall.Kill(walsender, syscall.SIGCONT))
			resumed = true
		}
	}
	defer resume()
	stop()
	var res result
	select {
	case res = <-done:
		resume()
		t.Fatal("StreamChanges returned while the walsender could not have confirmed anything")
	case <-time.After(500 * time.Millisecond):
		resume() // the stream is still waiting for the confirmation
	}
	select {
	case res = <-done:
	case <-time.After(time.Minute):
		t.Fatal("StreamChanges did not return once the walsender went on")
	}
	require.NoError(t, res.err, "cancelling is the normal stop")
	assert.Equal(t, last, res.pos)
	assert.Equal(t, last, slotConfirmed(t, admin, slot), "the slot stands at the last transaction handled the moment the stream returns")

	// BackupIncremental acknowledges its since, and nothing past it.
	execSQL(t, admin, "INSERT INTO t VALUES (2)")
	end, err := c.BackupIncremental(context.Background(), last, io.Discard)
	require.NoError(t, err)
	assert.Greater(t, end, last)
	assert.Equal(t, last, slotConfirmed(t, admin, slot), "a link's changes stay in the slot until the next link starts from its end")
	_, err = c.BackupIncremental(context.Background(), end, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, end, slotConfirmed(t, admin, slot), "starting from a link's end confirms it")

	require.NoError(t, c.Close())
	assertNoLeaks(t, dsn, slot)
}

// TestStreamConfirmsOnlyWhatItsWalsenderRead takes two incrementals with
// checkpoints running all the while, from a slot whose restart_lsn stands
// some 180 MB of WAL (written in another database) behind the first
// incremental's end. The first incremental's walsender finds a restart
// point in that WAL that it cannot take up (BackupIncremental confirms
// nothing past its since), and PostgreSQL keeps it in shared memory for
// the slot's next session. The second incremental starts reading at the
// old restart_lsn: had it confirmed its since at once, that would take up
// the restart point ahead of its reading, and a checkpoint would remove
// the WAL it is reading ("requested WAL segment ... has already been
// removed"). It confirms nothing past what its walsender has reached, and
// succeeds. Nor does it confirm anything behind the slot's position while
// its walsender reads up to it: the keepalives it asks for meanwhile (to
// find its bound) name how far the walsender has read, and a walsender
// takes a confirmation behind the slot's position as it is.
func TestStreamConfirmsOnlyWhatItsWalsenderRead(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := siphontest.Start(t, siphontest.WithPrivateServer(), siphontest.WithSetting("wal_keep_size", "0"))
	dsn := srv.NewDatabase(t)
	admin := connectOrFail(t, dsn)
	other := connectOrFail(t, srv.NewDatabase(t))
	execSQL(t, admin, "CREATE TABLE t (id int PRIMARY KEY)")
	execSQL(t, other, "CREATE TABLE filler (id int, pad text)")
	c, slot, since := streamConnAt(t, dsn)
	c.NoCatchUpForTest() // the walsender reads the backlog: the catch-up's copies of the slot hold their own WAL
	// restart reads the slot's restart_lsn, and how far the server's WAL
	// stands past it, in bytes.
	restart := func() (restart, behind int64) {
		require.NoError(t, admin.QueryRow(ctx, `SELECT (restart_lsn - '0/0')::int8, (pg_current_wal_insert_lsn() - restart_lsn)::int8
			FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&restart, &behind))
		return restart, behind
	}

	for range 2 {
		execSQL(t, other, "INSERT INTO filler SELECT g, repeat('x', 900) FROM generate_series(1, 100000) g")
	}
	execSQL(t, admin, "CHECKPOINT", "INSERT INTO t VALUES (1)") // a restart point, then a row
	var out bytes.Buffer
	next, err := c.BackupIncremental(ctx, since, &out)
	require.NoError(t, err)
	old, behind := restart()
	const segment = 16 << 20
	require.Greater(t, behind, int64(4*segment), "the slot's restart_lsn stays behind the first incremental")

	checkpoints, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	checkpointer, watcher := connectOrFail(t, dsn), connectOrFail(t, dsn)
	confirmed := slotConfirmed(t, admin, slot)
	lowest := confirmed
	go func() {
		defer close(done)
		for checkpoints.Err() == nil {
			checkpointer.Exec(checkpoints, "CHECKPOINT")
		}
	}()
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		for checkpoints.Err() == nil {
			var lsn string
			if watcher.QueryRow(checkpoints, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&lsn) == nil {
				if pos, err := canonical.ParsePosition(lsn); err == nil {
					lowest = min(lowest, pos)
				}
			}
		}
	}()
	execSQL(t, admin, "INSERT INTO t VALUES (2)")
	out.Reset()
	_, err = c.BackupIncremental(ctx, next, &out)
	stop()
	<-done
	<-watched
	require.NoError(t, err, "the second incremental reads from the old restart_lsn")
	assert.Equal(t, confirmed, lowest, "the slot never stood behind its position while the walsender read up to it")
	assert.Equal(t, []string{"2"}, insertedIDs(t, decodeChanges(t, out.Bytes())))
	moved, _ := restart()
	assert.Greater(t, moved, old, "the slot's restart_lsn moves once the walsender has read past it")
}

// TestStreamEndingBehindTheCatchUpLeavesAResumableSlot: a stream catches
// up through the SQL interface over heartbeats written while its consumer
// was idle (siphon's own, as a stream writes them: the last transaction
// handled and the WAL insert position), the last of them past some 64 MB
// of WAL of a table not published, and acknowledges the last one's
// position; the slot is not moved there meanwhile (a status interval of
// an hour). The walsender that takes over reads from the slot's position,
// and the stream ends while it reads the unpublished WAL, past the first
// heartbeats but short of the last. The consumer resumes from its last
// transaction and gets what follows. Before, the stream confirmed how far
// its walsender had read, a position no heartbeat names, and the resume
// was refused as behind the slot.
func TestStreamEndingBehindTheCatchUpLeavesAResumableSlot(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := siphontest.Start(t, siphontest.WithPrivateServer())
	dsn := srv.NewDatabase(t)
	admin := connectOrFail(t, dsn)
	execSQL(t, admin, "CREATE TABLE t (id int PRIMARY KEY)", "CREATE TABLE unpublished (pad text)")
	logs := &logRecorder{}
	c, slot, start := streamConnAt(t, dsn, siphon.WithTables("t"), siphon.WithStatusInterval(time.Hour), siphon.WithLogger(logs.logger()))
	c.SetCatchUpForTest(siphon.CatchUpForTest{StartAt: 1 << 20})

	execSQL(t, admin, "INSERT INTO t VALUES (1)")
	emitMarker(t, admin, "one")
	_, handled := streamUntil(t, c, start, "one")
	heartbeat := func() canonical.Position {
		return writeHeartbeat(t, admin, "'"+slot+"'", "'"+handled.String()+"'", "pg_current_wal_insert_lsn()")
	}
	var firstEnd canonical.Position
	for range 20 {
		execSQL(t, admin, "INSERT INTO unpublished VALUES ('x')")
		firstEnd = heartbeat()
	}
	execSQL(t, admin, "INSERT INTO unpublished SELECT repeat('x', 900) FROM generate_series(1, 60000)")
	lastEnd := heartbeat()

	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := c.StreamChanges(runCtx, handled, func(canonical.Change) error { return nil })
		done <- err
	}()
	waitFor(t, "the catch-up hands over to the walsender", func() bool { return len(logs.find(slog.LevelInfo, catchUpSwitched)) > 0 })
	// Ended once the walsender has sent what follows the first heartbeats,
	// before it reaches the last: polled without a pause, as decoding the
	// unpublished WAL in between takes it some hundreds of milliseconds.
	sent := func() canonical.Position {
		var lsn *string
		err := admin.QueryRow(ctx, `SELECT r.sent_lsn::text FROM pg_stat_replication r
			JOIN pg_replication_slots s ON s.active_pid = r.pid WHERE s.slot_name = $1`, slot).Scan(&lsn)
		if err != nil || lsn == nil {
			return 0
		}
		pos, err := canonical.ParsePosition(*lsn)
		require.NoError(t, err)
		return pos
	}
	stall := newStallDeadline(waitDeadline)
	at := sent()
	for ; at < firstEnd; at = sent() {
		require.False(t, stall.stalled(), "the walsender did not read past the first heartbeats")
	}
	cancel()
	require.NoError(t, <-done)
	require.Less(t, at, lastEnd, "the stream ended before its walsender reached the heartbeat the catch-up acknowledged")

	execSQL(t, admin, "INSERT INTO t VALUES (2)")
	emitMarker(t, admin, "two")
	changes, _ := streamUntil(t, c, handled, "two")
	assert.Equal(t, []string{"2"}, insertedIDs(t, changes), "the resume from the last transaction handled gets what follows")

	require.NoError(t, c.Close())
	assertNoLeaks(t, dsn, slot)
}
