package natsjs_test

import (
	"bytes"
	"context"
	"errors"
	"strconv"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/siphondb/siphon/canonical"
	"github.com/siphondb/siphon/natsjs"
)

// consumeUntil runs Consume until it delivers the commit ending at end, and
// returns what it delivered and returned.
func consumeUntil(t *testing.T, s jetstream.Stream, cfg natsjs.ConsumeConfig, end canonical.Position) ([]canonical.Change, canonical.Position) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitDeadline)
	defer cancel()
	var got []canonical.Change
	reached := false
	last, err := natsjs.Consume(ctx, s, cfg, func(ch canonical.Change) error {
		got = append(got, ch)
		if ch.Op == canonical.OpCommit && ch.Position >= end {
			reached = true
			cancel()
		}
		return nil
	})
	require.NoError(t, err)
	require.True(t, reached, "Consume delivers the transaction ending at %v", end)
	return got, last
}

// throughStream is what a slot's change stream becomes once through the
// stream: a truncation of several tables is one per table, and
// non-transactional messages are gone. keep, when set, says which tables'
// changes are kept (schema changes are, all of them).
func throughStream(changes []canonical.Change, keep func(canonical.TableName) bool) []canonical.Change {
	var out []canonical.Change
	for _, ch := range changes {
		switch ch.Op {
		case canonical.OpTruncate:
			for _, name := range ch.Truncated {
				one := ch
				one.Truncated = []canonical.TableName{name}
				if keep == nil || keep(name) {
					out = append(out, one)
				}
			}
		case canonical.OpMessage:
			if ch.Message.Transactional && keep == nil {
				out = append(out, ch)
			}
		case canonical.OpBegin, canonical.OpCommit, canonical.OpDDL:
			out = append(out, ch)
		default:
			if keep == nil || keep(ch.TableName()) {
				out = append(out, ch)
			}
		}
	}
	return out
}

// workKey signs the schema changes publishWork publishes.
var workKey = bytes.Repeat([]byte{0x5a}, 32)

// publishWork publishes workTransactions into a stream with prefix "c",
// its schema changes signed with workKey, and returns it, with the slot's
// changes read directly.
func publishWork(t *testing.T) (jetstream.Stream, []canonical.Change) {
	t.Helper()
	slot, direct := testSlot(t), testSlot(t)
	dsn, admin, _ := newSource(t, workDDL, slot, direct)
	execSQL(t, admin, workTransactions...)
	changes := slotChanges(t, dsn, direct, insertOf("items", "10"))
	srv := startNATS(t)
	nc, js := connectNATS(t, srv.ClientURL())
	s := createStream(t, js, "CONSUME", "c", 1)
	pub, err := natsjs.NewPublisher(nc, natsjs.Config{Stream: "CONSUME", Prefix: "c", Slot: slot, Key: workKey})
	require.NoError(t, err)
	run := runPublisher(t, pub, dsn)
	awaitHeld(t, s, "c", changes[len(changes)-1].Position)
	_, err = run.stop()
	require.NoError(t, err)
	return s, changes
}

// TestConsumeDeliversTheSlotsStream: a consumer started after the
// Publisher replays the stream as the slot's own change stream, every
// transaction whole and in commit order, commit times included.
func TestConsumeDeliversTheSlotsStream(t *testing.T) {
	t.Parallel()
	s, changes := publishWork(t)
	end := changes[len(changes)-1].Position
	got, last := consumeUntil(t, s, natsjs.ConsumeConfig{Prefix: "c", Keys: [][]byte{workKey}}, end)
	assert.Equal(t, throughStream(changes, nil), got)
	assert.Equal(t, end, last, "Consume returns the end of the last transaction delivered")
}

// TestConsumeTables: a consumer of one table gets its changes only (and
// the schema changes), and every transaction's begin and commit, even
// those that did not change it, so it knows where each transaction ends.
func TestConsumeTables(t *testing.T) {
	t.Parallel()
	s, changes := publishWork(t)
	items := canonical.TableName{Schema: "public", Name: "items"}
	cfg := natsjs.ConsumeConfig{Prefix: "c", Keys: [][]byte{workKey}, Tables: []canonical.TableName{items}}
	got, _ := consumeUntil(t, s, cfg, changes[len(changes)-1].Position)
	assert.Equal(t, throughStream(changes, func(n canonical.TableName) bool { return n == items }), got)
	commits, other := 0, 0
	for _, ch := range got {
		switch {
		case ch.Op == canonical.OpCommit:
			commits++
		case ch.Op != canonical.OpBegin && ch.Op != canonical.OpTruncate && ch.Op != canonical.OpDDL && ch.TableName() != items:
			other++
		}
	}
	assert.Equal(t, 7, commits, "every published transaction")
	assert.Zero(t, other, "no change of another table")
}

// TestConsumeAfter: resuming after a transaction's end delivers exactly
// the transactions after it, wherever it falls in the stream.
func TestConsumeAfter(t *testing.T) {
	t.Parallel()
	s, changes := publishWork(t)
	all := throughStream(changes, nil)
	end := all[len(all)-1].Position
	var ends []int // where each transaction ends in all
	for i, ch := range all {
		if ch.Op == canonical.OpCommit {
			ends = append(ends, i)
		}
	}
	for _, i := range ends[:len(ends)-1] {
		got, _ := consumeUntil(t, s, natsjs.ConsumeConfig{Prefix: "c", Keys: [][]byte{workKey}, After: all[i].Position}, end)
		assert.Equal(t, all[i+1:], got, "after %v", all[i].Position)
		// A Position inside the next transaction (a snapshot's, say)
		// delivers the same: that transaction ends after it.
		got, _ = consumeUntil(t, s, natsjs.ConsumeConfig{Prefix: "c", Keys: [][]byte{workKey}, After: all[i].Position + 1}, end)
		assert.Equal(t, all[i+1:], got, "after %v", all[i].Position+1)
	}
}

// TestConsumeStopsAtAForeignMessage: a message no Publisher wrote is a
// *MessageError naming it; an emit error stops Consume and is returned.
func TestConsumeStopsAtAForeignMessage(t *testing.T) {
	t.Parallel()
	srv := startNATS(t)
	_, js := connectNATS(t, srv.ClientURL())
	s := createStream(t, js, "FOREIGN", "f", 1)
	ctx, cancel := context.WithTimeout(context.Background(), waitDeadline)
	defer cancel()
	_, err := js.Publish(ctx, "f.public.t", []byte(`{"t":"commit"}`))
	require.NoError(t, err)
	_, err = natsjs.Consume(ctx, s, natsjs.ConsumeConfig{Prefix: "f"}, func(canonical.Change) error { return nil })
	var me *natsjs.MessageError
	require.ErrorAs(t, err, &me)
	assert.Equal(t, uint64(1), me.Sequence)
	assert.Equal(t, "f.public.t", me.Subject)
	assert.ErrorContains(t, err, "no Siphon-System-Id header")

	ps, _ := publishWork(t)
	stop := errors.New("handler failed")
	_, err = natsjs.Consume(ctx, ps, natsjs.ConsumeConfig{Prefix: "c", Keys: [][]byte{workKey}}, func(canonical.Change) error { return stop })
	assert.ErrorIs(t, err, stop)
}

// TestConsumeRefusesAGapInTheHistory: once the stream's retention removed
// its oldest transactions, resuming after one of those that remain, or
// after the last one removed, works; resuming from before that is a
// *HistoryGapError; a zero After starts at the oldest whole transaction.
func TestConsumeRefusesAGapInTheHistory(t *testing.T) {
	t.Parallel()
	slots, direct := []string{testSlot(t), testSlot(t)}, testSlot(t)
	dsn, admin, _ := newSource(t, workDDL, slots[0], slots[1], direct)
	for _, id := range []string{"1", "2", "3", "4", "5", "6"} {
		execSQL(t, admin, "INSERT INTO items VALUES ("+id+", 'x')")
	}
	changes := slotChanges(t, dsn, direct, insertOf("items", "6"))
	all := throughStream(changes, nil) // six transactions of three changes each
	end := func(tx int) canonical.Position { return all[3*tx-1].Position }

	srv := startNATS(t)
	nc, js := connectNATS(t, srv.ClientURL())
	for i, tt := range []struct {
		keep   int64 // messages the stream keeps: two a transaction
		oldest int   // the oldest transaction it holds whole
	}{
		{keep: 6, oldest: 4},
		{keep: 5, oldest: 5}, // transaction 4 is cut: only its marker is left
	} {
		name := "GAP" + strconv.FormatInt(tt.keep, 10)
		cfg := natsjs.StreamConfig(name, name)
		cfg.MaxMsgs = tt.keep
		s, err := js.CreateStream(context.Background(), cfg)
		require.NoError(t, err)
		pub, err := natsjs.NewPublisher(nc, natsjs.Config{Stream: name, Prefix: name, Slot: slots[i]})
		require.NoError(t, err)
		run := runPublisher(t, pub, dsn)
		awaitHeld(t, s, name, end(6))
		_, err = run.stop()
		require.NoError(t, err)

		got, _ := consumeUntil(t, s, natsjs.ConsumeConfig{Prefix: name}, end(6))
		assert.Equal(t, all[3*(tt.oldest-1):], got, "a zero After: from the oldest whole transaction")
		got, _ = consumeUntil(t, s, natsjs.ConsumeConfig{Prefix: name, After: end(tt.oldest - 1)}, end(6))
		assert.Equal(t, all[3*(tt.oldest-1):], got, "after the last transaction removed")
		_, err = natsjs.Consume(context.Background(), s, natsjs.ConsumeConfig{Prefix: name, After: end(tt.oldest - 2)},
			func(canonical.Change) error { return nil })
		var gap *natsjs.HistoryGapError
		require.ErrorAs(t, err, &gap, "keep %d", tt.keep)
		assert.Equal(t, end(tt.oldest-2), gap.After)
	}
}
