package siphon

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"time"

	"github.com/siphondb/siphon/canonical"
	"github.com/siphondb/siphon/internal/walwire"
)

// heartbeatPrefix is the prefix of siphon's heartbeat messages. They are
// never emitted.
const heartbeatPrefix = "siphon.heartbeat"

// anchorMinAdvance is how far the server's WAL must have moved past the
// acknowledged position before an idle stream writes a heartbeat to advance
// the slot. Below it, the server's own bookkeeping records (running
// transactions, checkpoints) would make heartbeats chase each other
// forever; what it pins is less than a WAL page.
const anchorMinAdvance = 8 << 10

// A heartbeat message (non-transactional, prefix heartbeatPrefix) is what
// lets the slot move past the last transaction while staying verifiable.
// Its content names the slot, the end of the last transaction the stream
// handled when it was written ("last"), and the WAL insert position just
// before the message itself ("at"). When the stream reads it back with
// nothing in flight and "last" still the last transaction's end, no
// published transaction lies between "last" and the message: the stream
// acknowledges "at". A consumer that restarts from "last" (the Position of
// its last OpCommit) finds the slot at "at"; the stream then reads that same
// heartbeat (it starts at "at") and accepts the resume instead of
// reporting a gap.
//
// What a heartbeat's content says is taken only as far as the server's
// own positions bear it out, since any role that may connect to the
// source database can write a message with this prefix
// (pg_logical_emit_message is granted to PUBLIC), and since heartbeats
// need not reach the WAL in the order their "at" was read: a heartbeat
// whose stream had ended, its statement cancelled, may still be written
// by its backend after the next stream's. So a heartbeat is acknowledged
// only when its "at" is at or before the message's own position (what it
// claims is then what the stream read, wherever it came from), and a
// resume is vouched for by the first heartbeat that names the slot's
// position and a "last" at or before the resume; others are passed over
// (see heartbeat).
type heartbeatContent struct {
	Slot string             `json:"slot"`
	Last canonical.Position `json:"last"`
	At   canonical.Position `json:"at"`
}

// writeHeartbeat writes a heartbeat message. pg_current_wal_insert_lsn() is
// evaluated before the message is inserted, so "at" is at or before the
// message's own start.
func (c *Conn) writeHeartbeat(ctx context.Context, last canonical.Position) error {
	_, err := c.pool.Exec(ctx, `SELECT pg_catalog.pg_logical_emit_message(false, $1,
		pg_catalog.json_build_object('slot', $2::text, 'last', $3::text, 'at', pg_catalog.pg_current_wal_insert_lsn()::text)::text)`,
		heartbeatPrefix, c.opts.slot, last.String())
	return err
}

// streamState is the stream loop's state. Only the loop's goroutine uses
// it, except the atomics.
type streamState struct {
	cfg  streamConfig
	emit func(canonical.Change) error
	slot string

	// acked is the acknowledged position, sent by the reader in status
	// updates.
	acked atomic.Uint64
	// lastEnd is the end of the last transaction handled (or the start
	// position); lastEndShared mirrors it for the heartbeat writer.
	lastEnd       canonical.Position
	lastEndShared atomic.Uint64
	// probing asks the reader to request keepalives often.
	probing atomic.Bool

	// startConfirmed is the slot's confirmed position when the stream
	// started. pendingGap is set while a resume from before it is not yet
	// vouched for by the heartbeat that moved the slot there; probeEnd is
	// the WAL insert position by which that heartbeat must have been read.
	startConfirmed canonical.Position
	pendingGap     bool
	probeEnd       canonical.Position

	inTx     bool // between OpBegin and OpCommit
	skipping bool // the open transaction was delivered before from
	// seen is the end of the last thing delivered: a transaction's end or
	// a non-transactional message's position (or the start position). A
	// transaction whose commit starts before it, or a message at or
	// before it, was delivered already: by an earlier session, or by
	// the SQL catch-up when the walsender starts behind where it ended.
	// Within one walsender session everything comes past it.
	seen canonical.Position
	// ddl turns the schema capture's rows into OpDDL changes.
	ddl *schemaChanges

	// stats receives what the stream did, for the Conn's metrics.
	stats *connStats

	serverEnd     canonical.Position // the latest keepalive's WAL end
	lastAnchorEnd canonical.Position // where the last heartbeat read ended
	anchorAsked   time.Time
	reachedBound  bool
	caughtUp      bool // the SQL catch-up read all it was to read
}

func (st *streamState) ackedPos() canonical.Position { return canonical.Position(st.acked.Load()) }

// resumePos is the Position to report to the caller: the end of the last
// transaction handled, or the start (from, or the slot's position for a
// zero from). It is never a heartbeat's position, which may be past it: a
// resume from it is vouched for by that heartbeat, and a consumer that
// records its OpCommit Positions holds the same value.
func (st *streamState) resumePos() canonical.Position { return st.lastEnd }

// loop receives decoded batches from in and handles them in order until
// ctx ends, the bound is reached, the SQL catch-up is over, or an error. It
// hands emptied batches back through free. It also asks for heartbeats
// (through heartbeatRequests, nil for none) when the stream is idle.
func (st *streamState) loop(ctx context.Context, in <-chan []walwire.Item, free chan<- []walwire.Item, heartbeatRequests chan<- struct{}, tickEvery time.Duration) (streamResult, error) {
	st.lastEndShared.Store(uint64(st.lastEnd))
	// What the consumer made durable up to the stop goes into the final
	// acknowledgement.
	defer st.syncDurable()
	tick := time.NewTicker(tickEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return streamResult{}, nil
		case <-tick.C:
			st.syncDurable()
			st.publishStats()
			st.maybeAskHeartbeat(heartbeatRequests, tickEvery)
		case b := <-in:
			for i := range b {
				if ctx.Err() != nil {
					return streamResult{}, nil
				}
				done, err := st.handle(&b[i])
				if err != nil || done {
					return streamResult{reachedBound: st.reachedBound, caughtUp: st.caughtUp}, err
				}
			}
			st.syncDurable()
			st.publishStats()
			clear(b) // drop the rows: emit may keep them, the batch may not
			select {
			case free <- b[:0]:
			default:
			}
		}
	}
}

// handle handles one item; done reports that the bound was reached or
// the SQL catch-up is over.
func (st *streamState) handle(it *walwire.Item) (done bool, err error) {
	switch it.Kind {
	case walwire.KindError:
		return false, it.Err
	case walwire.KindCaughtUp:
		// Everything before WALEnd was read, as a keepalive says; what
		// follows is the walsender's.
		st.caughtUp = true
		if st.cfg.bound != 0 && it.WALEnd >= st.cfg.bound {
			st.reachedBound = true
		}
		return true, nil
	case walwire.KindKeepalive:
		st.serverEnd = max(st.serverEnd, it.WALEnd)
		if st.inTx {
			return false, nil
		}
		if st.pendingGap {
			if it.WALEnd >= st.probeEnd {
				return false, st.gapError()
			}
			return false, nil
		}
		if st.cfg.bound != 0 && it.WALEnd >= st.cfg.bound {
			st.reachedBound = true
			return true, nil
		}
		return false, nil
	}
	ch := &it.Change
	switch ch.Op {
	case canonical.OpBegin:
		st.inTx = true
		st.ddl.begin()
		st.stats.lastReceived.Store(time.Now().UnixNano())
		// A transaction whose commit starts before from ends at or before
		// it: the consumer has it. (PostgreSQL skips these too.) The same
		// holds for one delivered earlier in this stream.
		if ch.Position < st.seen {
			st.skipping = true
			return false, nil
		}
		if st.pendingGap {
			return false, st.gapError()
		}
		if st.cfg.bound != 0 && ch.Position >= st.cfg.bound {
			st.reachedBound = true // commits after the bound: the next incremental's
			return true, nil
		}
	case canonical.OpCommit:
		st.inTx = false
		if st.skipping {
			st.skipping = false
			return false, nil
		}
		if err := st.deliver(ch); err != nil {
			return false, err
		}
		st.lastEnd, st.seen = ch.Position, ch.Position
		st.lastEndShared.Store(uint64(ch.Position))
		if !st.cfg.holdAck && st.cfg.durable == nil && ch.Position > st.ackedPos() {
			st.acked.Store(uint64(ch.Position))
		}
		return false, nil
	case canonical.OpMessage:
		if ch.Message.Prefix == flushPrefix {
			return false, nil // boundPosition's: WAL of its own, nothing to say
		}
		if ch.Message.Prefix == heartbeatPrefix {
			if !ch.Message.Transactional {
				return false, st.heartbeat(ch)
			}
			return false, nil
		}
		if !ch.Message.Transactional {
			switch {
			case st.pendingGap || ch.Position <= st.seen:
				// Before the resume point: handled by an earlier session,
				// or delivered already.
				return false, nil
			case st.cfg.bound != 0 && ch.Position > st.cfg.bound:
				st.reachedBound = true
				return true, nil
			}
			if err := st.deliver(ch); err != nil {
				return false, err
			}
			st.seen = ch.Position
			return false, nil
		}
	}
	if st.skipping {
		return false, nil
	}
	switch {
	case ch.Op == canonical.OpInsert && isCaptureTable(ch.TableName()):
		return false, st.deliverSchemaChange(ch)
	case ch.Op == canonical.OpUpdate || ch.Op == canonical.OpDelete:
		if isCaptureTable(ch.TableName()) {
			return false, nil // the capture deletes what it inserts
		}
	case ch.Op == canonical.OpTruncate:
		if ch.Truncated = withoutCaptureTable(ch.Truncated); len(ch.Truncated) == 0 {
			return false, nil
		}
	}
	return false, st.deliver(ch)
}

// deliverSchemaChange delivers the OpDDL changes a row of the schema
// capture describes.
func (st *streamState) deliverSchemaChange(ins *canonical.Change) error {
	changes, err := st.ddl.changes(ins)
	if err != nil {
		return err
	}
	for i := range changes {
		if err := st.deliver(&changes[i]); err != nil {
			return err
		}
	}
	return nil
}

func (st *streamState) deliver(ch *canonical.Change) error {
	if err := st.emit(*ch); err != nil {
		return &emitError{op: ch.Op, pos: ch.Position, err: err}
	}
	switch ch.Op {
	case canonical.OpCommit:
		st.stats.streamTransactions.Add(1)
		if !ch.CommitTime.IsZero() {
			st.stats.lastCommit.Store(ch.CommitTime.UnixNano())
		}
	case canonical.OpBegin, canonical.OpMessage:
	default:
		st.stats.streamChanges.Add(1)
	}
	return nil
}

// publishStats hands the loop's positions to the Conn's metrics.
func (st *streamState) publishStats() {
	st.stats.serverEnd.Store(uint64(max(st.serverEnd, st.lastEnd)))
	st.stats.acked.Store(st.acked.Load())
}

// heartbeat handles a heartbeat message read back from the stream.
func (st *streamState) heartbeat(ch *canonical.Change) error {
	var hb heartbeatContent
	if json.Unmarshal(ch.Message.Content, &hb) != nil || hb.Slot != st.slot || hb.At > ch.Position {
		// Another slot's, not siphon's, or one that names a position past
		// its own: written by hand, never by a stream.
		return nil
	}
	if st.pendingGap {
		if hb.At == st.startConfirmed && hb.Last <= st.cfg.from {
			// This heartbeat moved the slot to where it stands, and nothing
			// was published between from and it.
			st.pendingGap = false
			st.probing.Store(st.cfg.bound != 0)
		}
		// Any other is passed over: a late one of an earlier stream, or
		// one that does not vouch for from (the slot's own, when the
		// consumer resumes from before what it handled), in which case
		// no heartbeat does and the gap is reported when a transaction
		// comes or the walsender has read up to probeEnd.
		return nil
	}
	st.lastAnchorEnd = max(st.lastAnchorEnd, ch.Position)
	if !st.cfg.holdAck && hb.Last == st.lastEnd && st.settled() && hb.At > st.ackedPos() {
		st.acked.Store(uint64(hb.At))
	}
	return nil
}

// settled reports whether every transaction handled is durable: always,
// unless a durable position says how far the consumer has committed.
func (st *streamState) settled() bool {
	return st.cfg.durable == nil || canonical.Position(st.cfg.durable.Load()) >= st.lastEnd
}

// syncDurable acknowledges what the consumer reports durable, when it
// does, never past the last transaction handled.
func (st *streamState) syncDurable() {
	if st.cfg.durable == nil || st.cfg.holdAck {
		return
	}
	if d := min(canonical.Position(st.cfg.durable.Load()), st.lastEnd); d > st.ackedPos() {
		st.acked.Store(uint64(d))
	}
}

// maybeAskHeartbeat asks for a heartbeat when the stream is idle and the
// server's WAL moved on: the slot can then advance without a published
// transaction.
func (st *streamState) maybeAskHeartbeat(requests chan<- struct{}, tickEvery time.Duration) {
	if st.cfg.holdAck || st.pendingGap || st.inTx || time.Since(st.anchorAsked) < 2*tickEvery {
		return
	}
	if st.serverEnd < max(st.ackedPos(), st.lastAnchorEnd)+anchorMinAdvance {
		return
	}
	select {
	case requests <- struct{}{}:
		st.anchorAsked = time.Now()
	default:
	}
}

func (st *streamState) gapError() error {
	return &ResumeGapError{Slot: st.slot, Requested: st.cfg.from, Confirmed: st.startConfirmed, Reason: GapBehindSlot}
}
