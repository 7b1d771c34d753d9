package natsjs

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/siphondb/siphon"
	"github.com/siphondb/siphon/canonical"
)

// acks awaits JetStream's acknowledgements of an attempt's messages in
// the order they were published, in a goroutine of its own (run), so that
// the attempt publishes on without waiting for them, except to keep what
// is unacknowledged within Config.MaxPending and MaxPendingBytes
// (reserve). Once every message of a transaction is stored, the
// transaction is durable: the stream acknowledges the slot up to it
// (siphon.StreamOptions.Durable), never earlier.
//
// The first failure (an error, a timeout, a message stored elsewhere than
// expected, a duplicate that is not the message) is kept and stops the
// attempt's stream (stop). The messages
// still in flight are awaited all the same, stored or not, so that the
// next attempt reads a stream that no longer changes under it.
type acks struct {
	stream string // the JetStream stream's name
	// held reads the stream's messages, to compare a duplicate with ours,
	// waiting at most ackWait.
	held     heldMessages
	ackWait  time.Duration
	maxCount int
	maxBytes int
	stop     context.CancelCauseFunc
	durable  siphon.DurablePosition
	queue    chan pendingMsg
	freed    chan struct{} // holds a token when the window shrank
	done     chan struct{} // closed when run returns
	closing  sync.Once     // closes queue

	mu           sync.Mutex
	count, bytes int // the window: messages published and not yet acknowledged
	// err is the first failure.
	err error
	// last is the end of the last transaction stored; published counts
	// the messages stored.
	last      canonical.Position
	published int
}

// pendingMsg is a message waiting for its acknowledgement or, with a nil
// fut, the end of a transaction whose commit marker the stream held
// already.
type pendingMsg struct {
	fut     jetstream.PubAckFuture
	seq     uint64 // where it must be stored
	size    int
	subject string
	// end is the end of the transaction the message completes (its commit
	// marker), or zero.
	end canonical.Position
}

// heldMessages reads a stream's messages by sequence: a jetstream.Stream.
type heldMessages interface {
	GetMsg(ctx context.Context, seq uint64, opts ...jetstream.GetMsgOpt) (*jetstream.RawStreamMsg, error)
}

func newAcks(cfg *Config, held heldMessages, stop context.CancelCauseFunc) *acks {
	return &acks{
		stream: cfg.Stream, held: held, ackWait: cfg.AckWait,
		maxCount: cfg.MaxPending, maxBytes: cfg.MaxPendingBytes, stop: stop,
		// The window bounds the messages in the queue; a transaction whose
		// marker the stream held takes one place more, once per attempt.
		queue: make(chan pendingMsg, cfg.MaxPending+1),
		freed: make(chan struct{}, 1),
		done:  make(chan struct{}),
	}
}

// reserve waits until a message of size bytes fits in the window, then
// counts it in. A message alone in the window always fits. It returns
// the cause when ctx (the attempt's stream) has ended or ends first: no
// message is published after a failure stopped the stream.
func (k *acks) reserve(ctx context.Context, size int) error {
	for {
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		k.mu.Lock()
		if k.count == 0 || k.count < k.maxCount && k.bytes+size <= k.maxBytes {
			k.count++
			k.bytes += size
			k.mu.Unlock()
			return nil
		}
		k.mu.Unlock()
		select {
		case <-k.freed:
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
}

// add queues m, published after everything queued before it (or marking
// a transaction's end). The window keeps a place for it in the queue, so
// a message that was published is always queued, and awaited, even when
// ctx has ended since; add waits, and returns ctx's cause when it ends,
// only if that place were not there.
func (k *acks) add(ctx context.Context, m pendingMsg) error {
	select {
	case k.queue <- m:
		return nil
	default:
	}
	select {
	case k.queue <- m:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// run awaits the queued messages in order until the queue is closed and
// drained, or ctx (the attempt's) ends.
func (k *acks) run(ctx context.Context) {
	defer close(k.done)
	for {
		var m pendingMsg
		select {
		case next, ok := <-k.queue:
			if !ok {
				return
			}
			m = next
		case <-ctx.Done():
			return
		}
		if m.fut == nil {
			k.stored(m)
			continue
		}
		select {
		case ack := <-m.fut.Ok():
			if err := k.check(ctx, m, ack); err != nil {
				k.fail(m, err)
			} else {
				k.stored(m)
			}
		case err := <-m.fut.Err():
			k.fail(m, err)
		case <-ctx.Done():
			return
		}
		k.release(m.size)
	}
}

// check returns why ack does not say that m is stored where the attempt
// expects it, or nil.
//
// A duplicate (a message with m's ID the stream held already) at the
// expected sequence is m itself when its content is m's: nats.go sent it
// again after a "no responders" and the first one got there. But the ID
// names only the transaction and the message's first change, and a
// message of another process that stopped with it in flight may carry a
// different cut of the transaction (its MaxChangesPerMessage or the
// server's largest message were not the same) and reach the stream after
// this attempt read it. Taking it for m would make the slot move past
// changes the stream does not hold, so the stored message is read and
// compared; a failure makes the next attempt resume from what it holds.
func (k *acks) check(ctx context.Context, m pendingMsg, ack *jetstream.PubAck) error {
	if ack.Stream != k.stream || ack.Sequence != m.seq {
		return fmt.Errorf("stored in stream %q at sequence %d, not %q at %d (duplicate: %t)",
			ack.Stream, ack.Sequence, k.stream, m.seq, ack.Duplicate)
	}
	if !ack.Duplicate {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, k.ackWait)
	defer cancel()
	held, err := k.held.GetMsg(ctx, m.seq)
	if err != nil {
		return fmt.Errorf("read the message stored at sequence %d, which JetStream took for this one: %w", m.seq, err)
	}
	if diff := differences(m.fut.Msg(), held); diff != "" {
		return fmt.Errorf("the stream holds another message with this ID at sequence %d (%s): a cut of the transaction other than this attempt's", m.seq, diff)
	}
	return nil
}

// differences describes how held differs from ours in what a consumer
// reads of it: its subject, the message ID and siphon's headers, its
// data. It is empty when they are the same.
func differences(ours *nats.Msg, held *jetstream.RawStreamMsg) string {
	if held.Subject != ours.Subject {
		return fmt.Sprintf("on subject %s, not %s", held.Subject, ours.Subject)
	}
	for _, h := range []nats.Header{ours.Header, held.Header} {
		for key := range h {
			if key != nats.MsgIdHdr && !strings.HasPrefix(key, headerPrefix) {
				continue
			}
			if v, w := held.Header.Get(key), ours.Header.Get(key); v != w {
				return fmt.Sprintf("header %s %q, not %q", key, v, w)
			}
		}
	}
	if !bytes.Equal(held.Data, ours.Data) {
		return fmt.Sprintf("%d bytes of other data, not these %d", len(held.Data), len(ours.Data))
	}
	return ""
}

// stored records that m is in the stream, and with it, when it is a commit
// marker, its whole transaction: unless something before it failed.
func (k *acks) stored(m pendingMsg) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.err != nil {
		return
	}
	if m.fut != nil {
		k.published++
	}
	if m.end != 0 {
		k.last = m.end
		k.durable.Set(m.end)
	}
}

// fail keeps the first failure and stops the attempt's stream.
func (k *acks) fail(m pendingMsg, err error) {
	perr := &publishError{op: fmt.Sprintf("publish %s (%s)", m.subject, m.fut.Msg().Header.Get(nats.MsgIdHdr)), err: err}
	k.mu.Lock()
	if k.err == nil {
		k.err = perr
	}
	k.mu.Unlock()
	k.stop(perr)
}

// release takes an acknowledged (or failed) message of size bytes out of
// the window.
func (k *acks) release(size int) {
	k.mu.Lock()
	k.count--
	k.bytes -= size
	k.mu.Unlock()
	select {
	case k.freed <- struct{}{}:
	default:
	}
}

// finish ends the queue and waits until run returns: every message
// queued is settled, or the attempt's ctx ended. It returns the end of the
// last transaction stored, the messages stored and the first failure. It
// may be called again.
func (k *acks) finish() (last canonical.Position, published int, err error) {
	k.closing.Do(func() { close(k.queue) })
	<-k.done
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.last, k.published, k.err
}
