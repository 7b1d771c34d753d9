package siphon

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/siphondb/siphon/canonical"
	"github.com/siphondb/siphon/internal/coalesce"
	"github.com/siphondb/siphon/internal/pgerr"
	"github.com/siphondb/siphon/internal/pgoutput"
	"github.com/siphondb/siphon/internal/walwire"
	"github.com/siphondb/siphon/pgdump"
)

// StreamChanges streams the changes committed after from to emit, in commit
// order, one at a time: each transaction as [canonical.OpBegin], its row
// changes (and transactional messages), then [canonical.OpCommit]. A zero
// from means "where the slot stands". Non-transactional logical decoding
// messages come between transactions, except siphon's own heartbeats.
//
// emit receives each Change by value and may keep it and every row in it:
// siphon never reuses them. Change.Columns is shared by the changes of one
// table version: do not modify it.
//
// The slot's confirmed position advances only to the end of a transaction
// whose OpCommit emit returned nil (with [StreamOptions].Durable, to what
// the consumer reports durable), so a consumer that records the Position
// of the last OpCommit it handled can restart from it and see nothing twice
// and miss nothing. When nothing is in flight and the server's WAL moves on
// without published changes, siphon writes a heartbeat message (a logical
// decoding message recording the last transaction's end) and advances the
// slot to it, so an idle slot does not pin WAL; a later restart from that
// last OpCommit Position is still accepted, since the heartbeat vouches that
// nothing was published in between (see [WithHeartbeat]). A consumer that
// makes transactions durable after emit returns (a queue acknowledging
// asynchronously) tells the stream how far through [StreamOptions].Durable
// of [Conn.StreamChangesWith] instead.
//
// StreamChanges runs until ctx is cancelled, which is the normal stop: it
// then returns the Position to resume from and nil. A ctx that reaches its
// deadline returns that Position too, with an error wrapping
// [context.DeadlineExceeded]: a deadline is not a stop the caller asked
// for in so many words. One Conn streams its slot once at a time: a second
// StreamChanges (or BackupIncremental) while one runs returns
// [ErrAlreadyStreaming] at once. That Position is the end
// of the last transaction whose OpCommit emit returned nil (from itself, or
// the slot's position for a zero from, when there was none): what a
// consumer records, although a heartbeat may have moved the slot past it.
// An emit error stops the stream and is returned wrapped, with the same
// Position.
//
// Once StreamChanges returns (a stop, a deadline, an emit error), the
// server has confirmed the acknowledged position: the slot's
// confirmed_flush_lsn is at or past the returned Position the moment the
// call returns, so the WAL behind it is released and another stream or
// tool may take the slot over from there. siphon ends the replication
// session cleanly for it and waits up to 15 seconds for the server's
// answer (a loaded machine can hold a walsender back that long); past
// that, or when the session broke (a [*StreamInterruptedError]), the slot
// may stand behind the returned Position until the next stream, which
// repeats nothing (it skips what the consumer has) and is logged at Warn. A broken connection returns a [*StreamInterruptedError]
// (retryable). Resuming from a Position the slot has passed, or from a lost
// or dropped slot, returns a [*ResumeGapError] before anything is emitted.
// A slot in use by another session returns [ErrSlotInUse], after waiting up
// to 5 seconds for it to be released (the walsender of an interrupted stream
// takes a moment to exit). A missing slot is created (with the publication
// first) only when from is zero.
//
// Memory stays bounded however large a transaction is: a few hundred
// decoded changes at most wait for emit.
//
// A stream that starts far behind (4 MiB of WAL or more between from and
// the server's WAL position) first catches up through the SQL interface,
// which is up to about twice as fast as a walsender (BenchmarkCatchUp): it
// reads the backlog in chunks (pg_logical_slot_peek_binary_changes) from
// temporary copies of the slot, which need up to 2 more sessions and 2
// more replication slots (max_replication_slots) while it runs, and then
// goes on through the walsender. What emit receives, the Positions and the
// acknowledgements are the same either way; the slot is moved
// (pg_replication_slot_advance) only to what was acknowledged. With no
// room for a copy of the slot or a session, the stream reads everything
// through the walsender.
func (c *Conn) StreamChanges(ctx context.Context, from canonical.Position, emit func(canonical.Change) error) (canonical.Position, error) {
	return c.StreamChangesWith(ctx, from, StreamOptions{}, emit)
}

// claimStream marks the Conn as streaming its slot, or returns
// ErrAlreadyStreaming; release unmarks it.
func (c *Conn) claimStream() (release func(), err error) {
	if !c.streaming.CompareAndSwap(false, true) {
		return nil, ErrAlreadyStreaming
	}
	return func() { c.streaming.Store(false) }, nil
}

// stopReason tells how a stream that ended without an error ended: a
// cancelled ctx is the normal stop (nil); a ctx past its deadline is an
// error wrapping context.DeadlineExceeded, so that a stop the caller did
// not ask for shows.
func stopReason(ctx context.Context, op string, resume canonical.Position) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return errorf("siphon: %s: stopped at ctx's deadline (resume from %v): %w", op, resume, context.DeadlineExceeded)
	}
	return nil
}

// CurrentPosition makes sure the publication and then the persistent slot
// exist and returns a Position to stream from: the consistent point of a
// slot it just created, or else the server's current WAL insert position.
// Both are safe anchors: every transaction committed before the call ends at
// or before the returned Position, and every later one after it. (The insert
// position is used rather than pg_current_wal_lsn(): under
// synchronous_commit=off a committed transaction's commit record may still
// be past the write position.)
func (c *Conn) CurrentPosition(ctx context.Context) (canonical.Position, error) {
	created, err := c.ensureSlot(ctx)
	if err != nil {
		return 0, err
	}
	if created.Created {
		return created.ConsistentPoint, nil
	}
	pos, _, err := c.insertPosition(ctx)
	if err != nil {
		return 0, errorf("siphon: current position: %w", err)
	}
	return pos, nil
}

// streamConfig says what one run of the stream does.
type streamConfig struct {
	from canonical.Position
	// bound, when nonzero, ends the stream once every transaction committed
	// at or before it was emitted (BackupIncremental).
	bound canonical.Position
	// holdAck keeps the acknowledged position at from.
	holdAck bool
	// durable, when set, is how far the consumer has made transactions
	// durable (it stores their end Positions): the slot is acknowledged up
	// to it, not when OpCommit emit returns.
	durable *atomic.Uint64
	// onStart runs once the slot is checked, before anything is emitted,
	// with the Position the stream starts from.
	onStart func(start canonical.Position, info streamInfo) error
}

type streamResult struct {
	resume       canonical.Position // where to resume from
	reachedBound bool
	caughtUp     bool // the SQL catch-up ended: the walsender goes on
}

// slotInUseWait bounds how long stream waits for a slot that is active,
// which is mostly a walsender of an interrupted stream still exiting.
const slotInUseWait = 5 * time.Second

// streamSlot reads the stream's slot, creating it when from is zero and it
// is missing, waits a moment for an active slot to be released, and applies
// the resume rules that can be decided before streaming.
func (c *Conn) streamSlot(ctx context.Context, from canonical.Position) (slotRow, error) {
	deadline := time.Now().Add(slotInUseWait)
	warned := false
	for {
		s, err := readSlotRow(ctx, c.pool, c.opts.slot)
		if err != nil {
			return s, err
		}
		if s.exists {
			if err := s.unusable(c.opts.slot); err != nil {
				return s, err
			}
		}
		switch {
		case !s.exists && from != 0:
			return s, &ResumeGapError{Slot: c.opts.slot, Requested: from, Reason: GapSlotMissing}
		case !s.exists:
			if _, err := c.ensureSlot(ctx); err != nil {
				return s, err
			}
			continue
		case s.walStatus == "lost":
			return s, &ResumeGapError{Slot: c.opts.slot, Requested: from, Confirmed: s.confirmed, Reason: GapSlotLost}
		case s.walStatus == "unreserved" && !warned:
			c.log.Warn("replication slot is about to lose the WAL it needs (wal_status unreserved): consume faster or raise max_slot_wal_keep_size", "slot", c.opts.slot)
			warned = true
			continue
		case s.active && time.Now().Before(deadline):
			select {
			case <-ctx.Done():
				return s, context.Cause(ctx)
			case <-time.After(50 * time.Millisecond):
			}
			continue
		case s.active:
			return s, fmt.Errorf("slot %q: %w", c.opts.slot, ErrSlotInUse)
		}
		pub, err := c.checkPublication(ctx)
		if err != nil {
			return s, err
		}
		if !pub {
			return s, &PublicationMissingError{Publication: c.opts.publication, Slot: c.opts.slot}
		}
		return s, nil
	}
}

// insertPosition returns pg_current_wal_insert_lsn() as is, and moved back
// to the previous page boundary when it points just past a page header (see
// walBoundary).
func (c *Conn) insertPosition(ctx context.Context) (insert, boundary canonical.Position, err error) {
	var (
		lsn                string
		blockSize, segSize int64
	)
	err = c.pool.QueryRow(ctx, `SELECT pg_catalog.pg_current_wal_insert_lsn()::text,
		(SELECT setting::int8 FROM pg_settings WHERE name = 'wal_block_size'),
		(SELECT setting::int8 FROM pg_settings WHERE name = 'wal_segment_size')`).Scan(&lsn, &blockSize, &segSize)
	if err != nil {
		return 0, 0, fmt.Errorf("read the WAL insert position: %w", err)
	}
	insert, err = canonical.ParsePosition(lsn)
	if err != nil {
		return 0, 0, err
	}
	return insert, walBoundary(insert, blockSize, segSize), nil
}

// flushPrefix is the prefix of the logical decoding message flushWAL
// writes; streams never emit it.
const flushPrefix = "siphon.flush"

// boundPosition returns the server's WAL insert position as a bound to
// stream up to (see walBoundary), once the server has flushed its WAL
// there: the walsender sends only flushed WAL, and WAL that an open
// transaction inserted after the last commit may stay unflushed for long
// on a server with no other commits, so that a stream waiting for the
// bound would wait that long. A tiny transaction forces the flush: a
// non-transactional logical decoding message (WAL of its own, which
// streams leave out) in a transaction given a transaction ID, committed
// with synchronous_commit = local; pgoutput sends nothing of the empty
// transaction.
func (c *Conn) boundPosition(ctx context.Context) (canonical.Position, error) {
	_, bound, err := c.insertPosition(ctx)
	if err != nil {
		return 0, err
	}
	err = pgx.BeginFunc(ctx, c.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SET LOCAL synchronous_commit = local"); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, "SELECT pg_catalog.pg_current_xact_id(), pg_catalog.pg_logical_emit_message(false, $1, '')", flushPrefix)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("flush the WAL to %v: %w", bound, err)
	}
	return bound, nil
}

// walBoundary maps a WAL insert position to the end of the last record
// before it. The insert position points past a page's header when the last
// record ended exactly at the page boundary, while that record's end (what
// the walsender reports) is the boundary itself; without this, waiting for
// the walsender to reach the insert position could wait forever on an idle
// server.
func walBoundary(pos canonical.Position, blockSize, segSize int64) canonical.Position {
	const shortHeader, longHeader = 24, 40 // MAXALIGNed XLogPageHeaderData, XLogLongPageHeaderData
	if segSize > 0 && int64(pos)%segSize == longHeader {
		return pos - longHeader
	}
	if blockSize > 0 && int64(pos)%blockSize == shortHeader {
		return pos - shortHeader
	}
	return pos
}

// senderTimeout reads wal_sender_timeout (0: disabled).
func (c *Conn) senderTimeout(ctx context.Context) (time.Duration, error) {
	var ms int64
	if err := c.pool.QueryRow(ctx, "SELECT setting::int8 FROM pg_settings WHERE name = 'wal_sender_timeout'").Scan(&ms); err != nil {
		return 0, fmt.Errorf("read wal_sender_timeout: %w", err)
	}
	return time.Duration(ms) * time.Millisecond, nil
}

// stream runs one replication session: it checks the slot, starts
// replication and hands each change to emit until ctx ends, the bound is
// reached, or an error stops it.
func (c *Conn) stream(ctx context.Context, cfg streamConfig, emit func(canonical.Change) error) (streamResult, error) {
	res := streamResult{resume: cfg.from}
	if err := c.checkWALLevel(); err != nil {
		return res, err
	}
	if _, err := c.ensureCapture(ctx); err != nil {
		return setupFailed(ctx, res, err, cfg.from)
	}
	slot, err := c.streamSlot(ctx, cfg.from)
	if err != nil {
		return setupFailed(ctx, res, err, cfg.from)
	}
	st := &streamState{
		cfg: cfg, emit: emit, slot: c.opts.slot, ddl: newSchemaChanges(c.opts.noSchemaCapture, c.tables, c.log),
		startConfirmed: slot.confirmed, lastEnd: max(cfg.from, slot.confirmed), seen: max(cfg.from, slot.confirmed),
		stats: &c.stats,
	}
	st.acked.Store(uint64(max(cfg.from, slot.confirmed)))
	c.stats.streamSessions.Add(1)
	c.stats.streaming.Store(true)
	defer c.stats.streaming.Store(false)
	now, boundary, err := c.insertPosition(ctx)
	if err != nil {
		return setupFailed(ctx, res, err, cfg.from)
	}
	if cfg.from > now {
		return res, errorf("siphon: stream changes: position %v is ahead of the server's WAL (%v): it comes from another server or was made up", cfg.from, now)
	}
	if cfg.from != 0 && cfg.from < slot.confirmed {
		// Only a heartbeat written when the slot was advanced can show that
		// nothing was published between from and the slot's position; wait
		// for it until the walsender has read all WAL written so far.
		st.pendingGap, st.lastEnd, st.seen, st.probeEnd = true, cfg.from, cfg.from, boundary
	}
	res.resume = st.resumePos()
	timeout, err := c.senderTimeout(ctx)
	if err != nil {
		return setupFailed(ctx, res, err, res.resume)
	}

	conn, sock, err := c.openStreamSession(ctx)
	if err != nil {
		return setupFailed(ctx, res, err, res.resume)
	}
	defer c.closeReplication(conn)
	options, err := c.pluginOptions(ctx, conn.ParameterStatus("server_version")) // before onStart, which may write a header
	if err != nil {
		return setupFailed(ctx, res, err, res.resume)
	}
	if cfg.onStart != nil {
		info, err := identifySource(ctx, conn)
		if err != nil {
			return setupFailed(ctx, res, err, res.resume)
		}
		if err := cfg.onStart(max(cfg.from, slot.confirmed), info); err != nil {
			return res, err
		}
	}
	start, confirmed := cfg.from, slot.confirmed
	if goal, ok := c.catchUpGoal(st, boundary); ok {
		caught, err := c.catchUp(ctx, st, options, goal)
		if err != nil || !caught.caughtUp || caught.reachedBound {
			return caught, err
		}
		start = st.lastEnd // the walsender goes on from the last transaction delivered
		// What the catch-up delivered is handled: a failure (or a
		// cancelled ctx) from here on returns its end, not the start.
		res.resume = st.resumePos()
		// The catch-up moved the slot.
		moved, err := readSlotRow(ctx, c.pool, c.opts.slot)
		if err != nil {
			return setupFailed(ctx, res, fmt.Errorf("read slot %q: %w", c.opts.slot, err), res.resume)
		}
		confirmed = moved.confirmed
	}
	err = pglogrepl.StartReplication(ctx, conn, c.opts.slot, pglogrepl.LSN(start), pglogrepl.StartReplicationOptions{
		PluginArgs: replicationArgs(options),
	})
	if err != nil {
		return setupFailed(ctx, res, fmt.Errorf("start replication on slot %q: %w", c.opts.slot, err), res.resume)
	}
	c.log.Info("stream started", "slot", c.opts.slot, "from", start, "slot_position", slot.confirmed)
	return c.run(ctx, conn, sock, st, confirmed, timeout)
}

// pluginOptions returns pgoutput's options, name and value in turn, for a
// server of version serverVersion: protocol 1, the publications, logical
// decoding messages, and with WithLocalChangesOnly origin none, which a
// server older than 16 refuses.
func (c *Conn) pluginOptions(ctx context.Context, serverVersion string) ([]string, error) {
	publications, err := c.publicationNames(ctx)
	if err != nil {
		return nil, err
	}
	options := []string{"proto_version", "1", "publication_names", publications, "messages", "true"}
	if !c.opts.localOnly {
		return options, nil
	}
	server, err := pgdump.ParseVersion(serverVersion)
	if err != nil {
		return nil, errorf("siphon: stream changes: server version: %w", err)
	}
	if err := needRelease("WithLocalChangesOnly", 16, server); err != nil {
		return nil, err
	}
	return append(options, "origin", "none"), nil
}

// replicationArgs writes pgoutput's options (see pluginOptions) as
// START_REPLICATION's arguments.
func replicationArgs(options []string) []string {
	args := make([]string, 0, len(options)/2)
	for i := 0; i+1 < len(options); i += 2 {
		args = append(args, options[i]+" '"+options[i+1]+"'")
	}
	return args
}

// closeReplication closes a replication session and waits (briefly) until
// its walsender has released the slot, so that the caller can stream again
// or drop the slot right away.
func (c *Conn) closeReplication(conn *pgconn.PgConn) {
	closeAndEnd(c.pool, conn)
}

// run drives a started replication session: the wire reader decodes in its
// goroutine, heartbeats are written in another, and this goroutine emits
// and acknowledges. Both goroutines are joined before run returns.
func (c *Conn) run(ctx context.Context, conn *pgconn.PgConn, sock *coalesce.Conn, st *streamState, confirmed canonical.Position, senderTimeout time.Duration) (streamResult, error) {
	statusEvery := c.opts.statusInterval
	// While emit holds the stream back the reader cannot see keepalives, so
	// it sends status updates often enough for wal_sender_timeout alone.
	keepAlive := statusEvery
	if senderTimeout > 0 && senderTimeout/3 < keepAlive {
		keepAlive = senderTimeout / 3
	}
	// The reader and the heartbeat writer are stopped and joined however
	// the loop ends, a panicking emit included.
	runCtx, cancelRun := context.WithCancel(context.Background())
	w := walwire.New(walwire.Config{
		Conn: conn, Confirmed: confirmed,
		Sock: sock,
		Decoder: pgoutput.NewDecoder(func(rel *pgoutput.Relation, types map[uint32]pgoutput.TypeName) error {
			return c.resolveColumns(runCtx, rel, types)
		}),
		Acked:       &st.acked,
		Probing:     &st.probing,
		StatusEvery: statusEvery,
		KeepAlive:   keepAlive,
	})
	st.probing.Store(st.pendingGap || st.cfg.bound != 0)
	hb := c.startHeartbeats(st)
	go w.Run()
	defer func() {
		w.Stop()
		cancelRun()
		conn.Conn().SetReadDeadline(time.Now()) // wake the reader
		<-w.Done()
		hb.stop()
		c.confirmFinal(w)
	}()

	res, err := st.loop(ctx, w.Batches(), w.Free(), hb.requests, statusEvery)
	res.resume = st.resumePos()
	if err != nil {
		return res, wrapStreamError(err, res.resume)
	}
	return res, nil
}

// confirmFinal waits until the server confirmed the stream's final
// acknowledged position (see walwire.Reader.ConfirmFinal), and says so in the log
// when it could not: the slot then stands behind the returned Position
// until the next stream confirms it, which replays nothing (the stream
// skips what the consumer has).
func (c *Conn) confirmFinal(w *walwire.Reader) {
	err := w.ConfirmFinal(func(ctx context.Context) (canonical.Position, error) {
		s, err := readSlotRow(ctx, c.pool, c.opts.slot)
		return s.confirmed, err
	})
	if err != nil {
		c.log.Warn("the slot's final position was not confirmed by the server; it may stand behind the returned Position until the next stream",
			"slot", c.opts.slot, "position", w.Acked(), "err", err)
	}
}

// wrapStreamError turns connection failures into a *StreamInterruptedError
// and prefixes the rest.
func wrapStreamError(err error, pos canonical.Position) error {
	var (
		gap   *ResumeGapError
		intr  *StreamInterruptedError
		emitE *emitError
	)
	switch {
	case errors.As(err, &gap), errors.As(err, &intr):
		return err
	case errors.As(err, &emitE):
		return emitE
	case pgerr.Is(err, pgerrcode.ObjectInUse): // the slot was taken meanwhile
		return errorf("siphon: stream changes: %w: %v", ErrSlotInUse, err)
	case isInterruption(err):
		return &StreamInterruptedError{Position: pos, Err: err}
	}
	return errorf("siphon: stream changes: %w", err)
}

// emitError is an error returned by the caller's emit.
type emitError struct {
	op  canonical.Op
	pos canonical.Position
	err error
}

func (e *emitError) Error() string {
	return fmt.Sprintf("siphon: stream changes: emit %v at %v: %v", e.op, e.pos, e.err)
}

func (e *emitError) Unwrap() error { return e.err }

// resolveColumns checks a relation named like the capture's table (see
// checkCaptureRelation) and completes a Relation message's columns from
// the catalog: the type as format_type prints it (as InspectSchema does),
// nullability and whether the column has a default. pgoutput sends none of
// them. The catalog is today's, not the historic one; for a type that no
// longer exists the Type message's name is used.
func (c *Conn) resolveColumns(ctx context.Context, rel *pgoutput.Relation, types map[uint32]pgoutput.TypeName) error {
	if err := c.checkCaptureRelation(ctx, rel); err != nil {
		return err
	}
	n := len(rel.Columns)
	oids, mods, names := make([]int64, n), make([]int32, n), make([]string, n)
	for i, col := range rel.Columns {
		oids[i], mods[i], names[i] = int64(col.TypeOID), rel.TypeModifiers[i], col.Name
	}
	rows, err := c.pool.Query(ctx, `SELECT pg_catalog.format_type(u.oid::oid, u.typmod), coalesce(NOT a.attnotnull, true),
		       coalesce(a.atthasdef OR a.atthasmissing OR a.attidentity <> '', false)
		FROM unnest($1::int8[], $2::int4[], $3::text[]) WITH ORDINALITY AS u(oid, typmod, name, n)
		LEFT JOIN pg_attribute a ON a.attrelid = $4::int8::oid AND a.attname = u.name AND a.attnum > 0 AND NOT a.attisdropped
		ORDER BY u.n`, oids, mods, names, int64(rel.ID))
	if err != nil {
		return err
	}
	i := 0
	for ; rows.Next() && i < n; i++ {
		var typ *string
		if err := rows.Scan(&typ, &rel.Columns[i].Nullable, &rel.Columns[i].Default); err != nil {
			rows.Close()
			return err
		}
		switch t, known := types[rel.Columns[i].TypeOID]; {
		case typ != nil && *typ != "???":
			rel.Columns[i].Type = *typ
		case known:
			rel.Columns[i].Type = pgx.Identifier{t.Schema, t.Name}.Sanitize()
		default:
			rel.Columns[i].Type = fmt.Sprintf("oid %d", rel.Columns[i].TypeOID)
		}
	}
	rows.Close()
	return rows.Err()
}

// heartbeats is the running heartbeat writer of one stream.
type heartbeats struct {
	requests chan struct{}
	stop     func()
}

// startHeartbeats starts the goroutine that writes heartbeat messages: at
// the WithHeartbeat interval, and whenever the stream asks for one to
// advance an idle slot.
func (c *Conn) startHeartbeats(st *streamState) heartbeats {
	hb := heartbeats{requests: make(chan struct{}, 1), stop: func() {}}
	if st.cfg.holdAck {
		return hb // the slot does not move: nothing to vouch for
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		var tick <-chan time.Time
		if c.opts.heartbeat > 0 {
			t := time.NewTicker(c.opts.heartbeat)
			defer t.Stop()
			tick = t.C
		}
		failing := false
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick:
			case <-hb.requests:
			}
			err := c.writeHeartbeat(ctx, canonical.Position(st.lastEndShared.Load()))
			switch {
			case err != nil && ctx.Err() == nil && !failing:
				c.log.Warn("heartbeat failed; the slot advances only with published transactions until it works", "slot", c.opts.slot, "err", err)
				failing = true
			case err == nil && failing:
				c.log.Info("heartbeat works again", "slot", c.opts.slot)
				failing = false
			}
		}
	}()
	hb.stop = func() { cancel(); wg.Wait() }
	return hb
}

// setupFailed returns the error that stopped a stream before it started,
// unless ctx ended meanwhile: cancellation is the normal stop.
func setupFailed(ctx context.Context, res streamResult, err error, pos canonical.Position) (streamResult, error) {
	if ctx.Err() != nil {
		return res, nil
	}
	return res, wrapStreamError(err, pos)
}

// openStreamSession opens the replication session a stream reads from:
// a replication=database session with siphon's session settings (which the
// walsender's output functions use too), on a coalesce.Conn.
func (c *Conn) openStreamSession(ctx context.Context) (*pgconn.PgConn, *coalesce.Conn, error) {
	var sock *coalesce.Conn // the last one dialed is the one kept
	conn, err := c.newReplicationSession(ctx, func(conn net.Conn) net.Conn {
		sock = coalesce.New(conn)
		return sock
	})
	return conn, sock, err
}
