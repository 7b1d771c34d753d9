package siphon

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	mathrand "math/rand/v2"
	"regexp"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/siphondb/siphon/canonical"
	"github.com/siphondb/siphon/internal/pgerr"
	"github.com/siphondb/siphon/internal/sqltext"
	"github.com/siphondb/siphon/internal/ulid"
)

// Slot creation waits for every transaction that holds a transaction ID, so
// it runs under a lock, with timeouts, retries and diagnostics:
//
//   - a dedicated session takes the slot-management advisory lock (per
//     database, outside any transaction) for each attempt; sweeping takes it
//     too, so concurrent creators end with one slot and no error;
//   - each attempt opens a replication session with lock_timeout set and a
//     client-side deadline, and samples pg_blocking_pids of its walsender
//     while CREATE_REPLICATION_SLOT waits;
//   - a blocked attempt logs its blockers at Warn, closes both sessions (and
//     terminates the walsender, which would otherwise wait on with a
//     half-made slot), sleeps a jittered delay and tries again until
//     SlotRetry.MaxBlocked, then fails with a *SlotBlockedError;
//   - a full max_replication_slots is repaired once (a missing REPLICATION
//     attribute is a *PrivilegeError of the session's opener).

const (
	// slotLockKey is the advisory lock key for slot management: "siphon" in
	// ASCII followed by 0x0001.
	slotLockKey int64 = 0x736970686f6e0001
	// clientGrace is how long past lock_timeout the client waits before it
	// gives up on an attempt itself (a wait the server does not count as a
	// lock wait, or a network that went silent).
	clientGrace = 5 * time.Second
	// snapshotSlotPrefix starts temporary snapshot slot names; the "snap_"
	// part can never match baseSlotPattern, so sweeping never sees them.
	snapshotSlotPrefix = "siphon_snap_"
)

// baseSlotPattern matches the permanent physical slots CreateBaseSlot
// makes: "siphon_" and a lowercase ULID. Only these are ever swept.
// anyBaseSlotPattern matches their temporary slots too.
var (
	baseSlotPattern    = regexp.MustCompile(`^siphon_` + ulid.Pattern + `$`)
	anyBaseSlotPattern = regexp.MustCompile(`^siphon_(pending_)?` + ulid.Pattern + `$`)
)

// blockerList logs as one group per blocker.
type blockerList []Blocker

func (l blockerList) LogValue() slog.Value {
	attrs := make([]slog.Attr, len(l))
	for i, b := range l {
		attrs[i] = slog.Any(strconv.Itoa(i+1), b)
	}
	return slog.GroupValue(attrs...)
}

// attemptBlocked is one attempt that gave up waiting: for transactions
// (cause is the lock timeout or client deadline) or, with a nil cause, for
// the slot-management lock.
type attemptBlocked struct {
	blockers []Blocker
	cause    error
}

func (e *attemptBlocked) Error() string {
	msg := "gave up waiting for the slot-management lock"
	if e.cause != nil {
		msg = "blocked: " + e.cause.Error()
	}
	for i, b := range e.blockers {
		msg += listSep(i, ", by ") + b.String()
	}
	return msg
}

func (e *attemptBlocked) Unwrap() error { return e.cause }

// slotSpec says which slot to create.
type slotSpec struct {
	name     string
	export   bool // a temporary slot exporting a snapshot, its session kept open
	failover bool // a persistent slot that standbys synchronize (PostgreSQL 17+)
}

func (s slotSpec) command() string {
	if s.export {
		return "CREATE_REPLICATION_SLOT " + sqltext.Ident(s.name) + " TEMPORARY LOGICAL pgoutput (SNAPSHOT 'export')"
	}
	if s.failover {
		return "CREATE_REPLICATION_SLOT " + sqltext.Ident(s.name) + " LOGICAL pgoutput (SNAPSHOT 'nothing', FAILOVER true)"
	}
	return "CREATE_REPLICATION_SLOT " + sqltext.Ident(s.name) + " LOGICAL pgoutput (SNAPSHOT 'nothing')"
}

// createdSlot is what createSlot made, or found.
type createdSlot struct {
	existed  bool // another creator made it first
	point    canonical.Position
	snapshot string
	repl     *pgconn.PgConn // the open session of an exporting slot
	attempts int
}

// repairs remembers the self-repairs already tried: each runs once.
type repairs struct{ slots bool }

// slotCreated says what ensureSlot found or made.
type slotCreated struct {
	// Created is true when this call created the slot.
	Created bool
	// ConsistentPoint is the new slot's consistent point (zero when the slot
	// already existed).
	ConsistentPoint canonical.Position
}

// ensureSlot makes sure the publication and then the persistent logical
// slot exist (in that order: pgoutput reads publications through the
// historic catalog, so a publication created after the slot misses changes).
// A slot of that name that is not a pgoutput slot of this database is an
// error.
func (c *Conn) ensureSlot(ctx context.Context) (slotCreated, error) {
	spec, err := c.persistentSlotSpec(ctx)
	if err != nil {
		return slotCreated{}, err
	}
	var identities []replicaIdentity // what KeylessFull changed, over the attempts
	for tries := 1; ; tries++ {
		made, err := c.ensurePublication(ctx)
		if err != nil {
			return slotCreated{}, err
		}
		if made != nil {
			identities = append(identities, made.identities...)
			made.identities = identities
		}
		exists, err := checkSlot(ctx, c.pool, c.opts.slot)
		if err != nil {
			return slotCreated{}, wrapSlotErr("create slot", c.opts.slot, c.undoPublication(ctx, made, err))
		}
		if exists {
			return slotCreated{}, nil
		}
		s, err := c.createSlot(ctx, spec)
		if errors.Is(err, errPublicationGone) && tries < 3 {
			continue
		}
		if err != nil {
			// A failed call leaves no publication behind (see undoPublication).
			return slotCreated{}, wrapSlotErr("create slot", c.opts.slot, c.undoPublication(ctx, made, err))
		}
		if s.existed {
			return slotCreated{}, nil
		}
		c.log.Info("replication slot created", "slot", c.opts.slot, "consistent_point", s.point, "attempts", s.attempts)
		return slotCreated{Created: true, ConsistentPoint: s.point}, nil
	}
}

// errPublicationGone is an attempt to create the persistent slot that
// found, under the slot-management lock, that the publication is gone
// (dropped by a Detach, or by a failed call's undoPublication, after
// ensureSlot made sure of it): it is made again before the slot.
var errPublicationGone = errors.New("the publication was dropped while the slot was about to be created: create it again, then the slot")

// persistentSlotSpec says how to create the persistent slot: as a
// failover slot with WithFailoverSlot, which a server older than 17 refuses.
func (c *Conn) persistentSlotSpec(ctx context.Context) (slotSpec, error) {
	spec := slotSpec{name: c.opts.slot, failover: c.opts.failover}
	if !spec.failover {
		return spec, nil
	}
	server, err := c.serverVersion(ctx)
	if err != nil {
		return spec, wrapSlotErr("create slot", spec.name, fmt.Errorf("server version: %w", err))
	}
	return spec, needRelease("WithFailoverSlot", 17, server)
}

// snapshotSlot is a temporary logical slot whose replication session stays
// open and idle for the life of the snapshot it exported: the snapshot is
// valid only until that session runs another command or closes.
type snapshotSlot struct {
	Name            string             // siphon_snap_<random>
	SnapshotName    string             // for SET TRANSACTION SNAPSHOT and pg_dump --snapshot
	ConsistentPoint canonical.Position // rows in the snapshot are those committed at or before it
	// Anchored is true when the persistent slot existed before the
	// snapshot: streaming it from ConsistentPoint continues the snapshot.
	Anchored bool

	c         *Conn
	repl      *pgconn.PgConn
	closeOnce sync.Once
	closeErr  error
}

// createSnapshotSlot creates a temporary slot exporting a snapshot, with
// the same lock, timeouts and retries as the persistent slot. With anchor,
// it first makes sure the persistent slot exists (so streaming from the
// snapshot's consistent point continues with no gap); without, it only
// looks whether it does. The caller must Close it.
func (c *Conn) createSnapshotSlot(ctx context.Context, anchor bool) (*snapshotSlot, error) {
	anchored := anchor
	if anchor {
		if _, err := c.ensureSlot(ctx); err != nil {
			return nil, err
		}
	} else {
		exists, err := checkSlot(ctx, c.pool, c.opts.slot)
		if err != nil {
			return nil, wrapSlotErr("look up slot", c.opts.slot, err)
		}
		anchored = exists
	}
	var suffix [8]byte
	rand.Read(suffix[:])
	name := snapshotSlotPrefix + hex.EncodeToString(suffix[:])
	s, err := c.createSlot(ctx, slotSpec{name: name, export: true})
	if err != nil {
		return nil, wrapSlotErr("create snapshot slot", name, err)
	}
	c.log.Info("snapshot slot created", "slot", name, "snapshot", s.snapshot, "consistent_point", s.point, "attempts", s.attempts)
	return &snapshotSlot{Name: name, SnapshotName: s.snapshot, ConsistentPoint: s.point, Anchored: anchored, c: c, repl: s.repl}, nil
}

// Close closes the slot's replication session, which drops the temporary
// slot and ends the exported snapshot, and waits until the server has let
// go of it. It is safe to call more than once.
func (s *snapshotSlot) Close(ctx context.Context) error {
	s.closeOnce.Do(func() {
		// Cleaning up must happen even when the snapshot ended because ctx did.
		if err := closeAndEnd(s.c.pool, s.repl); err != nil {
			s.closeErr = errorf("siphon: close snapshot slot %q: %w", s.Name, err)
		}
	})
	return s.closeErr
}

// createSlot creates the slot spec names: one attempt after another until
// one succeeds, fails for a reason waiting cannot cure, or MaxBlocked has
// passed.
func (c *Conn) createSlot(ctx context.Context, spec slotSpec) (*createdSlot, error) {
	if err := c.checkWALLevel(); err != nil {
		return nil, err
	}
	r := c.opts.slotRetry
	floor := min(r.LockTimeout, 100*time.Millisecond) // the shortest attempt worth making
	start := time.Now()
	deadline := start.Add(r.MaxBlocked)
	var rep repairs
	var blockers []Blocker
	for attempt := 1; ; attempt++ {
		s, err := c.attemptSlot(ctx, spec, deadline, floor, &rep)
		var blocked *attemptBlocked
		if !errors.As(err, &blocked) {
			if s != nil {
				s.attempts = attempt
			}
			return s, err
		}
		if len(blocked.blockers) > 0 {
			blockers = blocked.blockers
		}
		giveUp := &SlotBlockedError{Slot: spec.name, Waited: time.Since(start), Attempts: attempt, Blockers: blockers}
		remaining := time.Until(deadline)
		switch {
		case ctx.Err() != nil: // the caller stopped waiting: still say who blocked
			return nil, fmt.Errorf("%w, %w", ctx.Err(), giveUp)
		case remaining < floor:
			return nil, giveUp
		}
		wait := min(jitter(r.RetryDelay), remaining-floor)
		c.log.Warn("replication slot creation blocked, retrying", "slot", spec.name, "attempt", attempt,
			"waited", time.Since(start).Round(time.Millisecond), "retry_in", wait.Round(time.Millisecond),
			"blockers", blockerList(blocked.blockers))
		if err := sleepCtx(ctx, wait); err != nil {
			return nil, fmt.Errorf("%w, %w", err, giveUp)
		}
	}
}

// attemptSlot makes one attempt under the slot-management lock, repairing
// a missing privilege or a full slot table once each.
func (c *Conn) attemptSlot(ctx context.Context, spec slotSpec, deadline time.Time, floor time.Duration, rep *repairs) (*createdSlot, error) {
	lock, err := c.lockSlots(ctx, deadline)
	if err != nil {
		return nil, err
	}
	defer lock.release()
	if !spec.export {
		if exists, err := checkSlot(ctx, lock.conn, spec.name); err != nil || exists {
			return &createdSlot{existed: exists}, err
		}
		// The publication comes first (see ensureSlot); the lock keeps it
		// from being dropped from now until the slot exists.
		var pub bool
		if err := lock.conn.QueryRow(ctx, "SELECT EXISTS (SELECT FROM pg_publication WHERE pubname = $1)", c.opts.publication).Scan(&pub); err != nil {
			return nil, fmt.Errorf("look up publication %q: %w", c.opts.publication, err)
		}
		if !pub {
			return nil, errPublicationGone
		}
	}
	for {
		s, err := c.createOnce(ctx, lock, spec, deadline, floor)
		if err == nil {
			return s, nil
		}
		if !spec.export && pgerr.Is(err, pgerrcode.DuplicateObject) { // made meanwhile from another database
			exists, err := checkSlot(ctx, lock.conn, spec.name)
			return &createdSlot{existed: exists}, err
		}
		retry, err := c.repair(ctx, lock, err, rep)
		if !retry {
			return nil, err
		}
	}
}

// createOnce runs CREATE_REPLICATION_SLOT on a new replication session with
// lock_timeout (LockTimeout, or what is left before deadline, at least
// floor) and a client-side deadline. On failure nothing is left: the
// session is closed and its walsender ended.
func (c *Conn) createOnce(ctx context.Context, lock *slotLock, spec slotSpec, deadline time.Time, floor time.Duration) (*createdSlot, error) {
	started := time.Now()
	repl, err := c.newReplicationSession(ctx, nil)
	if err != nil {
		return nil, err
	}
	lockTimeout := max(min(c.opts.slotRetry.LockTimeout, time.Until(deadline)), floor)
	res, blockers, err := c.runCreate(ctx, lock, repl, spec, lockTimeout)
	if err == nil {
		return finishCreate(repl, spec, res)
	}
	discard(lock, repl)
	switch {
	case ctx.Err() != nil && len(blockers) == 0:
		return nil, ctx.Err()
	case ctx.Err() != nil:
		return nil, &attemptBlocked{blockers: blockers, cause: ctx.Err()}
	case pgerr.Is(err, pgerrcode.LockNotAvailable, pgerrcode.QueryCanceled) || errors.Is(err, errNoAnswer):
		if len(blockers) == 0 { // the wait was not caught: name every older transaction
			blockers, _ = lock.query(olderTransactionsQuery, started)
		}
		return nil, &attemptBlocked{blockers: blockers, cause: err}
	}
	return nil, err
}

// errNoAnswer is an attempt the client gave up on: no answer clientGrace
// past lock_timeout.
var errNoAnswer = errors.New("no answer from the server within lock_timeout")

// runCreate sends the command and, while it waits, asks the lock session
// who blocks the walsender. The command runs on a context of its own, so
// that when ctx ends the walsender is asked once more before pgconn
// cancels it.
func (c *Conn) runCreate(ctx context.Context, lock *slotLock, repl *pgconn.PgConn, spec slotSpec,
	lockTimeout time.Duration) (pglogrepl.CreateReplicationSlotResult, []Blocker, error) {
	var none pglogrepl.CreateReplicationSlotResult
	set := "SET lock_timeout = " + strconv.FormatInt(lockTimeout.Milliseconds(), 10)
	if spec.export {
		// The session idles, in the transaction of the snapshot it
		// exports, for the snapshot's whole life: no timeout of the role's
		// or the database's may end it before every session that imports
		// the snapshot (pg_dump's, the copy's) has.
		set = noTimeouts(false) + "; SET idle_session_timeout = 0; " + set
	}
	if _, err := repl.Exec(ctx, set).ReadAll(); err != nil {
		return none, nil, fmt.Errorf("set lock_timeout: %w", err)
	}
	cmdCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), lockTimeout+clientGrace)
	defer cancel()
	type outcome struct {
		res pglogrepl.CreateReplicationSlotResult
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		res, err := pglogrepl.ParseCreateReplicationSlot(repl.Exec(cmdCtx, spec.command()))
		done <- outcome{res, err}
	}()
	tick := time.NewTicker(min(max(lockTimeout/4, 10*time.Millisecond), 500*time.Millisecond))
	defer tick.Stop()
	var blockers []Blocker
	sample := func() {
		if b, err := lock.blockersOf(repl.PID()); err == nil && len(b) > 0 {
			blockers = b
		}
	}
	for {
		select {
		case o := <-done:
			if o.err != nil && cmdCtx.Err() != nil {
				sample() // the walsender may wait on after its client gave up
				return none, blockers, fmt.Errorf("%w (%w)", errNoAnswer, o.err)
			}
			return o.res, blockers, o.err
		case <-ctx.Done():
			sample()
			cancel()
			o := <-done
			return none, blockers, o.err
		case <-tick.C:
			sample()
		}
	}
}

// finishCreate parses the result and closes the session, unless it must
// stay open to keep an exported snapshot alive.
func finishCreate(repl *pgconn.PgConn, spec slotSpec, res pglogrepl.CreateReplicationSlotResult) (*createdSlot, error) {
	pos, err := canonical.ParsePosition(res.ConsistentPoint)
	if err != nil || !spec.export {
		closeSession(repl)
	}
	if err != nil {
		return nil, fmt.Errorf("consistent point: %w", err)
	}
	s := &createdSlot{point: pos, snapshot: res.SnapshotName}
	if spec.export {
		s.repl = repl
	}
	return s, nil
}

// discard closes a failed attempt's replication session and ends its
// walsender: one whose client went away keeps waiting, with its half-made
// slot, until the transactions it waits for end.
func discard(lock *slotLock, repl *pgconn.PgConn) {
	closeAndEnd(lock.conn, repl)
}

// repair fixes what err reports, once: max_replication_slots reached. It reports whether to try
// again, or the error to return.
func (c *Conn) repair(ctx context.Context, lock *slotLock, err error, rep *repairs) (bool, error) {
	switch {
	case pgerr.Is(err, pgerrcode.ConfigurationLimitExceeded):
		if !rep.slots {
			rep.slots = true
			dropped, sweepErr := sweepLocked(ctx, lock.conn, c.opts.slot)
			if sweepErr != nil {
				return false, fmt.Errorf("%w (dropping orphan slots to make room failed: %w)", err, sweepErr)
			}
			if len(dropped) > 0 {
				c.log.Warn("all replication slots were in use: dropped orphan slots", "dropped", dropped)
				return true, nil
			}
		}
		var limit string
		lock.conn.QueryRow(ctx, "SELECT pg_catalog.current_setting('max_replication_slots')").Scan(&limit)
		return false, fmt.Errorf("all replication slots are in use (max_replication_slots = %s) and siphon has no orphan slot to drop:"+
			" raise max_replication_slots (takes a server restart) or drop unused slots (see pg_replication_slots): %w", limit, err)
	case pgerr.Is(err, pgerrcode.TooManyConnections):
		return false, fmt.Errorf("no free WAL sender or connection: raise max_wal_senders (or max_connections), or end idle replication sessions: %w", err)
	}
	return false, err
}

// slotRow is a slot's row in pg_replication_slots, as siphon reads it.
type slotRow struct {
	exists    bool
	physical  bool
	plugin    string
	database  string
	here      bool // the slot is of the session's database
	temporary bool
	active    bool
	confirmed canonical.Position
	walStatus string
}

// readSlotRow reads the slot name's row; exists is false when there is none.
func readSlotRow(ctx context.Context, q querier, name string) (slotRow, error) {
	var (
		s         slotRow
		typ       string
		confirmed *string
		walStatus *string
	)
	err := q.QueryRow(ctx, `SELECT slot_type, coalesce(plugin, ''), coalesce(database, ''),
			coalesce(database = pg_catalog.current_database(), false), temporary, active, confirmed_flush_lsn::text, wal_status
		FROM pg_replication_slots WHERE slot_name = $1`, name).
		Scan(&typ, &s.plugin, &s.database, &s.here, &s.temporary, &s.active, &confirmed, &walStatus)
	if errors.Is(err, pgx.ErrNoRows) {
		return s, nil
	}
	if err != nil {
		return s, fmt.Errorf("read slot %q: %w", name, err)
	}
	s.exists, s.physical = true, typ == "physical"
	if walStatus != nil {
		s.walStatus = *walStatus
	}
	if confirmed != nil {
		if s.confirmed, err = canonical.ParsePosition(*confirmed); err != nil {
			return s, fmt.Errorf("read slot %q: %w", name, err)
		}
	}
	return s, nil
}

// unusable returns a *SlotConfigError when the existing slot name cannot
// be streamed from by this session's database, nil when it can.
func (s slotRow) unusable(name string) error {
	var problem string
	switch {
	case s.physical:
		problem = "is a physical slot"
	case !s.here:
		problem = fmt.Sprintf("belongs to database %q", s.database)
	case s.plugin != "pgoutput":
		problem = fmt.Sprintf("uses output plugin %q, not pgoutput", s.plugin)
	case s.temporary:
		problem = "is a temporary slot of another session"
	default:
		return nil
	}
	return &SlotConfigError{Slot: name, Problem: problem}
}

// checkSlot reports whether the persistent slot name exists; one that
// siphon cannot stream from is a *SlotConfigError.
func checkSlot(ctx context.Context, q querier, name string) (bool, error) {
	s, err := readSlotRow(ctx, q, name)
	if err != nil || !s.exists {
		return false, err
	}
	if err := s.unusable(name); err != nil {
		return false, err
	}
	return true, nil
}

func wrapSlotErr(op, slot string, err error) error {
	if err == nil {
		return nil
	}
	return errorf("siphon: %s %q: %w", op, slot, err)
}

// jitter returns d times a random factor between 1 and 5.
func jitter(d time.Duration) time.Duration {
	return d + time.Duration(mathrand.Float64()*4*float64(d))
}

// slotLock is a dedicated session holding the slot-management advisory
// lock, at session level: outside any transaction, so that
// idle_in_transaction_session_timeout cannot end it.
type slotLock struct {
	conn *pgx.Conn
	held bool
}

// lockSlots opens a session and takes the lock, trying until deadline (no
// server-side wait is left behind when ctx ends). Past the deadline it
// returns an *attemptBlocked naming the holder.
func (c *Conn) lockSlots(ctx context.Context, deadline time.Time) (*slotLock, error) {
	conn, err := c.newSession(ctx)
	if err != nil {
		return nil, err
	}
	l := &slotLock{conn: conn}
	for pause := 5 * time.Millisecond; ; pause = min(2*pause, 100*time.Millisecond) {
		if err := conn.QueryRow(ctx, "SELECT pg_catalog.pg_try_advisory_lock($1)", slotLockKey).Scan(&l.held); err != nil {
			l.release()
			return nil, fmt.Errorf("take the slot-management lock: %w", err)
		}
		if l.held {
			return l, nil
		}
		if time.Until(deadline) < pause {
			holders, _ := l.query(lockHoldersQuery, slotLockKey)
			l.release()
			return nil, &attemptBlocked{blockers: holders}
		}
		if err := sleepCtx(ctx, jitter(pause/2)); err != nil {
			l.release()
			return nil, err
		}
	}
}

// release unlocks and closes the session, on a context of its own so that
// it runs even when the caller's has ended. Ending the session would
// release the lock anyway.
func (l *slotLock) release() {
	ctx, cancel := cleanupContext(context.Background())
	defer cancel()
	if l.held {
		l.conn.Exec(ctx, "SELECT pg_catalog.pg_advisory_unlock($1)", slotLockKey)
		l.held = false
	}
	closeConn(ctx, l.conn.PgConn())
}

// blockersOf lists the sessions (and prepared transactions) that the
// walsender pid waits for.
func (l *slotLock) blockersOf(pid uint32) ([]Blocker, error) {
	return l.query(blockersQuery, int64(pid))
}

// query runs a blocker query on a short context of its own: an attempt
// that times out must not break the lock session mid-query.
func (l *slotLock) query(sql string, arg any) ([]Blocker, error) {
	ctx, cancel := cleanupContext(context.Background())
	defer cancel()
	rows, err := l.conn.Query(ctx, sql, arg)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Blocker
	for rows.Next() {
		var b Blocker
		var xid, age *int64
		var xactStart, queryStart *time.Time
		if err := rows.Scan(&b.PID, &xid, &age, &b.State, &b.Database, &b.User, &b.Application,
			&xactStart, &queryStart, &b.Query); err != nil {
			return nil, err
		}
		if xid != nil && age != nil {
			b.XID, b.XIDAge = uint32(*xid), *age
		}
		if xactStart != nil {
			b.TransactionStart = *xactStart
		}
		if queryStart != nil {
			b.QueryStart = *queryStart
		}
		out = append(out, b)
	}
	return out, rows.Err()
}

const blockerColumns = `a.pid, a.backend_xid::text::int8, pg_catalog.age(a.backend_xid)::int8, coalesce(a.state, '')::text,
	coalesce(a.datname, '')::text, coalesce(a.usename, '')::text, coalesce(a.application_name, '')::text,
	a.xact_start, a.query_start, pg_catalog.left(coalesce(a.query, ''), 200)::text`

// blockersQuery lists who the walsender $1 waits for. A prepared
// transaction shows as pid 0 in pg_blocking_pids; the transaction ID the
// walsender waits on (pg_locks) finds it in pg_prepared_xacts.
const blockersQuery = `
SELECT ` + blockerColumns + `
FROM pg_stat_activity a WHERE a.pid = ANY (pg_catalog.pg_blocking_pids($1))
UNION ALL
SELECT 0, p.transaction::text::int8, pg_catalog.age(p.transaction)::int8, 'prepared', p.database::text, p.owner::text, '',
       p.prepared, p.prepared, pg_catalog.left('PREPARE TRANSACTION ' || pg_catalog.quote_literal(p.gid), 200)
FROM pg_prepared_xacts p
WHERE p.transaction IN (SELECT transactionid FROM pg_locks
                        WHERE pid = $1 AND locktype = 'transactionid' AND NOT granted)
ORDER BY 1`

// olderTransactionsQuery lists the transactions holding an xid since
// before $1: those a slot creation started at $1 waits for.
const olderTransactionsQuery = `
SELECT ` + blockerColumns + `
FROM pg_stat_activity a WHERE a.backend_xid IS NOT NULL AND a.xact_start < $1 AND a.pid <> pg_catalog.pg_backend_pid()
UNION ALL
SELECT 0, p.transaction::text::int8, pg_catalog.age(p.transaction)::int8, 'prepared', p.database::text, p.owner::text, '',
       p.prepared, p.prepared, pg_catalog.left('PREPARE TRANSACTION ' || pg_catalog.quote_literal(p.gid), 200)
FROM pg_prepared_xacts p WHERE p.prepared < $1
ORDER BY 1`

// lockHoldersQuery lists the sessions holding the slot-management lock $1.
const lockHoldersQuery = `
SELECT ` + blockerColumns + `
FROM pg_stat_activity a
WHERE a.pid <> pg_catalog.pg_backend_pid() AND a.pid IN (
	SELECT l.pid FROM pg_locks l
	WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
	  AND l.database = (SELECT oid FROM pg_database WHERE datname = pg_catalog.current_database())
	  AND ((l.classid::int8 << 32) | l.objid::int8) = $1)`
