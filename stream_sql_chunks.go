package siphon

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgerrcode"

	"github.com/siphondb/siphon/canonical"
	"github.com/siphondb/siphon/internal/pgerr"
	"github.com/siphondb/siphon/internal/pgoutput"
	"github.com/siphondb/siphon/internal/walwire"
)

// The catch-up's chunks: how they are cut (catchUpPlan), read by the
// workers, and delivered to the stream loop in order (catchUpDelivery).

// peekQuery reads a chunk: the pgoutput messages of the records of the
// copy $1 from its confirmed position up to $2, with pgoutput's options
// $3 (name, value, ...).
const peekQuery = `SELECT data FROM pg_catalog.pg_logical_slot_peek_binary_changes($1, $2::text::pg_lsn, NULL, VARIADIC $3::text[])`

// flushPoll is how often the plan looks again while the server has not
// flushed any WAL past the next chunk's start: with synchronous_commit
// off, the WAL writer flushes what was committed within a few
// wal_writer_delay (200 ms by default).
const flushPoll = 10 * time.Millisecond

// SQLSTATEs of a chunk the server could not materialize.
const (
	codeDiskFull    = "53100"
	codeOutOfMemory = "53200"
)

// catchUpChunk is one chunk: read the records that start in [start, end),
// or with final, none: the catch-up ends at start.
type catchUpChunk struct {
	start, end canonical.Position
	final      bool
	err        error // planning failed: deliver it in turn
	// prev is closed once the chunk before is delivered, done once this
	// one is.
	prev <-chan struct{}
	done chan struct{}
}

// catchUpPlan cuts the WAL into chunks, one after another, as workers ask
// for them: where a chunk ends decides where the next starts.
type catchUpPlan struct {
	set         catchUpSettings
	goal, bound canonical.Position
	blockSize   int64

	mu     sync.Mutex
	next   canonical.Position // the next chunk's start
	last   chan struct{}      // done of the last chunk handed out
	ended  bool
	chunks int
	left   int64  // WAL left unread at the final chunk
	reason string // why the catch-up ended
}

// take hands the next chunk to w, or nil when there is none.
func (p *catchUpPlan) take(ctx context.Context, w *catchUpWorker) *catchUpChunk {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ended {
		return nil
	}
	ch := &catchUpChunk{start: p.next, prev: p.last, done: make(chan struct{})}
	p.last = ch.done
	end, final, err := p.cut(ctx, w, ch.start)
	switch {
	case err != nil:
		ch.err, p.ended = err, true
	case final:
		ch.final, p.ended = true, true
	default:
		ch.end, p.next = end, end
		p.chunks++
	}
	return ch
}

// stop ends the plan: no chunk is handed out after those already are.
func (p *catchUpPlan) stop(reason string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.ended, p.reason = true, reason
}

// chunkRefusedError: the server could not read a chunk for lack of a
// resource (temp_file_limit for the result it materializes, disk,
// memory), before any of it was delivered.
type chunkRefusedError struct{ err error }

func (e *chunkRefusedError) Error() string { return e.err.Error() }

// outcome describes how far the catch-up got, for the log.
func (p *catchUpPlan) outcome() []any {
	p.mu.Lock()
	defer p.mu.Unlock()
	return []any{"reason", p.reason, "reached", p.next, "backlog_bytes", p.left, "chunks", p.chunks}
}

// cut decides the chunk that starts at start, to be read from w's copy: its
// end, or final when the catch-up ends there.
func (p *catchUpPlan) cut(ctx context.Context, w *catchUpWorker, start canonical.Position) (canonical.Position, bool, error) {
	for {
		restart, flush, err := w.positions(ctx)
		if err != nil {
			return 0, false, err
		}
		redecode := int64(start - min(start, restart))
		p.left = int64(flush - min(flush, start))
		switch {
		case p.bound != 0 && start >= p.bound:
			p.reason = "reached the bound"
			return 0, true, nil
		case p.bound == 0 && start >= p.goal && p.left < p.set.switchAt:
			p.reason = "caught up"
			return 0, true, nil
		case p.set.redecodeRatio > 0 && redecode*p.set.redecodeRatio > p.set.maxChunk:
			p.reason = fmt.Sprintf("the restart position of the slot's copy, %v, is too far back (%d bytes) to decode it again for every chunk (a long transaction holds it back)", restart, redecode)
			return 0, true, nil
		}
		span := min(max(p.set.leastSpan(p.left), redecode*p.set.redecodeRatio), p.set.maxChunk)
		limit := flush
		if p.bound != 0 {
			limit = min(limit, p.bound)
		}
		// flush and the bound are ends of records or page boundaries: only
		// an end of our choosing may fall into a page header.
		end := limit
		if int64(limit-start) > span {
			end = chunkEnd(start+canonical.Position(span), p.blockSize)
		}
		if end > start {
			return end, false, nil
		}
		select {
		case <-ctx.Done():
			return 0, false, context.Cause(ctx)
		case <-time.After(flushPoll):
		}
	}
}

// leastSpan is the least WAL a chunk spans when left is unread.
func (s catchUpSettings) leastSpan(left int64) int64 {
	if s.leftShare <= 0 {
		return s.minChunk
	}
	return min(max(s.minChunk, left/s.leftShare), max(s.minChunk, s.fullChunk))
}

// chunkEnd moves an end that falls into a page's header, (page, page+40],
// to the page's start. A record that starts right after the header is
// not read by a chunk that ends at the page's start; one that ends inside
// the header would read it (the record before it ends before the end), and
// so would the next chunk, which skips only what starts before its start.
func chunkEnd(end canonical.Position, blockSize int64) canonical.Position {
	const longHeader = 40 // MAXALIGNed XLogLongPageHeaderData; the short one is 24
	if off := int64(end) % blockSize; blockSize > 0 && off > 0 && off <= longHeader {
		return end - canonical.Position(off)
	}
	return end
}

// catchUpDelivery is the way from the workers to the stream loop.
type catchUpDelivery struct {
	out     chan []walwire.Item
	free    chan []walwire.Item
	stop    chan struct{} // closed when the loop is done
	options []string      // pgoutput's options, name and value in turn
}

// wait waits for ch's turn (the chunk before delivered); false when the
// loop is done.
func (d *catchUpDelivery) wait(ch *catchUpChunk) bool {
	select {
	case <-ch.prev:
		return true
	case <-d.stop:
		return false
	}
}

// send hands b to the loop in ch's turn; false when the loop is done.
func (d *catchUpDelivery) send(ch *catchUpChunk, b []walwire.Item) bool {
	if !d.wait(ch) {
		return false
	}
	select {
	case d.out <- b:
		return true
	case <-d.stop:
		return false
	}
}

// fail hands err to the loop: in ch's turn, or at once for a nil ch.
func (d *catchUpDelivery) fail(ch *catchUpChunk, err error) {
	b := []walwire.Item{{Kind: walwire.KindError, Err: err}}
	if ch != nil {
		d.send(ch, b)
		return
	}
	select {
	case d.out <- b:
	case <-d.stop:
	}
}

// finish marks ch delivered, once the chunk before it is.
func (d *catchUpDelivery) finish(ch *catchUpChunk) bool {
	if !d.wait(ch) {
		return false
	}
	close(ch.done)
	return true
}

func (d *catchUpDelivery) newBatch() []walwire.Item {
	select {
	case b := <-d.free:
		return b
	default:
		return make([]walwire.Item, 0, walwire.BatchSize)
	}
}

// run reads the chunks the plan hands w until there are none left, one
// fails, or the loop is done.
func (w *catchUpWorker) run(ctx context.Context, p *catchUpPlan, d *catchUpDelivery, resolve pgoutput.Resolver) {
	for {
		ch := p.take(ctx, w)
		switch {
		case ch == nil:
			return
		case ch.err != nil:
			d.fail(ch, ch.err)
			return
		case ch.final:
			if d.send(ch, []walwire.Item{{Kind: walwire.KindCaughtUp, WALEnd: ch.start}}) {
				d.finish(ch)
			}
			return
		}
		err := w.read(ctx, ch, d, resolve)
		var refused *chunkRefusedError
		switch {
		case err == nil:
			continue
		case errors.As(err, &refused):
			// Nothing of the chunk was delivered: the walsender reads it.
			p.stop(fmt.Sprintf("the server could not materialize a chunk of %d bytes of WAL: %v", ch.end-ch.start, refused.err))
			if d.send(ch, []walwire.Item{{Kind: walwire.KindCaughtUp, WALEnd: ch.start}}) {
				d.finish(ch)
			}
		case err != errCatchUpStopped:
			d.fail(ch, err)
		}
		return
	}
}

// read reads chunk ch from w's copy and delivers its changes in its turn.
func (w *catchUpWorker) read(ctx context.Context, ch *catchUpChunk, d *catchUpDelivery, resolve pgoutput.Resolver) error {
	if ch.start > w.confirmed {
		// A fast forward from the copy's restart_lsn: no output.
		if _, err := w.conn.Exec(ctx, "SELECT pg_catalog.pg_replication_slot_advance($1, $2::text::pg_lsn)", w.slot, ch.start.String()); err != nil {
			return fmt.Errorf("advance the slot's copy to %v: %w", ch.start, err)
		}
		w.confirmed = ch.start
	}
	rows, err := w.conn.Query(ctx, peekQuery, w.slot, ch.end.String(), d.options)
	if err != nil {
		return fmt.Errorf("read changes up to %v: %w", ch.end, err)
	}
	defer rows.Close()
	dec := pgoutput.NewDecoder(resolve)
	b := d.newBatch()
	delivered := false // a batch of the chunk went to the loop
	for rows.Next() {
		b = append(b, walwire.Item{Kind: walwire.KindChange})
		it := &b[len(b)-1]
		ok, err := dec.Decode(rows.RawValues()[0], &it.Change)
		if err != nil {
			return err
		}
		if !ok {
			b = b[:len(b)-1]
			continue
		}
		if len(b) == cap(b) {
			if !d.send(ch, b) {
				return errCatchUpStopped
			}
			delivered, b = true, d.newBatch()
		}
	}
	if err := rows.Err(); err != nil {
		if !delivered && pgerr.Is(err, pgerrcode.ConfigurationLimitExceeded, codeDiskFull, codeOutOfMemory) {
			return &chunkRefusedError{err: err}
		}
		return fmt.Errorf("read changes up to %v: %w", ch.end, err)
	}
	if len(b) > 0 && !d.send(ch, b) {
		return errCatchUpStopped
	}
	if !d.finish(ch) {
		return errCatchUpStopped
	}
	return nil
}

// positions reads the restart position of w's copy and the server's WAL
// flush position (the SQL functions decode no further).
func (w *catchUpWorker) positions(ctx context.Context) (restart, flush canonical.Position, err error) {
	var r, f string
	err = w.conn.QueryRow(ctx, "SELECT restart_lsn::text, pg_catalog.pg_current_wal_flush_lsn()::text FROM pg_replication_slots WHERE slot_name = $1", w.slot).Scan(&r, &f)
	if err != nil {
		return 0, 0, fmt.Errorf("read the position of the slot's copy: %w", err)
	}
	if restart, err = canonical.ParsePosition(r); err != nil {
		return 0, 0, err
	}
	if flush, err = canonical.ParsePosition(f); err != nil {
		return 0, 0, err
	}
	return restart, flush, nil
}
