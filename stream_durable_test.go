package siphon_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/siphondb/siphon"
	"github.com/siphondb/siphon/canonical"
	"github.com/siphondb/siphon/siphontest"
)

// TestStreamChangesWithDurableAcknowledgesWhatTheConsumerMadeDurable: emit
// returns at once for every transaction, and the slot moves only as far
// as the consumer says it made durable (at the stop too), never past the
// last transaction emitted however far it says; a consumer that stops
// resumes from its durable Position and gets again what it had not made
// durable.
func TestStreamChangesWithDurableAcknowledgesWhatTheConsumerMadeDurable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// A server of its own: an idle stream whose consumer made everything
	// durable writes a heartbeat once the server's WAL moves on, and the
	// slot then rightly moves past the last transaction, to it. Other
	// tests' writes on a shared server did so before the last assertion.
	dsn := siphontest.Start(t, siphontest.WithPrivateServer()).NewDatabase(t)
	t.Cleanup(func() { checkNothingLeftRunning(t, dsn) })
	admin := connectOrFail(t, dsn)
	execSQL(t, admin, "CREATE TABLE t (id int PRIMARY KEY)")
	c, slot, start := streamConnAt(t, dsn, siphon.WithStatusInterval(20*time.Millisecond))
	execSQL(t, admin, "INSERT INTO t VALUES (1)", "INSERT INTO t VALUES (2)", "INSERT INTO t VALUES (3)")

	var durable siphon.DurablePosition
	ends := make(chan canonical.Position, 3)
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan error, 1)
	var returned canonical.Position
	go func() {
		var err error
		returned, err = c.StreamChangesWith(runCtx, start, siphon.StreamOptions{Durable: &durable}, func(ch canonical.Change) error {
			if ch.Op == canonical.OpCommit {
				ends <- ch.Position
			}
			return nil
		})
		done <- err
	}()
	first, second, third := <-ends, <-ends, <-ends
	assert.GreaterOrEqual(t, durable.Position(), start, "where the stream starts is durable")

	// Three transactions emitted, none durable: the slot stays.
	statusSent(t, admin, slot)
	assert.Less(t, slotConfirmed(t, admin, slot), first, "the slot moved before anything was durable")

	durable.Set(first)
	waitFor(t, "the slot moves to the first transaction", func() bool { return slotConfirmed(t, admin, slot) == first })
	statusSent(t, admin, slot)
	assert.Equal(t, first, slotConfirmed(t, admin, slot), "the slot went past what was durable")

	// What is durable when the stream stops is acknowledged as it stops.
	durable.Set(second)
	stop()
	require.NoError(t, <-done)
	assert.Equal(t, third, returned, "the end of the last transaction emitted")
	assert.Equal(t, second, slotConfirmed(t, admin, slot), "the final acknowledgement left out what was durable at the stop")

	// Resumed from the second: the one it had not made durable comes again.
	// A consumer that claims more than it received moves the slot no
	// further than the last transaction emitted.
	execSQL(t, admin, "INSERT INTO t VALUES (4)")
	var ids []string
	lastEnd := make(chan canonical.Position, 1)
	runCtx, stop = context.WithCancel(ctx)
	defer stop()
	var again siphon.DurablePosition
	go func() {
		var err error
		_, err = c.StreamChangesWith(runCtx, second, siphon.StreamOptions{Durable: &again}, func(ch canonical.Change) error {
			switch ch.Op {
			case canonical.OpInsert:
				ids = append(ids, text(t, ch.New[0]))
			case canonical.OpCommit:
				if len(ids) == 2 {
					lastEnd <- ch.Position
				}
			}
			return nil
		})
		done <- err
	}()
	last := <-lastEnd
	again.Set(last + 1<<20)
	waitFor(t, "the slot moves to the last transaction", func() bool { return slotConfirmed(t, admin, slot) >= last })
	stop()
	require.NoError(t, <-done)
	assert.Equal(t, []string{"3", "4"}, ids)
	assert.Equal(t, last, slotConfirmed(t, admin, slot), "the slot went past the last transaction emitted")
}

// TestStreamChangesWithNilEmit: a nil emit is refused before anything is
// done, and the durable position is left as it was.
func TestStreamChangesWithNilEmit(t *testing.T) {
	t.Parallel()
	dsn, _ := newDatabase(t)
	c, _, start := streamConnAt(t, dsn)
	var durable siphon.DurablePosition
	durable.Set(start - 1)
	_, err := c.StreamChangesWith(context.Background(), start, siphon.StreamOptions{Durable: &durable}, nil)
	assert.ErrorIs(t, err, siphon.ErrNilArgument)
	assert.Equal(t, start-1, durable.Position())
}

// TestDurablePositionOnlyMovesForward: Set from many goroutines keeps the
// greatest Position.
func TestDurablePositionOnlyMovesForward(t *testing.T) {
	t.Parallel()
	var durable siphon.DurablePosition
	var wg sync.WaitGroup
	for i := range 64 {
		wg.Go(func() { durable.Set(canonical.Position(1000 + i*(i%7))) })
	}
	wg.Wait()
	assert.Equal(t, canonical.Position(1000+62*6), durable.Position())
	durable.Set(5)
	assert.Equal(t, canonical.Position(1000+62*6), durable.Position(), "a Position behind the one held is ignored")
}

// TestStreamChangesWithDurableKeepsTheResumePosition: a resume from behind
// the slot that no heartbeat vouches for is refused as a gap, and the
// durable position stays where the consumer resumed from, not at the
// slot's position past the gap, which a consumer that records it would
// resume from next.
func TestStreamChangesWithDurableKeepsTheResumePosition(t *testing.T) {
	t.Parallel()
	dsn, admin := newDatabase(t)
	execSQL(t, admin, "CREATE TABLE t (id int PRIMARY KEY)")
	c, _, start := streamConnAt(t, dsn)
	pos1, _, _ := streamPastAResumePoint(t, c, admin, start)

	var durable siphon.DurablePosition
	_, err := c.StreamChangesWith(context.Background(), pos1, siphon.StreamOptions{Durable: &durable}, func(canonical.Change) error { return nil })
	var gap *siphon.ResumeGapError
	require.ErrorAs(t, err, &gap)
	assert.Equal(t, pos1, durable.Position(), "the durable position passed the gap")
}

// TestStreamChangesWithDurableHoldsFromAfterASetupError: a call refused
// before its stream started (here the slot was dropped, a gap) still
// stores from in the durable position, replacing what it held: a consumer
// that resumes from it after the error resumes from where it asked, and
// is refused again, rather than from a stale Position or from zero, which
// would start a new slot past the gap and skip its changes silently.
func TestStreamChangesWithDurableHoldsFromAfterASetupError(t *testing.T) {
	t.Parallel()
	dsn, admin := newDatabase(t)
	c, slot, start := streamConnAt(t, dsn)
	execSQL(t, admin, "SELECT pg_drop_replication_slot('"+slot+"')")

	var durable siphon.DurablePosition
	durable.Set(start + 1<<20) // what the consumer's last stream left
	_, err := c.StreamChangesWith(context.Background(), start, siphon.StreamOptions{Durable: &durable}, func(canonical.Change) error { return nil })
	var gap *siphon.ResumeGapError
	require.ErrorAs(t, err, &gap)
	assert.Equal(t, siphon.GapSlotMissing, gap.Reason)
	assert.Equal(t, start, durable.Position(), "the durable position is not where the consumer asked to resume")
}

// statusSent waits until the stream reading slot has sent the server two
// status updates since the call: what the stream acknowledged before the
// call, the server then knows.
func statusSent(t *testing.T, admin *pgx.Conn, slot string) {
	t.Helper()
	replyTime := func() time.Time {
		var at *time.Time
		err := admin.QueryRow(context.Background(), `SELECT r.reply_time FROM pg_stat_replication r
			JOIN pg_replication_slots s ON s.active_pid = r.pid WHERE s.slot_name = $1`, slot).Scan(&at)
		if err != nil || at == nil {
			return time.Time{}
		}
		return *at
	}
	last, changes := replyTime(), 0
	waitFor(t, "two status updates", func() bool {
		if at := replyTime(); !at.Equal(last) {
			last, changes = at, changes+1
		}
		return changes >= 2
	})
}
