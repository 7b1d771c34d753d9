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
	// holds, after each batch of changes the stream reads, every
	// [WithStatusInterval] and when the stream stops, and no longer when
	// emit returns for an OpCommit. Emit may return at once and the
	// consumer finish in its own time. What becomes durable after the call
	// returns is acknowledged by the next call. The call stores from in
	// Durable before it sets the stream up, replacing what it held, and
	// for a zero from the slot's position once the stream starts. So after
	// any error but [ErrNilArgument] and [ErrAlreadyStreaming], which
	// leave Durable as it was, even one before streaming started (a
	// [*ResumeGapError], a lost connection), Durable holds a Position to
	// resume from, never one past a gap. One DurablePosition serves one
	// stream at a time: Positions name no slot.
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
// Position of an OpCommit the stream emitted, and the transactions before
// it are durable too, so a consumer that finishes transactions out of
// order sets only the end of the last one of an unbroken run. It only
// moves forward: a pos behind the one held is ignored. The stream never
// acknowledges past the last transaction it emitted, whatever pos says.
// A pos inside a transaction is acknowledged as it is, and a later resume
// from the end of the transaction before it is then refused as a gap
// ([*ResumeGapError]): set only OpCommit Positions.
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
// opt.Durable set, three of StreamChanges' rules read differently:
//   - the slot is acknowledged to what Durable holds, never further than
//     the last transaction emitted, instead of to each OpCommit emit
//     returned nil for;
//   - the Position returned is still the end of the last transaction
//     emitted, and may be past what the consumer made durable, and past
//     the slot's confirmed position: a consumer resumes from its own
//     durable Position (Durable's, when the call returns), and gets again
//     what it had not made durable;
//   - a heartbeat moves an idle slot on only once Durable has reached the
//     last transaction emitted: a consumer that never sets Durable holds
//     the slot's WAL.
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
		// Where the consumer resumes from is durable: it has everything
		// before it. Stored before the setup, whose failures return before
		// any onStart, so that a consumer resuming from Durable after one
		// resumes from here; and not the slot's position when from is
		// behind it, since a resume that turns out to be a gap must not
		// leave the consumer a Position past it. A zero from starts where
		// the slot stands, which is then durable.
		cfg.durable = &d.pos
		d.pos.Store(uint64(from))
		if from.IsZero() {
			cfg.onStart = func(start canonical.Position, _ streamInfo) error {
				d.pos.Store(uint64(start))
				return nil
			}
		}
	}
	res, err := c.stream(ctx, cfg, emit)
	if err == nil {
		err = stopReason(ctx, "stream changes", res.resume)
	}
	return res.resume, err
}
