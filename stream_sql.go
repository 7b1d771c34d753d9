package siphon

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"

	"github.com/siphondb/siphon/canonical"
	"github.com/siphondb/siphon/internal/pgerr"
	"github.com/siphondb/siphon/internal/pgoutput"
	"github.com/siphondb/siphon/internal/walwire"
)

// Catching up through the SQL interface.
//
// A walsender sends changes one message at a time and any client of it
// (siphon, pg_recvlogical) is bound by it at about 7 µs per change, while
// the server's logical decoding alone runs at about 2 µs. For a backlog the
// stream reads changes with pg_logical_slot_peek_binary_changes instead,
// in chunks, and switches to the walsender once it has caught up.
//
// Never on the stream's slot itself: each worker session makes a temporary
// copy of it (pg_copy_logical_replication_slot, dropped with the session)
// and peeks at that. A copy may be moved between chunks freely
// (pg_replication_slot_advance), since nothing resumes from it; the
// stream's slot moves only to what streamState acknowledges (the end of a
// handled transaction, what the consumer made durable, never past from with
// holdAck: the walsender's rules), at once, every WithStatusInterval and
// when the catch-up stops, by pg_replication_slot_advance. The SQL
// functions refuse a slot a walsender holds: the slot's check (checkSlot,
// with its wait) comes first, and a slot taken meanwhile fails that
// advance with ErrSlotInUse.
//
// A chunk is a range of WAL, [start, end): its copy is advanced to start,
// so that the transactions committed before it are skipped, and peeked at
// with upto_lsn end. The server checks upto_lsn after each record it
// decodes and stops after the first one that ends at or past it
// (logicalfuncs.c), so the chunk delivers exactly what the records that
// start before end hold: every transaction whose commit record does,
// whole (pgoutput writes a transaction at its commit, so a huge one comes
// whole from the one call that reads its commit, as it would with
// upto_nchanges, which is checked at the same points), and every
// non-transactional message. end is never inside a page header, where a
// record starting at or past it could be read too (see chunkEnd).
//
// What a chunk costs. The function materializes its whole result in a
// tuplestore on the server, which spills to temporary files past work_mem,
// and sends the first row only once the chunk is decoded; the client
// streams the rows (rows.Next) and never holds more than a few batches, so
// its memory stays bounded however large a transaction is. Every call
// decodes from the copy's restart_lsn again (skipping what commits before
// start, but queuing its changes all the same): restart_lsn moves only at
// the server's running-transactions records (every 15 s of activity, at
// checkpoints), never past the start of the oldest transaction open there,
// so it may lag far behind, and a backlog written in a few seconds has no
// such record at all. A chunk therefore spans at least
// catchUpRedecodeRatio times the WAL it re-decodes (re-decoding without
// output costs about a tenth of decoding with it, and the advance's fast
// forward less), and when that would make it longer than catchUpMaxChunk
// (a long open transaction) the catch-up stops and the walsender goes on,
// which decodes from restart_lsn once.
//
// Two workers alternate: while the stream delivers one chunk's rows, the
// other worker's session is decoding the next on the server, so the
// server's decoding and the client's work overlap.
//
// Everything decoded goes through the stream's streamState, in order, as
// the walsender's messages do: the ordering, skip, bound, heartbeat and
// schema-change rules are the same code. The catch-up reads at least up to
// the position it measured when it started (BackupIncremental: up to its
// bound, and then it is done), and on while the WAL not yet read is more
// than the threshold; then the walsender starts from the end of the last
// transaction delivered, and streamState's seen skips what the catch-up
// delivered already.

// The catch-up's defaults.
const (
	// catchUpMinBacklog is the backlog, in bytes of WAL between the
	// stream's start and the server's WAL insert position (its bound, for
	// BackupIncremental), from which a stream catches up through the SQL
	// interface, and the WAL left unread below which it switches to the
	// walsender: below it, the catch-up's setup (two sessions and copies of
	// the slot) and the walsender's start from the slot's restart_lsn cost
	// more than the walsender's own pace.
	catchUpMinBacklog = 4 << 20
	// catchUpMinChunk is the least WAL a chunk spans.
	catchUpMinChunk = 2 << 20
	// catchUpLeftShare and catchUpFullChunk: a chunk spans at least this
	// share of the WAL left unread, up to catchUpFullChunk. The first
	// chunk's rows reach the client only once it is decoded whole, and so
	// do the last's: small chunks for a small backlog, and near the end;
	// large ones where much is left, since each call has a cost of its own
	// (its query, the fast forward of the copy, the WAL before it decoded
	// again).
	catchUpLeftShare = 4
	catchUpFullChunk = 16 << 20
	// catchUpMaxChunk is the most WAL a chunk spans; it bounds what one
	// call materializes on the server (about as much again in temporary
	// files, per worker).
	catchUpMaxChunk = 1 << 30
	// catchUpRedecodeRatio: a chunk spans at least this many times the WAL
	// between its copy's restart_lsn and its start, which the call
	// decodes again. Decoding again costs the server about 13% of
	// decoding with output (92 MB of WAL: 117 ms against 0.88-0.97 s), and
	// the last chunk's rows reach the client only once it is decoded
	// whole: 1 keeps the last chunk smaller than 2 does (BenchmarkCatchUp,
	// 200k rows: 0.83x the server's decode rate against 0.79x).
	catchUpRedecodeRatio = 1
	// catchUpWorkers is the number of sessions (and copies of the slot)
	// that read chunks, alternating.
	catchUpWorkers = 2
	// catchUpSlotPrefix starts the names of the temporary copies.
	catchUpSlotPrefix = "siphon_catchup_"
)

// catchUpSettings tune the catch-up; the zero value means the defaults
// above. Tests set others (stream_export_test.go).
type catchUpSettings struct {
	set bool
	// startAt is the least backlog that starts a catch-up; negative: never.
	startAt int64
	// switchAt: past the start's goal, the catch-up ends once less WAL
	// than this is left.
	switchAt           int64
	minChunk, maxChunk int64
	// leftShare and fullChunk: see catchUpLeftShare; leftShare 0 makes
	// minChunk the least span whatever is left.
	leftShare, fullChunk int64
	// redecodeRatio: see catchUpRedecodeRatio; 0 makes every chunk
	// minChunk long and never stops for re-decoding.
	redecodeRatio int64
	workers       int
}

func (s catchUpSettings) orDefaults() catchUpSettings {
	if s.set {
		return s
	}
	return catchUpSettings{
		set: true, startAt: catchUpMinBacklog, switchAt: catchUpMinBacklog,
		minChunk: catchUpMinChunk, maxChunk: catchUpMaxChunk, leftShare: catchUpLeftShare, fullChunk: catchUpFullChunk, redecodeRatio: catchUpRedecodeRatio, workers: catchUpWorkers,
	}
}

// catchUpGoal returns how far a catch-up of st must read (its bound, or
// the WAL position boundary the stream read when it started), and whether
// the stream catches up through the SQL interface at all: not with a
// pending resume check (only the walsender's heartbeat probing decides
// it), and only for a backlog of startAt or more.
func (c *Conn) catchUpGoal(st *streamState, boundary canonical.Position) (canonical.Position, bool) {
	set := c.catchUpTuning.orDefaults()
	goal := boundary
	if st.cfg.bound != 0 {
		goal = min(st.cfg.bound, boundary)
	}
	if set.startAt < 0 || st.pendingGap || goal <= st.lastEnd {
		return goal, false
	}
	return goal, int64(goal-st.lastEnd) >= set.startAt
}

// errCatchUpStopped: the stream stopped reading the catch-up.
var errCatchUpStopped = errors.New("catch-up stopped")

// catchUp reads st's backlog through the SQL interface into st, up to goal
// and on while the WAL left is at least the switch threshold, until ctx
// ends, the bound is reached, or an error. With res.caughtUp (and not
// res.reachedBound) the walsender goes on from st.lastEnd; that is also
// the outcome when there is no free slot or session for the copies.
func (c *Conn) catchUp(ctx context.Context, st *streamState, options []string, goal canonical.Position) (streamResult, error) {
	set := c.catchUpTuning.orDefaults()
	began, start := time.Now(), st.lastEnd
	workers, blockSize, err := c.openCatchUpWorkers(ctx, set.workers)
	defer c.closeCatchUpWorkers(workers)
	if err != nil {
		res := streamResult{resume: st.resumePos()}
		if len(workers) == 0 && isLackOfRoom(err) {
			c.log.Info("stream not catching up through the SQL interface: no free replication slot or connection for a copy of the slot", "slot", c.opts.slot, "err", err)
			res.caughtUp = true
			return res, nil
		}
		return setupFailed(ctx, res, err, res.resume)
	}
	c.log.Info("stream catching up through the SQL interface", "slot", c.opts.slot, "from", start,
		"backlog_bytes", int64(goal-start), "workers", len(workers))

	runCtx, cancelRun := context.WithCancel(ctx)
	plan := &catchUpPlan{set: set, goal: goal, bound: st.cfg.bound, blockSize: blockSize, next: start, last: closedChan()}
	d := &catchUpDelivery{
		out:     make(chan []walwire.Item, walwire.BatchesInFlight),
		free:    make(chan []walwire.Item, walwire.BatchesInFlight+2*len(workers)),
		stop:    make(chan struct{}),
		options: options,
	}
	resolve := c.resolverFor(runCtx)
	var wg sync.WaitGroup
	for _, w := range workers {
		wg.Go(func() { w.run(runCtx, plan, d, resolve) })
	}
	stopAdvancing := c.advanceSlotWhileCatchingUp(runCtx, st, d)

	res, err := st.loop(ctx, d.out, d.free, nil, c.opts.statusInterval)
	close(d.stop)
	cancelRun()
	wg.Wait()
	stopAdvancing()
	if !res.caughtUp || res.reachedBound {
		// As the walsender's last status update: the slot learns the final
		// position now. Best effort, but that another session took the slot
		// meanwhile is the stream's error, as the walsender would say.
		final, cancel := cleanupContext(ctx)
		if aerr := c.advanceSlot(final, st.ackedPos()); err == nil && errors.Is(aerr, ErrSlotInUse) {
			err = aerr
		}
		cancel()
	}
	res.resume = st.resumePos()
	if err != nil {
		return res, wrapStreamError(err, res.resume)
	}
	if res.caughtUp && !res.reachedBound {
		c.log.Info("stream switching from the SQL interface to the walsender",
			append([]any{"slot", c.opts.slot, "from", start, "took", time.Since(began)}, plan.outcome()...)...)
	}
	return res, nil
}

// resolverFor returns the column resolver of the catch-up's decoders.
func (c *Conn) resolverFor(ctx context.Context) pgoutput.Resolver {
	return func(rel *pgoutput.Relation, types map[uint32]pgoutput.TypeName) error {
		return c.resolveColumns(ctx, rel, types)
	}
}

// advanceSlot moves the stream's slot to pos, unless it stands there or
// past it already, and fails with ErrSlotInUse when another session holds
// the slot, moved or not (a walsender took it meanwhile). When it returns,
// its session no longer holds the slot: an advance cut short by ctx (which
// closes the socket while the backend goes on decoding, holding the slot)
// has its backend ended first, or the walsender that follows the catch-up,
// or the next stream, would find the slot active.
func (c *Conn) advanceSlot(ctx context.Context, pos canonical.Position) error {
	conn, err := c.pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("advance slot %q to %v: %w", c.opts.slot, pos, err)
	}
	pid := conn.Conn().PgConn().PID()
	var active bool
	err = conn.QueryRow(ctx, `SELECT active, CASE WHEN NOT active AND confirmed_flush_lsn < $2::text::pg_lsn
			THEN (pg_catalog.pg_replication_slot_advance(slot_name, $2::text::pg_lsn)).end_lsn::text END
		FROM pg_replication_slots WHERE slot_name = $1`, c.opts.slot, pos.String()).Scan(&active, new(*string))
	broken := conn.Conn().IsClosed()
	conn.Release()
	if broken {
		end, cancel := cleanupContext(ctx)
		endBackend(end, c.pool, pid)
		cancel()
	}
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return fmt.Errorf("advance slot %q to %v: %w", c.opts.slot, pos, &ResumeGapError{Slot: c.opts.slot, Requested: pos, Reason: GapSlotMissing})
	case err != nil:
		return fmt.Errorf("advance slot %q to %v: %w", c.opts.slot, pos, err)
	case active:
		return fmt.Errorf("slot %q: %w", c.opts.slot, ErrSlotInUse)
	}
	return nil
}

// advanceSlotWhileCatchingUp moves the stream's slot to what st
// acknowledges (and checks that no other session took it), at once and
// then every status interval, until stop is called (which waits for it).
// A failure stops the stream: it goes to the loop through d.
func (c *Conn) advanceSlotWhileCatchingUp(ctx context.Context, st *streamState, d *catchUpDelivery) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(c.opts.statusInterval)
		defer tick.Stop()
		for {
			if err := c.advanceSlot(ctx, st.ackedPos()); err != nil {
				if ctx.Err() == nil {
					d.fail(nil, err)
				}
				return
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return func() { cancel(); <-done }
}

// catchUpWorker is a session that reads chunks from its own temporary copy
// of the stream's slot.
type catchUpWorker struct {
	conn *pgx.Conn
	slot string
	// confirmed is the copy's confirmed position, as it was last set.
	confirmed canonical.Position
}

// openCatchUpWorkers opens up to n worker sessions at once, each with its
// copy of the slot, and reads wal_block_size. It returns the workers it
// opened, with the first failure unless that is a lack of connections or
// slots and some opened (fewer workers: slower, not wrong).
func (c *Conn) openCatchUpWorkers(ctx context.Context, n int) ([]*catchUpWorker, int64, error) {
	opened, errs := make([]*catchUpWorker, n), make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { opened[i], errs[i] = c.openCatchUpWorker(ctx) })
	}
	wg.Wait()
	var workers []*catchUpWorker
	var failed error
	for i, w := range opened {
		if w != nil {
			workers = append(workers, w)
		} else if failed == nil || !isLackOfRoom(errs[i]) {
			failed = errs[i]
		}
	}
	if failed != nil && (len(workers) == 0 || !isLackOfRoom(failed)) {
		return workers, 0, failed
	}
	var blockSize int64
	err := workers[0].conn.QueryRow(ctx, "SELECT setting::int8 FROM pg_settings WHERE name = 'wal_block_size'").Scan(&blockSize)
	if err != nil {
		return workers, 0, fmt.Errorf("read wal_block_size: %w", err)
	}
	return workers, blockSize, nil
}

// isLackOfRoom reports whether err is the server's refusal of another
// connection or replication slot.
func isLackOfRoom(err error) bool {
	return pgerr.Is(err, pgerrcode.ConfigurationLimitExceeded, pgerrcode.TooManyConnections)
}

// openCatchUpWorker opens a session and makes its temporary copy of the
// slot. On that session a cancelled ctx sends a cancel request (the
// server's decoding checks for it after each record) rather than closing
// the socket, which would leave the server decoding a chunk to its end.
func (c *Conn) openCatchUpWorker(ctx context.Context) (*catchUpWorker, error) {
	if c.pool.closed.Load() {
		return nil, ErrClosed
	}
	config := c.config.Copy()
	config.BuildContextWatcherHandler = func(pc *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.CancelRequestContextWatcherHandler{Conn: pc, DeadlineDelay: closeTimeout}
	}
	conn, err := pgx.ConnectConfig(ctx, config)
	if err != nil {
		return nil, fmt.Errorf("open catch-up session: %w", err)
	}
	var suffix [8]byte
	rand.Read(suffix[:])
	w := &catchUpWorker{conn: conn, slot: catchUpSlotPrefix + hex.EncodeToString(suffix[:])}
	// A chunk may take a while: a statement_timeout or transaction_timeout
	// of the caller's sessions would fail a stream the walsender would
	// have read.
	_, err = conn.Exec(ctx, noTimeouts(false))
	var confirmed string
	if err == nil {
		err = conn.QueryRow(ctx, "SELECT lsn::text FROM pg_catalog.pg_copy_logical_replication_slot($1, $2, true)", c.opts.slot, w.slot).Scan(&confirmed)
	}
	if err == nil {
		w.confirmed, err = canonical.ParsePosition(confirmed)
	}
	if err != nil {
		closeAndEnd(c.pool, conn.PgConn())
		return nil, fmt.Errorf("copy slot %q: %w", c.opts.slot, err)
	}
	return w, nil
}

// closeCatchUpWorkers drops the copies and closes the sessions, waiting
// until their backends are gone (closeAndEnd): the server drops a
// temporary slot with its session, but a session whose query was cut short
// may still be decoding when its socket closes.
func (c *Conn) closeCatchUpWorkers(workers []*catchUpWorker) {
	ctx, cancel := cleanupContext(context.Background())
	defer cancel()
	for _, w := range workers {
		if !w.conn.IsClosed() {
			w.conn.Exec(ctx, "SELECT pg_catalog.pg_drop_replication_slot($1)", w.slot)
		}
		closeAndEnd(c.pool, w.conn.PgConn())
	}
}

func closedChan() chan struct{} {
	ch := make(chan struct{})
	close(ch)
	return ch
}
