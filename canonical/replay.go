package canonical

import (
	"context"
	"errors"
	"fmt"
	"io"
)

// ErrReplayGap is returned (wrapped) by [Replay] when from is before the
// start of the recording: the changes between from and the start are not
// in it, and replaying the rest as if they were would lose them silently,
// as StreamChanges refuses to (its ResumeGapError).
var ErrReplayGap = errors.New("from is before the recording's start")

// Replay reads a recorded stream from r and delivers it to emit exactly as
// StreamChanges would have, so a handler can be tested with no server,
// deterministically: each transaction as [OpBegin], its changes, then
// [OpCommit], each with the Position, XID and CommitTime recorded and
// Columns set; non-transactional messages between transactions. It reads
// recordings of kind [KindChanges] (a [Recorder]'s) and [KindIncremental]
// (BackupIncremental's), and snapshots ([KindSnapshot], EmitCanonical's),
// which it delivers as [SnapshotChanges] does: one transaction that commits
// at the snapshot's Position.
//
// from works as it does for StreamChanges: a transaction whose commit ends
// at or before from is skipped (for a recording made by siphon, one whose
// begin is before from), and so is a snapshot at or before from; zero
// replays everything. A from before the start of a change recording is an
// error wrapping [ErrReplayGap]. So resume logic is tested by replaying
// again from the Position the first replay returned.
//
// Replay returns the Position to resume from: the end of the last
// transaction whose OpCommit emit returned nil (while there is none, from,
// or for a zero from the start of a change recording) and, once the
// recording is replayed to its end, the recording's end Position (from
// when that is later). An error of emit stops the replay and is returned
// wrapped, naming the change's Op and Position. As with StreamChanges, ctx
// cancellation is a normal stop: Replay returns the Position and nil; a
// ctx past its deadline returns the Position and an error wrapping
// [context.DeadlineExceeded]. Code written against StreamChanges' shape
// takes a replay in its place through a closure:
//
//	stream := func(ctx context.Context, from canonical.Position, emit func(canonical.Change) error) (canonical.Position, error) {
//		return canonical.Replay(ctx, bytes.NewReader(recording), from, emit)
//	}
//
// The recording is checked as it is read (see [Decoder]): a damaged one is
// an error ([*DecodeError]) at the commit of the damaged transaction at the
// latest, before its OpCommit is delivered, so a handler that makes a
// transaction's effect durable at OpCommit never keeps a damaged one. A
// recording written without checksums (by hand) is replayed as it is. To
// edit a checked recording by hand, drop its header's "checksum" member and
// every "sum" member; or better, make the edge case with a [Recorder] fed
// hand-made changes.
func Replay(ctx context.Context, r io.Reader, from Position, emit func(Change) error) (Position, error) {
	dec := NewDecoder(r)
	h, err := dec.Header()
	if err != nil {
		return from, err
	}
	rp := &replay{emit: emit, from: from, resume: from}
	switch {
	case h.Kind == KindSnapshot:
		// Its Start is where it ends: the resume Position once it is all
		// delivered, not before.
		if from == 0 || h.Start > from {
			rp.snapshot = NewSnapshotChanges(h.Start, emit)
		}
	case from == 0:
		rp.resume = h.Start
	case from < h.Start:
		return from, fmt.Errorf("canonical: replay from %v: %w (%v): the changes in between are not in it", from, ErrReplayGap, h.Start)
	}
	for {
		if ctx.Err() != nil {
			return rp.resume, stopped(ctx, rp.resume)
		}
		rec, err := dec.Next()
		switch {
		case err == io.EOF:
			return max(rp.resume, rp.end), nil
		case err != nil:
			return rp.resume, err
		}
		if err := rp.record(rec); err != nil {
			return rp.resume, fmt.Errorf("canonical: replay: %w", err)
		}
	}
}

// replay is the state of one [Replay].
type replay struct {
	emit     func(Change) error
	from     Position
	resume   Position
	end      Position
	skipping bool             // the transaction in progress ends at or before from
	snapshot *SnapshotChanges // the snapshot being delivered; nil when skipped
}

// record delivers what one record holds.
func (rp *replay) record(rec Record) error {
	switch rec.Type {
	case RecordEnd:
		rp.end = rec.Position
		if rp.snapshot != nil {
			if err := rp.snapshot.commit(); err != nil {
				return err
			}
			rp.resume = rp.snapshot.at
		}
	case RecordRow:
		if rp.snapshot != nil {
			return rp.snapshot.row(rec.Table, rec.Row)
		}
	case RecordChange:
		return rp.change(rec.Change)
	}
	return nil
}

// change delivers a change unless it is one from already has.
func (rp *replay) change(ch *Change) error {
	switch ch.Op {
	case OpBegin:
		// A transaction whose commit starts before from ends at or before
		// it (as StreamChanges decides).
		rp.skipping = ch.Position < rp.from
	case OpMessage:
		if !ch.Message.Transactional && ch.Position <= rp.from {
			return nil
		}
	}
	if rp.skipping {
		rp.skipping = ch.Op != OpCommit
		return nil
	}
	if err := rp.emit(*ch); err != nil {
		return emitError(*ch, err)
	}
	if ch.Op == OpCommit {
		rp.resume = ch.Position
	}
	return nil
}

// stopped is how a replay stopped by ctx ends: a cancelled ctx is the normal
// stop (nil), a ctx past its deadline an error wrapping
// context.DeadlineExceeded.
func stopped(ctx context.Context, resume Position) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("canonical: replay: stopped at ctx's deadline (resume from %v): %w", resume, context.DeadlineExceeded)
	}
	return nil
}
