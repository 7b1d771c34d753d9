package siphon

import (
	"context"
	"sync/atomic"

	"github.com/siphondb/siphon/canonical"
)

// StreamOptions says what one [Conn.StreamChangesWith] does. The zero
// value is [Conn.StreamChanges].
type StreamOptions struct {
	// Durable, when set, is where the consumer reports how far it has made
	// the transactions it received durable, for a consumer that does so
	// after emit returns (a queue that acknowledges asynchronously, a batch
	// written later): the slot is then acknowledged up to what Durable
	// holds, every [WithStatusInterval] and when the stream stops, and no
	// longer when emit returns for an OpCommit. Emit may return at once
	// and the consumer finish in its own time. The call stores the
	// Position it starts from in Durable first, replacing what it held.
	// Nil (the default): a transaction is acknowledged once emit returns
	// nil for its OpCommit.
	Durable *DurablePosition
}

// DurablePosition is how far a consumer has made durable the transactions
// a stream gave it (see [StreamOptions].Durable). The zero value holds no
// Position. It is safe for concurrent use: the consumer sets it from any
// goroutine while the stream reads it.
type DurablePosition struct{ pos atomic.Uint64 }

// Set records that every transaction up to pos is durable: pos is the
// Position of an OpCommit the stream emitted (the transactions before it
// are durable too). It only moves forward: a pos behind the one held is
// ignored. The stream never acknowledges past the last transaction it
// emitted, whatever pos says. A pos inside a transaction is acknowledged
// as it is, and a later resume from that transaction's start is then
// refused as a gap ([*ResumeGapError]): set only OpCommit Positions.
func (d *DurablePosition) Set(pos canonical.Position) {
	for {
		held := d.pos.Load()
		if uint64(pos) <= held || d.pos.CompareAndSwap(held, uint64(pos)) {
			return
		}
	}
}

// Position returns the Position held: the last one Set, or where the
// stream started, or zero.
func (d *DurablePosition) Position() canonical.Position { return canonical.Position(d.pos.Load()) }

// StreamChangesWith is [Conn.StreamChanges] with options. With
// opt.Durable set, the Position it returns is the end of the last
// transaction emitted, which may be past what the consumer made durable:
// a consumer resumes from its own durable Position, and gets again what it
// had not made durable.
func (c *Conn) StreamChangesWith(ctx context.Context, from canonical.Position, opt StreamOptions, emit func(canonical.Change) error) (_ canonical.Position, err error) {
	defer func() { c.countError(ctx, err) }()
	if emit == nil {
		return from, errorf("siphon: stream changes: the emit function: %w", ErrNilArgument)
	}
	release, err := c.claimStream()
	if err != nil {
		return from, errorf("siphon: stream changes: %w", err)
	}
	defer release()
	cfg := streamConfig{from: from}
	if d := opt.Durable; d != nil {
		// Where the stream starts is durable: the consumer has everything
		// before it, or the slot stands there.
		cfg.durable = &d.pos
		cfg.onStart = func(start canonical.Position, _ streamInfo) error {
			d.pos.Store(uint64(start))
			return nil
		}
	}
	res, err := c.stream(ctx, cfg, emit)
	if err == nil {
		err = stopReason(ctx, "stream changes", res.resume)
	}
	return res.resume, err
}
