package natsjs

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/siphondb/siphon/canonical"
)

// future is a PubAckFuture the test answers by hand.
type future struct {
	ok  chan *jetstream.PubAck
	err chan error
	msg *nats.Msg
}

func newFuture(id string) *future {
	return &future{ok: make(chan *jetstream.PubAck, 1), err: make(chan error, 1),
		msg: &nats.Msg{Header: nats.Header{nats.MsgIdHdr: []string{id}}}}
}

func (f *future) Ok() <-chan *jetstream.PubAck { return f.ok }
func (f *future) Err() <-chan error            { return f.err }
func (f *future) Msg() *nats.Msg               { return f.msg }

func (f *future) stored(stream string, seq uint64) {
	f.ok <- &jetstream.PubAck{Stream: stream, Sequence: seq}
}

// startAcks returns acks for stream S with room for maxCount messages and
// maxBytes, running until the test ends, and the context its failures
// stop.
func startAcks(t *testing.T, maxCount, maxBytes int) (*acks, context.Context) {
	return startAcksOn(t, &Config{Stream: "S", MaxPending: maxCount, MaxPendingBytes: maxBytes}, nil)
}

// startAcksOn returns acks for cfg's stream, which held reads, running
// until the test ends, and the context its failures stop.
func startAcksOn(t *testing.T, cfg *Config, held heldMessages) (*acks, context.Context) {
	ctx, cancel := context.WithCancel(context.Background())
	streamCtx, stop := context.WithCancelCause(ctx)
	k := newAcks(cfg, held, stop)
	go k.run(ctx)
	t.Cleanup(func() {
		cancel()
		<-k.done
	})
	return k, streamCtx
}

// queue reserves room for a message of size bytes stored at seq, ending
// the transaction at end when end is nonzero, and queues it.
func queue(t *testing.T, ctx context.Context, k *acks, seq uint64, size int, end canonical.Position) *future {
	t.Helper()
	f := newFuture("m" + canonical.Position(seq).String())
	require.NoError(t, k.reserve(ctx, size))
	require.NoError(t, k.add(ctx, pendingMsg{fut: f, seq: seq, size: size, subject: "s", end: end}))
	return f
}

// await waits until cond holds, for at most a minute: only a hang takes
// that long.
func await(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within a minute", what)
		}
	}
}

// TestAcksMakeATransactionDurableInOrder: a transaction is durable once
// its marker (or the end of a transaction whose marker the stream held)
// and every message before it are stored; a marker stored before a change
// of its transaction that then fails makes nothing durable; after a
// failure the attempt's stream is stopped and what was in flight is still
// awaited.
func TestAcksMakeATransactionDurableInOrder(t *testing.T) {
	t.Parallel()
	k, streamCtx := startAcks(t, 16, 1<<20)
	durable := func() canonical.Position { return k.durable.Position() }
	change1, marker1 := queue(t, streamCtx, k, 1, 10, 0), queue(t, streamCtx, k, 2, 10, 0x100)
	require.NoError(t, k.add(streamCtx, pendingMsg{end: 0x180})) // a marker the stream held
	change2, marker2 := queue(t, streamCtx, k, 3, 10, 0), queue(t, streamCtx, k, 4, 10, 0x200)
	change3, marker3 := queue(t, streamCtx, k, 5, 10, 0), queue(t, streamCtx, k, 6, 10, 0x300)

	marker1.stored("S", 2)
	change1.stored("S", 1)
	await(t, "the first two transactions are durable", func() bool { return durable() == 0x180 })

	marker2.stored("S", 4) // before the change of its transaction, which fails
	change2.err <- errors.New("no responders")
	marker3.stored("S", 6)
	change3.stored("S", 5)
	last, published, err := k.finish()
	var pe *publishError
	require.ErrorAs(t, err, &pe)
	assert.Contains(t, err.Error(), "no responders")
	assert.ErrorIs(t, context.Cause(streamCtx), err, "the failure stops the stream")
	assert.Equal(t, canonical.Position(0x180), last)
	assert.Equal(t, 2, published)
	assert.Equal(t, canonical.Position(0x180), durable(), "a transaction with a failed message, or one after it, made durable")
}

// TestAcksRefuseAMessageStoredElsewhere: a message stored at another
// sequence (or in another stream) than expected is a failure.
func TestAcksRefuseAMessageStoredElsewhere(t *testing.T) {
	t.Parallel()
	for name, store := range map[string]func(*future){
		"another sequence": func(f *future) { f.stored("S", 7) },
		"another stream":   func(f *future) { f.stored("T", 1) },
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			k, streamCtx := startAcks(t, 16, 1<<20)
			store(queue(t, streamCtx, k, 1, 10, 0x100))
			_, _, err := k.finish()
			var pe *publishError
			require.ErrorAs(t, err, &pe)
			assert.Zero(t, k.durable.Position())
		})
	}
}

// TestAcksWindow: reserve waits while the window holds its most messages
// or bytes, lets a message larger than the byte limit go alone, and gives
// up when the attempt's stream ends.
func TestAcksWindow(t *testing.T) {
	t.Parallel()
	k, streamCtx := startAcks(t, 2, 100)
	first := queue(t, streamCtx, k, 1, 60, 0)
	second := queue(t, streamCtx, k, 2, 30, 0)

	var firstStored atomic.Bool
	reserved := make(chan error, 1)
	go func() {
		err := k.reserve(streamCtx, 10)
		if err == nil && !firstStored.Load() {
			err = errors.New("a third message fit in a window of two")
		}
		reserved <- err
	}()
	firstStored.Store(true)
	first.stored("S", 1)
	require.NoError(t, <-reserved, "room once the oldest is stored")
	require.NoError(t, k.add(streamCtx, pendingMsg{fut: newFuture("m3"), seq: 3, size: 10, subject: "s"}))

	second.stored("S", 2)
	go func() { reserved <- k.reserve(streamCtx, 95) }() // 10 + 95 > 100: waits for the third
	k.stop(errors.New("the stream stopped"))
	assert.EqualError(t, <-reserved, "the stream stopped", "95 bytes fit beside 10 within 100, or the wait outlived the stream")

	alone, stop := startAcks(t, 2, 100)
	require.NoError(t, alone.reserve(stop, 500), "a message larger than the byte limit goes alone")
}

// TestAcksAfterAStop: once a failure stopped the attempt's stream,
// reserve refuses a message even with room in the window, so nothing more
// is published; and the messages published before the stop was noticed
// are still queued, so that finish awaits them and none is left in flight
// into the next attempt.
func TestAcksAfterAStop(t *testing.T) {
	t.Parallel()
	k, streamCtx := startAcks(t, 16, 1<<20)
	k.stop(errors.New("a failure"))
	assert.EqualError(t, k.reserve(streamCtx, 10), "a failure", "a message was let into the window after the stop")

	var late []*future
	for seq := uint64(1); seq <= 16; seq++ { // a queue that picked the stop at random would drop one of 16 nearly always
		f := newFuture("late" + canonical.Position(seq).String())
		require.NoError(t, k.add(streamCtx, pendingMsg{fut: f, seq: seq, size: 10, subject: "s", end: canonical.Position(seq)}),
			"a published message was not queued")
		late = append(late, f)
	}
	for i, f := range late {
		f.stored("S", uint64(i+1))
	}
	_, published, err := k.finish()
	require.NoError(t, err)
	assert.Equal(t, 16, published, "finish did not await every message published")
}

// TestAcksCompareADuplicateWithTheStoredMessage: a clustered JetStream
// answers a message whose ID it holds already as a duplicate, at the
// sequence it holds it under, before it checks the expected last sequence
// (nats-server's checkMsgHeadersPreClusteredProposal). At the expected
// sequence that is the message itself when what the stream holds is the
// same (the message was sent twice). A message of another process with
// the same ID and another cut of the transaction (five changes where this
// one has three), or other data, is not: taking it for this one would
// make the slot move past changes the stream does not hold.
func TestAcksCompareADuplicateWithTheStoredMessage(t *testing.T) {
	f := newResumeFixture(t)
	msg := func(changes int, data string) *nats.Msg {
		h := msgHeader{systemID: resumeSystemID, slot: "s", xid: 7, commit: 0x700, changes: changes}
		txh := newTxHeader(&h)
		return &nats.Msg{Subject: TableSubject("r", canonical.TableName{Schema: "public", Name: "items"}),
			Data: []byte(data), Header: txh.header(&h, false, 0)}
	}
	ack, err := f.p.js.PublishMsg(context.Background(), msg(5, "changes 0 to 4"))
	require.NoError(t, err)
	require.Equal(t, uint64(1), ack.Sequence)

	for _, tc := range []struct {
		name    string
		ours    *nats.Msg
		problem string // in the failure; none when empty
	}{
		{"the same message", msg(5, "changes 0 to 4"), ""},
		{"another cut", msg(3, "changes 0 to 2"), `header Siphon-Changes "5", not "3"`},
		{"the same cut, other data", msg(5, "changes 0 to 4, other values"), "14 bytes of other data, not these 28"},
		{"another subject", func() *nats.Msg { m := msg(5, "changes 0 to 4"); m.Subject = "r.public.other"; return m }(), "on subject r.public.items"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k, streamCtx := startAcksOn(t, &f.p.cfg, f.s)
			fut := newFuture("")
			fut.msg = tc.ours
			require.NoError(t, k.reserve(streamCtx, 100))
			require.NoError(t, k.add(streamCtx, pendingMsg{fut: fut, seq: 1, size: 100, subject: tc.ours.Subject}))
			end := canonical.Position(0x780)
			require.NoError(t, k.add(streamCtx, pendingMsg{end: end}))
			fut.ok <- &jetstream.PubAck{Stream: "RESUME", Sequence: 1, Duplicate: true}
			_, _, err = k.finish()
			if tc.problem == "" {
				require.NoError(t, err)
				assert.Equal(t, end, k.durable.Position())
				return
			}
			var pe *publishError
			require.ErrorAs(t, err, &pe, "a failure the Publisher starts over from")
			assert.ErrorContains(t, err, tc.problem)
			assert.ErrorContains(t, err, "another message with this ID at sequence 1")
			assert.Zero(t, k.durable.Position(), "the transaction made durable on another message's acknowledgement")
		})
	}
}
