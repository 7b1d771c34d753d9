package siphon

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"

	"github.com/siphondb/siphon/canonical"
	"github.com/siphondb/siphon/internal/pgerr"
	"github.com/siphondb/siphon/internal/sqltext"
	"github.com/siphondb/siphon/internal/ulid"
)

// Slots that pin WAL: physical base slots, dropping, sweeping orphans, and
// the health listing users alert on. Creation of logical slots is in
// slots.go.

// IncrementalBaseInfo describes the physical slot that pins WAL from the
// start of a base backup, and the WAL range the base covers.
type IncrementalBaseInfo struct {
	// Slot is the physical slot, "siphon_" and a lowercase ULID.
	Slot string `json:"slot"`
	// WALStart is where the slot started reserving WAL.
	WALStart canonical.Position `json:"wal_start"`
	// WALEnd is the server's WAL insert position when [Conn.CaptureBaseEnd]
	// ran, past every transaction committed before; zero until then.
	WALEnd canonical.Position `json:"wal_end,omitzero"`
}

// A base slot is made in two steps, so that no orphan can be left: while
// the base backup runs, a temporary slot ("siphon_pending_<ulid>") held by
// a session of the Conn pins the WAL (it goes with that session, however
// the process ends); [Conn.CaptureBaseEnd] copies it, with the WAL it
// reserves, into the permanent "siphon_<ulid>" once the base is complete.
// Every permanent base slot is therefore the base of a chain that someone
// completed, and nothing drops one but its chain's seal ([Conn.DropSlot]).

// pendingBasePrefix starts the name of the temporary slot of a base slot
// whose end is not captured yet.
const pendingBasePrefix = "siphon_pending_"

// CreateBaseSlot makes a base slot named "siphon_" and a lowercase ULID
// that reserves WAL at once, and returns it with WALStart set. Until
// [Conn.CaptureBaseEnd] on this Conn completes it, the slot is a temporary
// one held by a session of the Conn, under the name "siphon_pending_" and
// the ULID: if the base is abandoned (the Conn closed, the process
// killed), it disappears by itself. Once complete, it pins WAL until
// [Conn.DropSlot] drops it. A missing REPLICATION privilege or a full
// max_replication_slots is repaired once, as for logical slots.
func (c *Conn) CreateBaseSlot(ctx context.Context) (*IncrementalBaseInfo, error) {
	id := ulid.New(time.Now())
	name, pending := "siphon_"+id, pendingBasePrefix+id
	start := time.Now()
	lock, err := c.lockSlots(ctx, start.Add(c.opts.slotRetry.MaxBlocked))
	if err != nil {
		return nil, wrapSlotErr("create base slot", name, asSlotBlocked(err, name, start))
	}
	defer lock.release()
	hold, err := c.newSession(ctx)
	if err != nil {
		return nil, wrapSlotErr("create base slot", name, err)
	}
	var rep repairs
	for {
		var lsn string
		err := hold.QueryRow(ctx, "SELECT lsn::text FROM pg_catalog.pg_create_physical_replication_slot($1, true, true)", pending).Scan(&lsn)
		if err == nil {
			pos, err := canonical.ParsePosition(lsn)
			if err != nil {
				closeSession(hold.PgConn())
				return nil, wrapSlotErr("create base slot", name, err)
			}
			c.bases.hold(name, hold)
			c.log.Info("base slot created", "slot", name, "wal_start", pos)
			return &IncrementalBaseInfo{Slot: name, WALStart: pos}, nil
		}
		if retry, err := c.repair(ctx, lock, err, &rep); !retry {
			closeSession(hold.PgConn())
			return nil, wrapSlotErr("create base slot", name, err)
		}
	}
}

// heldBases are the sessions that hold the temporary slots of the base
// slots a Conn made and has not completed.
type heldBases struct {
	mu       sync.Mutex
	sessions map[string]*pgx.Conn // by the base slot's name
}

func (h *heldBases) hold(name string, conn *pgx.Conn) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.sessions == nil {
		h.sessions = map[string]*pgx.Conn{}
	}
	h.sessions[name] = conn
}

// take removes and returns the session holding name's temporary slot, or
// nil.
func (h *heldBases) take(name string) *pgx.Conn {
	h.mu.Lock()
	defer h.mu.Unlock()
	conn := h.sessions[name]
	delete(h.sessions, name)
	return conn
}

// release closes every session and waits, asking q, until its backend is
// gone: a backend drops its temporary slot as it exits.
func (h *heldBases) release(q querier) {
	h.mu.Lock()
	sessions := h.sessions
	h.sessions = nil
	h.mu.Unlock()
	for _, conn := range sessions {
		closeAndEnd(q, conn.PgConn())
	}
}

// CaptureBaseEnd completes a base slot: it checks that the slot still
// reserves the WAL from info.WALStart on, makes it permanent (a slot
// CreateBaseSlot made on this Conn is copied, with the WAL it reserves,
// from its temporary slot), and records the server's current WAL insert
// position in info.WALEnd (not pg_current_wal_lsn, the write position,
// which lags commits under synchronous_commit=off). A slot that is gone or
// lost its WAL means the base cannot be continued: take a new one.
func (c *Conn) CaptureBaseEnd(ctx context.Context, info *IncrementalBaseInfo) error {
	if info == nil {
		return errorf("siphon: capture base end: the base info: %w (pass what CreateBaseSlot returned)", ErrNilArgument)
	}
	held := c.bases.take(info.Slot)
	slot := info.Slot
	if held != nil {
		defer closeSession(held.PgConn())
		slot = pendingBasePrefix + strings.TrimPrefix(info.Slot, "siphon_")
	}
	var restart, status, current string
	err := c.pool.QueryRow(ctx, `SELECT coalesce(restart_lsn::text, ''), coalesce(wal_status, ''), pg_catalog.pg_current_wal_insert_lsn()::text
		FROM pg_replication_slots WHERE slot_name = $1 AND slot_type = 'physical'`, slot).Scan(&restart, &status, &current)
	if errors.Is(err, pgx.ErrNoRows) {
		return errorf("siphon: capture base end of slot %q: the slot is gone (dropped, or its session ended), so WAL since %v may be recycled: take a new base backup", info.Slot, info.WALStart)
	}
	if err != nil {
		return errorf("siphon: capture base end of slot %q: %w", info.Slot, err)
	}
	restartPos, err := canonical.ParsePosition(restart)
	if status == "lost" || err != nil || restartPos > info.WALStart {
		return errorf("siphon: capture base end of slot %q: the slot no longer reserves WAL from %v (restart %q, wal_status %q): take a new base backup", info.Slot, info.WALStart, restart, status)
	}
	if held != nil {
		if _, err := held.Exec(ctx, "SELECT pg_catalog.pg_copy_physical_replication_slot($1, $2, false)", slot, info.Slot); err != nil {
			hint := ""
			if pgerr.Is(err, pgerrcode.ConfigurationLimitExceeded) {
				hint = ": completing a base slot takes one more slot for a moment; raise max_replication_slots, or drop unused slots"
			}
			return errorf("siphon: capture base end of slot %q: make it permanent%s: %w", info.Slot, hint, err)
		}
		// Dropped now rather than when the session's backend exits, which
		// may be after CaptureBaseEnd returns.
		if _, err := held.Exec(ctx, "SELECT pg_catalog.pg_drop_replication_slot($1)", slot); err != nil {
			return errorf("siphon: capture base end of slot %q: drop its temporary slot: %w", info.Slot, err)
		}
	}
	end, err := canonical.ParsePosition(current)
	if err != nil {
		return errorf("siphon: capture base end of slot %q: %w", info.Slot, err)
	}
	info.WALEnd = end
	c.log.Info("base end captured", "slot", info.Slot, "wal_start", info.WALStart, "wal_end", end)
	return nil
}

// DropSlot drops the replication slot name. A slot that does not exist is
// not an error; one in use by a session returns an error wrapping
// [ErrSlotInUse].
func (c *Conn) DropSlot(ctx context.Context, name string) error {
	if !slotNamePattern.MatchString(name) {
		return errorf("siphon: drop slot %q: not a slot siphon names: use 1 to 63 characters of a-z, 0-9 and _", name)
	}
	_, err := c.pool.Exec(ctx, "SELECT pg_catalog.pg_drop_replication_slot($1)", name)
	switch {
	case err == nil:
		c.log.Info("replication slot dropped", "slot", name)
		return nil
	case pgerr.Is(err, pgerrcode.UndefinedObject):
		return nil
	case pgerr.Is(err, pgerrcode.ObjectInUse):
		return errorf("siphon: drop slot %q: %w (%v): stop the session that uses it first", name, ErrSlotInUse, err)
	}
	return errorf("siphon: drop slot %q: %w", name, c.noReplication(err))
}

// SweepOrphanSlots drops siphon's base slots that can no longer serve
// any chain: inactive, non-temporary physical slots named "siphon_" and a
// ULID whose WAL the server removed (wal_status "lost"), which pin nothing
// but take a place in max_replication_slots. A base slot that still
// reserves its WAL is the base of a chain someone completed (see
// [Conn.CreateBaseSlot]) and is never swept: drop it with [Conn.DropSlot]
// when its chain is sealed. It never drops the persistent change-stream
// slot, temporary slots, or slots of any other name, and skips a slot that
// became active after the scan. It holds the slot-management lock, so it
// does not race slot creation, and returns how many slots it dropped.
func (c *Conn) SweepOrphanSlots(ctx context.Context) (int, error) {
	lock, err := c.lockSlots(ctx, time.Now().Add(c.opts.slotRetry.MaxBlocked))
	if err != nil {
		return 0, errorf("siphon: sweep orphan slots: %w", err)
	}
	defer lock.release()
	dropped, err := sweepLocked(ctx, lock.conn, c.opts.slot)
	if len(dropped) > 0 {
		c.log.Info("orphan slots swept", "dropped", dropped)
	}
	if err != nil {
		return len(dropped), errorf("siphon: sweep orphan slots: %w", err)
	}
	return len(dropped), nil
}

// sweepLocked drops the base slots that lost their WAL; the caller holds
// the lock.
func sweepLocked(ctx context.Context, q querier, cdcSlot string) ([]string, error) {
	rows, err := q.Query(ctx, `SELECT slot_name::text FROM pg_replication_slots
		WHERE slot_type = 'physical' AND NOT active AND NOT temporary AND wal_status = 'lost'
		  AND slot_name ~ $1 AND slot_name <> $2
		ORDER BY slot_name`, baseSlotPattern.String(), cdcSlot)
	if err != nil {
		return nil, err
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, err
	}
	return dropOrphans(ctx, q, names)
}

// dropOrphans drops the named slots, skipping any that became active (or
// went away) since they were listed.
func dropOrphans(ctx context.Context, q querier, names []string) ([]string, error) {
	var dropped []string
	for _, name := range names {
		_, err := q.Exec(ctx, "SELECT pg_catalog.pg_drop_replication_slot($1)", name)
		switch {
		case err == nil:
			dropped = append(dropped, name)
		case pgerr.Is(err, pgerrcode.ObjectInUse, pgerrcode.UndefinedObject):
		default:
			return dropped, fmt.Errorf("drop slot %q: %w", name, err)
		}
	}
	return dropped, nil
}

// SlotKind says what siphon uses a slot for.
type SlotKind string

// Kinds of siphon slots.
const (
	SlotChangeStream SlotKind = "change_stream" // the persistent logical slot named by WithSlot
	SlotBase         SlotKind = "base"          // a physical slot from CreateBaseSlot
	SlotSnapshot     SlotKind = "snapshot"      // a temporary slot held open for a snapshot
)

// SlotInfo describes one of siphon's replication slots, for monitoring: a
// slot that is not consumed keeps WAL on the server's disk.
type SlotInfo struct {
	Name      string
	Kind      SlotKind
	Active    bool // a session uses it now
	ActivePID int  // that session's process ID, or 0
	Temporary bool
	// RestartPosition is the oldest WAL position the slot keeps.
	RestartPosition canonical.Position
	// ConfirmedPosition is how far the consumer acknowledged (logical
	// slots only; zero for physical ones).
	ConfirmedPosition canonical.Position
	// WALStatus is pg_replication_slots.wal_status: "reserved", "extended",
	// "unreserved" (about to lose WAL), or "lost" (the slot is unusable).
	WALStatus string
	// RetainedBytes is how much WAL the slot holds back: the server's WAL
	// insert position minus RestartPosition.
	RetainedBytes int64
	// SafeBytes is how much more WAL can be written before the slot risks
	// "lost" under max_slot_wal_keep_size; -1 when that setting is off.
	SafeBytes int64
	// CreatedAt is when a base slot was created (from its name); zero for
	// other kinds.
	CreatedAt time.Time
}

// Slots lists siphon's replication slots: the change-stream slot of this
// database, snapshot slots of this database, and base slots (physical, so
// server-wide; a base being taken shows as a temporary slot named
// "siphon_pending_" and its ULID), in name order. Alert on WALStatus and
// RetainedBytes before a slot fills the disk.
func (c *Conn) Slots(ctx context.Context) ([]SlotInfo, error) {
	rows, err := c.pool.Query(ctx, `
		SELECT slot_name::text, slot_type, active, coalesce(active_pid, 0), temporary,
		       coalesce(restart_lsn::text, ''), coalesce(confirmed_flush_lsn::text, ''), coalesce(wal_status, ''),
		       coalesce(pg_catalog.pg_wal_lsn_diff(CASE WHEN pg_catalog.pg_is_in_recovery() THEN pg_catalog.pg_last_wal_replay_lsn()
		                                     ELSE pg_catalog.pg_current_wal_insert_lsn() END, restart_lsn), 0)::int8,
		       coalesce(safe_wal_size, -1)
		FROM pg_replication_slots
		WHERE (slot_type = 'logical' AND database = pg_catalog.current_database() AND (slot_name = $1 OR slot_name LIKE $2))
		   OR (slot_type = 'physical' AND slot_name ~ $3)
		ORDER BY slot_name`, c.opts.slot, strings.ReplaceAll(snapshotSlotPrefix, "_", `\_`)+"%", anyBaseSlotPattern.String())
	if err != nil {
		return nil, errorf("siphon: list slots: %w", err)
	}
	defer rows.Close()
	var out []SlotInfo
	for rows.Next() {
		s, err := c.scanSlot(rows)
		if err != nil {
			return nil, errorf("siphon: list slots: %w", err)
		}
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		return nil, errorf("siphon: list slots: %w", err)
	}
	return out, nil
}

func (c *Conn) scanSlot(rows interface{ Scan(...any) error }) (SlotInfo, error) {
	var s SlotInfo
	var typ, restart, confirmed string
	if err := rows.Scan(&s.Name, &typ, &s.Active, &s.ActivePID, &s.Temporary, &restart, &confirmed,
		&s.WALStatus, &s.RetainedBytes, &s.SafeBytes); err != nil {
		return s, err
	}
	for _, p := range []struct {
		text string
		pos  *canonical.Position
	}{{restart, &s.RestartPosition}, {confirmed, &s.ConfirmedPosition}} {
		if p.text == "" {
			continue
		}
		pos, err := canonical.ParsePosition(p.text)
		if err != nil {
			return s, err
		}
		*p.pos = pos
	}
	switch {
	case typ == "physical":
		s.Kind = SlotBase
		s.CreatedAt, _ = ulid.Time(strings.TrimPrefix(strings.TrimPrefix(s.Name, pendingBasePrefix), "siphon_"))
	case s.Name == c.opts.slot:
		s.Kind = SlotChangeStream
	default:
		s.Kind = SlotSnapshot
	}
	return s, nil
}

// asSlotBlocked turns a lock wait that ran out into a *SlotBlockedError.
func asSlotBlocked(err error, slot string, start time.Time) error {
	var blocked *attemptBlocked
	if errors.As(err, &blocked) {
		return &SlotBlockedError{Slot: slot, Waited: time.Since(start), Attempts: 1, Blockers: blocked.blockers}
	}
	return err
}

// Detach removes what siphon made on the source for this Conn's slot: the
// persistent slot; then the publication and its inserts-only companion
// (see [WithKeylessTables]) when no other change-stream slot of this
// database remains that may read them (one that does keeps them, and
// Detach logs which at Info: a publication without a slot pins no WAL);
// and the schema capture (see [Conn.InstallSchemaCapture]) once no
// publication it looks after exists any more. The Detach that drops the
// database's last change-stream slot also drops every publication siphon
// created and marked there (a comment; publications of earlier versions,
// or made while an older schema capture was installed, carry none) that
// the role may drop, which no slot can read any more (those other Conns
// kept), and, as a superuser, the capture and schema siphon: whatever the
// order in which two Conns detach, nothing of siphon's stays.
//
// It refuses, changing nothing, while the slot is in use (a stream runs:
// stop it first), with an error wrapping [ErrSlotInUse]. What the role may
// not remove stays, and Detach removes the rest and returns a
// [*DetachIncompleteError] saying what stays and who may remove it: the
// slot (and with it the publication it reads) for a role without
// REPLICATION, a publication another role owns. The capture, which only a
// superuser may remove, stays for any other role with a warning saying
// so. Base slots belong to their chains (drop each with [Conn.DropSlot]
// when its chain is sealed); temporary slots go with their sessions.
// Afterwards no stream, incremental or chain of this slot can continue:
// take a new snapshot or full backup to start again. What was applied into
// targets is theirs (see [Conn.ResetAppliedPosition]).
func (c *Conn) Detach(ctx context.Context) error {
	lock, err := c.lockSlots(ctx, time.Now().Add(c.opts.slotRetry.MaxBlocked))
	if err != nil {
		return errorf("siphon: detach: %w", err)
	}
	defer lock.release()
	d := &DetachIncompleteError{}
	slotGone, err := c.detachSlot(ctx, lock.conn, d)
	if err != nil {
		return errorf("siphon: detach: %w", err)
	}
	others, err := streamSlots(ctx, lock.conn)
	if err != nil {
		return errorf("siphon: detach: %w", err)
	}
	switch {
	case !slotGone:
		d.Remaining = append(d.Remaining, fmt.Sprintf("publication %q: kept while the slot, which reads it, stays", c.opts.publication))
	case len(others) > 0:
		c.log.Info("publication kept: other slots of this database may read it (the Detach that leaves the database without slots drops it if siphon marked it; otherwise Detach again once they are gone)",
			"publication", c.opts.publication, "slots", others)
	default:
		if err := c.detachPublication(ctx, lock.conn, d); err != nil {
			return errorf("siphon: detach: %w", err)
		}
		if err := c.dropMadePublications(ctx, lock.conn, d); err != nil {
			return errorf("siphon: detach: %w", err)
		}
	}
	if slotGone {
		if err := c.removeCapture(ctx, lock.conn, len(others) == 0); err != nil {
			return errorf("siphon: detach: remove the schema capture: %w", err)
		}
	}
	if len(d.Remaining) > 0 {
		c.log.Warn("detached in part", "removed", d.Removed, "remaining", d.Remaining)
		return d
	}
	c.log.Info("detached", "slot", c.opts.slot, "publication", c.opts.publication)
	return nil
}

// detachSlot drops the Conn's slot and reports whether it is gone. A slot
// the role may not drop (it lacks REPLICATION) stays, and d says so.
func (c *Conn) detachSlot(ctx context.Context, q querier, d *DetachIncompleteError) (bool, error) {
	// Dropping needs REPLICATION even where there is nothing to drop.
	s, err := readSlotRow(ctx, q, c.opts.slot)
	if err != nil || !s.exists {
		return err == nil, err
	}
	err = c.DropSlot(ctx, c.opts.slot)
	switch {
	case err == nil:
		d.Removed = append(d.Removed, fmt.Sprintf("slot %q", c.opts.slot))
		return true, nil
	case pgerr.Is(err, pgerrcode.InsufficientPrivilege):
		d.Remaining = append(d.Remaining, fmt.Sprintf("slot %q: dropping it needs the REPLICATION privilege, which role %q lacks: "+
			"have a superuser run ALTER ROLE %s WITH REPLICATION and Detach again, or run Detach as a role that has it",
			c.opts.slot, c.config.User, sqltext.Ident(c.config.User)))
		return false, nil
	}
	return false, err
}

// detachPublication drops the Conn's publication and its inserts-only
// companion. One that another role owns stays, and d says so.
func (c *Conn) detachPublication(ctx context.Context, q querier, d *DetachIncompleteError) error {
	var owner string
	err := q.QueryRow(ctx, "SELECT pg_catalog.pg_get_userbyid(pubowner)::text FROM pg_publication WHERE pubname = $1", c.opts.publication).Scan(&owner)
	if errors.Is(err, pgx.ErrNoRows) {
		owner, err = "", nil
	}
	if err != nil {
		return fmt.Errorf("look up publication %q: %w", c.opts.publication, err)
	}
	_, err = q.Exec(ctx, "DROP PUBLICATION IF EXISTS "+sqltext.Ident(c.opts.publication)+", "+sqltext.Ident(c.opts.publication+insertsSuffix))
	switch {
	case err == nil && owner != "":
		d.Removed = append(d.Removed, fmt.Sprintf("publication %q", c.opts.publication))
	case pgerr.Is(err, pgerrcode.InsufficientPrivilege):
		d.Remaining = append(d.Remaining, fmt.Sprintf("publication %q: only its owner %q or a superuser may drop it: "+
			"have one run DROP PUBLICATION IF EXISTS %s, %s (or Detach as that role)",
			c.opts.publication, owner, sqltext.Ident(c.opts.publication), sqltext.Ident(c.opts.publication+insertsSuffix)))
	case err != nil:
		return fmt.Errorf("drop publication %q: %w", c.opts.publication, err)
	}
	return nil
}
