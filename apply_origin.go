package siphon

// Where the applied Position is kept.
//
// A source is identified by its system identifier and slot (from a stream's
// header): key "<system id>_<slot>" (a slot name that is not 1-63 of
// a-z0-9_ is replaced by "h" and 16 hex digits of its SHA-256; a missing
// system identifier is "0").
//
// With replication origins, the origin is "siphon_<target database OID>_<key>":
// origins are cluster-wide, and the OID keeps two target databases of one
// cluster apart. Without them, the row "siphon_<key>" of the table
// siphon.applied_position in the target database holds it (the table is per
// database already, and survives a dump and restore of the target).

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/siphondb/siphon/canonical"
	"github.com/siphondb/siphon/internal/pgerr"
	"github.com/siphondb/siphon/internal/sqltext"
)

// applyLockClass is the first key of the advisory lock that makes one
// session at a time apply a source when there is no replication origin to
// do it ("siph"); the second key is a hash of the source key.
const applyLockClass = 0x73697068

// hashedName is what sourceKey makes of a name it cannot use as is: h and
// 16 hex digits. sourceKey keeps it as it is, so that a source listed by
// AppliedSources names the same key when given back.
var hashedName = regexp.MustCompile(`^h[0-9a-f]{16}$`)

// sourceKey identifies a source in origin names and bookkeeping rows.
func sourceKey(systemID, slot string) string {
	if !slotNamePattern.MatchString(slot) {
		sum := sha256.Sum256([]byte(slot))
		slot = "h" + hex.EncodeToString(sum[:8])
	}
	return systemKey(systemID) + "_" + slot
}

// systemKey is the part of a source key that names the system identifier.
func systemKey(systemID string) string {
	switch {
	case systemID == "":
		return "0"
	case strings.Trim(systemID, "0123456789") != "" && !hashedName.MatchString(systemID):
		sum := sha256.Sum256([]byte(systemID))
		return "h" + hex.EncodeToString(sum[:8])
	}
	return systemID
}

func originPrefix(dbOID uint32) string { return fmt.Sprintf("siphon_%d_", dbOID) }

const bookkeepingPrefix = "siphon_"

// tracker records the applied Position in the target, in the transaction
// that applies the data.
type tracker struct {
	origin bool   // a replication origin; else the bookkeeping table
	name   string // the origin's name, or the bookkeeping row's key
}

// applyEnvQuery returns the database's OID, whether the current role may
// use replication origins, and whether the bookkeeping table exists (read
// from the catalog: to_regclass fails for a role without USAGE on schema
// siphon, as a source's REPLICATION role is where a superuser installed
// the capture).
const applyEnvQuery = `
SELECT d.oid::int8,
       coalesce(pg_catalog.current_setting('max_active_replication_origins', true), pg_catalog.current_setting('max_replication_slots'))::int > 0
       AND NOT pg_catalog.pg_is_in_recovery() AND
       (SELECT pg_catalog.count(*) = 6 AND pg_catalog.bool_and(pg_catalog.has_function_privilege(p.oid, 'EXECUTE'))
        FROM pg_proc p
        WHERE p.pronamespace = 'pg_catalog'::regnamespace
          AND p.proname IN ('pg_replication_origin_create', 'pg_replication_origin_oid',
                            'pg_replication_origin_session_setup', 'pg_replication_origin_session_reset',
                            'pg_replication_origin_xact_setup', 'pg_replication_origin_progress')),
       EXISTS (SELECT FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
               WHERE n.nspname = 'siphon' AND c.relname = 'applied_position')
FROM pg_database d WHERE d.datname = pg_catalog.current_database()`

// applyEnv is what the target offers for keeping the applied Position.
type applyEnv struct {
	dbOID       uint32
	origins     bool // the role may use replication origins
	bookkeeping bool // siphon.applied_position exists
}

func readApplyEnv(ctx context.Context, q querier) (applyEnv, error) {
	var env applyEnv
	var oid int64
	if err := q.QueryRow(ctx, applyEnvQuery).Scan(&oid, &env.origins, &env.bookkeeping); err != nil {
		return env, fmt.Errorf("inspect the target: %w", err)
	}
	env.dbOID = uint32(oid)
	return env, nil
}

// setupTracker prepares conn, the applying session, to record the applied
// Position of the source key: with a replication origin bound to the
// session when the role may use origins, else with the bookkeeping table
// (created if missing) and an advisory lock held by the session. Either
// way a second session applying the same source gets ErrApplyInProgress.
func setupTracker(ctx context.Context, conn *pgx.Conn, env applyEnv, key string) (tracker, error) {
	if env.origins {
		t := tracker{origin: true, name: originPrefix(env.dbOID) + key}
		return t, setupOrigin(ctx, conn, t.name)
	}
	t := tracker{name: bookkeepingPrefix + key}
	if !env.bookkeeping {
		if err := createBookkeeping(ctx, conn); err != nil {
			return t, err
		}
	}
	var locked bool
	err := conn.QueryRow(ctx, "SELECT pg_catalog.pg_try_advisory_lock($1::int4, pg_catalog.hashtext($2))", applyLockClass, t.name).Scan(&locked)
	if err != nil {
		return t, fmt.Errorf("lock the source: %w", err)
	}
	if !locked {
		return t, ErrApplyInProgress
	}
	return t, nil
}

// release unbinds the session from the origin, or releases its advisory
// lock, so that the source can be applied again at once (a closed
// session's backend may take a moment to go).
func (t tracker) release(ctx context.Context, conn *pgx.Conn) error {
	sql := "SELECT pg_catalog.pg_advisory_unlock($1::int4, pg_catalog.hashtext($2))"
	args := []any{applyLockClass, t.name}
	if t.origin {
		sql, args = "SELECT pg_catalog.pg_replication_origin_session_reset()", nil
	}
	_, err := conn.Exec(ctx, sql, args...)
	return err
}

func setupOrigin(ctx context.Context, conn *pgx.Conn, name string) error {
	_, err := conn.Exec(ctx, "SELECT pg_catalog.pg_replication_origin_create($1) WHERE pg_catalog.pg_replication_origin_oid($1) IS NULL", name)
	if err != nil && !pgerr.Is(err, pgerrcode.UniqueViolation) { // created meanwhile by another session
		return fmt.Errorf("create replication origin %q: %w", name, err)
	}
	if _, err := conn.Exec(ctx, "SELECT pg_catalog.pg_replication_origin_session_setup($1)", name); err != nil {
		if pgerr.Is(err, pgerrcode.ObjectInUse) {
			return fmt.Errorf("%w (replication origin %q: %s)", ErrApplyInProgress, name, pgerr.Message(err))
		}
		if pgerr.Is(err, pgerrcode.ConfigurationLimitExceeded) {
			return fmt.Errorf("set up replication origin %q: %w: every replication origin state of the target's server is taken "+
				"(max_active_replication_origins from PostgreSQL 18 on, max_replication_slots before): raise the setting and restart "+
				"the server, or drop the origins no longer used (those of dropped databases: SweepOrphanOrigins)", name, err)
		}
		return fmt.Errorf("set up replication origin %q: %w", name, err)
	}
	return nil
}

// createBookkeeping creates siphon.applied_position, serialised with other
// sessions doing the same.
func createBookkeeping(ctx context.Context, conn *pgx.Conn) error {
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_catalog.pg_advisory_xact_lock($1::int4, 0)", applyLockClass); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `CREATE SCHEMA IF NOT EXISTS siphon;
			CREATE TABLE IF NOT EXISTS siphon.applied_position (
				origin text PRIMARY KEY,
				position pg_lsn NOT NULL,
				updated_at timestamptz NOT NULL DEFAULT pg_catalog.now())`)
		return err
	})
	if err != nil {
		return fmt.Errorf("create siphon.applied_position (the role may not use replication origins: "+
			"grant it EXECUTE on the pg_replication_origin_* functions, or let an administrator run "+
			"CREATE SCHEMA siphon AUTHORIZATION <role>): %w", err)
	}
	return nil
}

// queueRecord queues, in the target transaction, the statement that records
// pos (applied at the source's commit time at) when it commits.
func (t tracker) queueRecord(q *stmtQueue, pos canonical.Position, at time.Time) {
	q.params.reset()
	var st *statement
	if t.origin {
		st = &statement{sql: "SELECT pg_catalog.pg_replication_origin_xact_setup($1, coalesce($2, pg_catalog.now()))", oids: []uint32{pgLSNOID, pgtype.TimestamptzOID}}
	} else {
		st = &statement{sql: `INSERT INTO siphon.applied_position (origin, position, updated_at) VALUES ($3, $1, coalesce($2, pg_catalog.now()))
			ON CONFLICT (origin) DO UPDATE SET position = EXCLUDED.position, updated_at = EXCLUDED.updated_at`,
			oids: []uint32{pgLSNOID, pgtype.TimestamptzOID, pgtype.TextOID}}
	}
	q.params.add(canonical.Text(pos.String()))
	if at.IsZero() {
		q.params.add(canonical.Null())
	} else {
		q.params.add(canonical.Text(at.UTC().Format("2006-01-02 15:04:05.999999Z07:00")))
	}
	if !t.origin {
		q.params.add(canonical.Text(t.name))
	}
	q.add(st, stmtOwner{label: "record the applied position " + pos.String()})
}

// readProgress reads what the target has applied of the source key: the
// origin's progress (when the role may read it) and the bookkeeping row
// (when the table exists), whichever is further.
func readProgress(ctx context.Context, q querier, env applyEnv, key string) (canonical.Position, error) {
	var best canonical.Position
	if env.origins {
		var lsn *string
		err := q.QueryRow(ctx, `SELECT CASE WHEN pg_catalog.pg_replication_origin_oid($1) IS NOT NULL
			THEN pg_catalog.pg_replication_origin_progress($1, false)::text END`, originPrefix(env.dbOID)+key).Scan(&lsn)
		if err != nil {
			return 0, fmt.Errorf("read the replication origin's progress: %w", err)
		}
		if best, err = parseLSN(lsn); err != nil {
			return 0, err
		}
	}
	if env.bookkeeping {
		var lsn *string
		err := q.QueryRow(ctx, "SELECT pg_catalog.max(position)::text FROM siphon.applied_position WHERE origin = $1", bookkeepingPrefix+key).Scan(&lsn)
		if err != nil {
			return 0, fmt.Errorf("read siphon.applied_position: %w", err)
		}
		pos, err := parseLSN(lsn)
		if err != nil {
			return 0, err
		}
		best = max(best, pos)
	}
	return best, nil
}

func parseLSN(s *string) (canonical.Position, error) {
	if s == nil {
		return 0, nil
	}
	return canonical.ParsePosition(*s)
}

// AppliedPosition returns the Position up to which [Conn.ConsumeCanonical]
// has applied changes into the database c is connected to: the end of the
// last source transaction (or the snapshot) applied, the Position to take
// the next incremental or stream from. It is zero when nothing was applied.
//
// The applied Position belongs to a source (its system identifier and slot,
// from the streams' headers). AppliedPosition needs no argument in the
// common case of one source per target: it returns the Position of the only
// source applied into this database, found in the database itself (so it
// works after a restart, before anything is consumed). When several sources
// were applied, it returns an error wrapping [ErrAmbiguousSource] that lists
// them: use [Conn.AppliedPositionFor] ([Conn.AppliedSources] lists them).
func (c *Conn) AppliedPosition(ctx context.Context) (canonical.Position, error) {
	list, err := c.listApplied(ctx)
	if err != nil {
		return 0, errorf("siphon: applied position: %w", err)
	}
	switch len(list) {
	case 0:
		return 0, nil
	case 1:
		return list[0].Position, nil
	}
	held := make([]string, len(list))
	for i, src := range list {
		held[i] = fmt.Sprintf("system id %s slot %q up to %v", src.SystemID, src.Slot, src.Position)
	}
	return 0, errorf("siphon: applied position: %w: %s: ask for one with AppliedPositionFor(ctx, systemID, slot) "+
		"(AppliedSources lists them; a source Conn's SystemID gives its own), and forget those no longer applied "+
		"with ResetAppliedPosition, or SweepOrphanOriginsWith for those whose slot is gone",
		ErrAmbiguousSource, strings.Join(held, "; "))
}

// AppliedPositionFor returns the Position up to which changes of the source
// with the given system identifier and slot (as in the streams' headers,
// [canonical.Header]) were applied into the database c is connected to;
// zero when none were.
func (c *Conn) AppliedPositionFor(ctx context.Context, systemID, slot string) (canonical.Position, error) {
	env, err := readApplyEnv(ctx, c.pool)
	if err != nil {
		return 0, errorf("siphon: applied position: %w", err)
	}
	pos, err := readProgress(ctx, c.pool, env, sourceKey(systemID, slot))
	if err != nil {
		return 0, errorf("siphon: applied position: %w", err)
	}
	return pos, nil
}

// AppliedSource is a source whose changes were applied into a target
// database, as [Conn.AppliedSources] lists it.
type AppliedSource struct {
	// SystemID and Slot identify the source as [Conn.AppliedPositionFor],
	// [Conn.ResetAppliedPosition] and [Conn.MarkAppliedPosition] take
	// them: its cluster's system identifier and its slot. A name siphon
	// cannot use as it is (a slot name that is not 1 to 63 of a-z, 0-9
	// and _, such as the empty one of a backup no slot continues) is kept
	// as h and 16 hex digits that stand for it, which those calls take
	// too.
	SystemID, Slot string
	// Position is what was applied of the source: where its next change
	// stream starts.
	Position canonical.Position
	// Updated is when the last source transaction applied committed on
	// the source (or when a snapshot or a backup was loaded); zero where
	// the target keeps the Position in a replication origin, which
	// records no time.
	Updated time.Time
}

// key is the source key of s.
func (s AppliedSource) key() string { return sourceKey(s.SystemID, s.Slot) }

// AppliedSources lists the sources applied into the database c is
// connected to, by system identifier and slot: what [Conn.AppliedPosition]
// chooses from. Forget one that is no longer applied with
// [Conn.ResetAppliedPosition], given its SystemID and Slot, or every one
// whose slot is gone with [Conn.SweepOrphanOriginsWith].
func (c *Conn) AppliedSources(ctx context.Context) ([]AppliedSource, error) {
	list, err := c.listApplied(ctx)
	if err != nil {
		return nil, errorf("siphon: applied sources: %w", err)
	}
	return list, nil
}

// listApplied returns every source applied into the target database,
// ordered by system identifier and slot.
func (c *Conn) listApplied(ctx context.Context) ([]AppliedSource, error) {
	env, err := readApplyEnv(ctx, c.pool)
	if err != nil {
		return nil, err
	}
	found := map[string]*AppliedSource{}
	collect := func(sql, prefix string) error {
		rows, err := c.pool.Query(ctx, sql, prefix)
		if err != nil {
			return err
		}
		names, err := pgx.CollectRows(rows, pgx.RowToStructByPos[struct {
			Name    string
			LSN     *string
			Updated *time.Time
		}])
		if err != nil {
			return err
		}
		for _, n := range names {
			pos, err := parseLSN(n.LSN)
			if err != nil {
				return err
			}
			key := strings.TrimPrefix(n.Name, prefix)
			src := found[key]
			if src == nil {
				systemID, slot, _ := strings.Cut(key, "_")
				src = &AppliedSource{SystemID: systemID, Slot: slot}
				found[key] = src
			}
			src.Position = max(src.Position, pos)
			if n.Updated != nil && n.Updated.After(src.Updated) {
				src.Updated = n.Updated.UTC()
			}
		}
		return nil
	}
	if env.origins {
		err := collect(`SELECT roname, pg_catalog.pg_replication_origin_progress(roname, false)::text, NULL::timestamptz
			FROM pg_replication_origin WHERE pg_catalog.starts_with(roname, $1)`, originPrefix(env.dbOID))
		if err != nil {
			return nil, fmt.Errorf("read replication origins: %w", err)
		}
	}
	if env.bookkeeping {
		err := collect(`SELECT origin, position::text, updated_at FROM siphon.applied_position WHERE pg_catalog.starts_with(origin, $1)`, bookkeepingPrefix)
		if err != nil {
			return nil, fmt.Errorf("read siphon.applied_position: %w", err)
		}
	}
	list := make([]AppliedSource, 0, len(found))
	for _, src := range found {
		list = append(list, *src)
	}
	slices.SortFunc(list, func(a, b AppliedSource) int { return strings.Compare(a.key(), b.key()) })
	return list, nil
}

// appliedSources returns the applied Position of every source applied into
// the target database, by source key.
func (c *Conn) appliedSources(ctx context.Context) (map[string]canonical.Position, error) {
	list, err := c.listApplied(ctx)
	if err != nil {
		return nil, err
	}
	found := make(map[string]canonical.Position, len(list))
	for _, src := range list {
		found[src.key()] = src.Position
	}
	return found, nil
}

// ResetAppliedPosition forgets what was applied from the source with the
// given system identifier and slot into the database c is connected to: it
// drops the replication origin and deletes the bookkeeping row. The next
// [Conn.ConsumeCanonical] of that source then applies everything it is
// given. Give the SystemID and Slot of an entry of [Conn.AppliedSources],
// or, holding a Conn on the source, its [Conn.SystemID] and its slot
// ([WithSlot]). Replication origins are cluster-wide and outlive the
// database they were made for: reset a source before dropping its target
// database, or call [Conn.SweepOrphanOrigins] after. A source being
// applied right now gives [ErrApplyInProgress].
func (c *Conn) ResetAppliedPosition(ctx context.Context, systemID, slot string) error {
	env, err := readApplyEnv(ctx, c.pool)
	if err != nil {
		return errorf("siphon: reset applied position: %w", err)
	}
	if err := dropProgress(ctx, c.pool, env, sourceKey(systemID, slot)); err != nil {
		return errorf("siphon: reset applied position: %w", err)
	}
	return nil
}

// MarkAppliedPosition records that the database c is connected to holds
// the source with the given system identifier and slot up to pos, as if
// [Conn.ConsumeCanonical] had applied it there, replacing what was
// recorded before. [Conn.Restore] does this for the backup it restores;
// call it for a target loaded by other means (pg_dump --snapshot with a
// [Snapshot]'s Name, say, at its Position), so that the source's change
// streams are checked against it: one that starts past pos is refused with
// an [*ApplyGapError]. A source being applied right now gives
// [ErrApplyInProgress].
func (c *Conn) MarkAppliedPosition(ctx context.Context, systemID, slot string, pos canonical.Position) error {
	if err := c.markApplied(ctx, "", systemID, slot, pos, time.Time{}); err != nil {
		return errorf("siphon: mark applied position: %w", err)
	}
	return nil
}

// markApplied records, in database ("" for the Conn's), that the source
// key of systemID and slot is applied up to pos (at at, when known).
func (c *Conn) markApplied(ctx context.Context, database, systemID, slot string, pos canonical.Position, at time.Time) error {
	conn, err := c.newSessionIn(ctx, database)
	if err != nil {
		return err
	}
	env, err := readApplyEnv(ctx, conn)
	if err == nil {
		err = dropProgress(ctx, conn, env, sourceKey(systemID, slot))
	}
	conn.Close(context.WithoutCancel(ctx))
	if err != nil {
		return err
	}
	s, err := c.openApplySession(ctx, database, canonical.Header{SystemID: systemID, Slot: slot})
	if err != nil {
		return err
	}
	defer s.close()
	s.begin()
	s.finishTransaction(pos, at)
	return s.flush(ctx)
}

// dropProgress forgets what the target q is connected to has applied of
// the source key: its replication origin and its bookkeeping row.
func dropProgress(ctx context.Context, q querier, env applyEnv, key string) error {
	if err := dropOrigin(ctx, q, originPrefix(env.dbOID)+key); err != nil {
		return err
	}
	if env.bookkeeping {
		if _, err := q.Exec(ctx, "DELETE FROM siphon.applied_position WHERE origin = $1", bookkeepingPrefix+key); err != nil {
			return fmt.Errorf("forget the applied position: %w", err)
		}
	}
	return nil
}

// dropOrigin drops the named replication origin if it exists.
func dropOrigin(ctx context.Context, q querier, name string) error {
	var exists bool
	if err := q.QueryRow(ctx, "SELECT EXISTS (SELECT FROM pg_replication_origin WHERE roname = $1)", name).Scan(&exists); err != nil {
		return fmt.Errorf("read replication origins: %w", err)
	}
	if !exists {
		return nil
	}
	_, err := q.Exec(ctx, "SELECT pg_catalog.pg_replication_origin_drop($1)", name)
	switch {
	case pgerr.Is(err, pgerrcode.ObjectInUse):
		return fmt.Errorf("%w (%s)", ErrApplyInProgress, pgerr.Message(err))
	case err != nil:
		return fmt.Errorf("drop replication origin %q: %w", name, err)
	}
	return nil
}

// SystemID returns the system identifier of the cluster c is connected
// to, as stream headers, backups and [AppliedSource] name a source: with
// c's slot, what [Conn.ResetAppliedPosition] and
// [Conn.AppliedPositionFor] take on a target. It opens a replication
// session (IDENTIFY_SYSTEM), so the role needs REPLICATION, as a source's
// has.
func (c *Conn) SystemID(ctx context.Context) (string, error) {
	info, err := c.identifySystem(ctx)
	if err != nil {
		return "", errorf("siphon: system id: %w", err)
	}
	return info.systemID, nil
}

// SweepOptions says what [Conn.SweepOrphanOriginsWith] sweeps besides the
// origins of dropped databases. The zero value sweeps nothing more.
type SweepOptions struct {
	// Source, when set, is a Conn on a source cluster: what the database
	// the sweeping Conn is connected to holds of that cluster's slots
	// that no longer exist there (dropped by Detach, DropSlot or by
	// hand) is forgotten too, replication origins and bookkeeping rows,
	// as [Conn.ResetAppliedPosition] forgets it: no stream can continue
	// it. What a backup that no slot continues recorded (its Slot is the
	// empty name's) is kept. Defaults to nil.
	Source *Conn
}

// SweepOrphanOriginsWith is [Conn.SweepOrphanOrigins] with what opt adds:
// with opt.Source, the applied positions the Conn's database holds of
// slots of that source that no longer exist. It returns how many origins
// and bookkeeping rows it dropped in all; a source being applied right now
// is skipped.
func (c *Conn) SweepOrphanOriginsWith(ctx context.Context, opt SweepOptions) (int, error) {
	n, err := c.SweepOrphanOrigins(ctx)
	if err != nil || opt.Source == nil {
		return n, err
	}
	forgotten, err := c.sweepDroppedSlots(ctx, opt.Source)
	if len(forgotten) > 0 {
		c.log.Info("applied positions of dropped slots forgotten", "sources", forgotten)
	}
	if err != nil {
		return n + len(forgotten), errorf("siphon: sweep orphan origins: %w", err)
	}
	return n + len(forgotten), nil
}

// sweepDroppedSlots forgets what the target holds of slots of source's
// cluster that no longer exist there, and returns the keys it forgot.
func (c *Conn) sweepDroppedSlots(ctx context.Context, source *Conn) ([]string, error) {
	systemID, err := source.SystemID(ctx)
	if err != nil {
		return nil, fmt.Errorf("the source: %w", err)
	}
	rows, err := source.pool.Query(ctx, "SELECT slot_name::text FROM pg_replication_slots")
	if err != nil {
		return nil, fmt.Errorf("the source's slots: %w", err)
	}
	slots, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("the source's slots: %w", err)
	}
	keep := map[string]bool{sourceKey(systemID, ""): true} // a slotless backup's: no slot was ever dropped
	for _, slot := range slots {
		keep[sourceKey(systemID, slot)] = true
	}
	list, err := c.listApplied(ctx)
	if err != nil {
		return nil, err
	}
	env, err := readApplyEnv(ctx, c.pool)
	if err != nil {
		return nil, err
	}
	var forgotten []string
	for _, src := range list {
		key := src.key()
		if systemKey(src.SystemID) != systemKey(systemID) || keep[key] {
			continue
		}
		switch err := dropProgress(ctx, c.pool, env, key); {
		case errors.Is(err, ErrApplyInProgress): // applied right now: not ours to drop
		case err != nil:
			return forgotten, originDropPrivilege(c.config.User, err)
		default:
			forgotten = append(forgotten, key)
		}
	}
	return forgotten, nil
}

// originDropPrivilege is err, or the *PrivilegeError of role, which may
// not drop replication origins.
func originDropPrivilege(role string, err error) error {
	return privilegeError(err, role, "EXECUTE on function pg_replication_origin_drop", "dropping replication origins",
		fmt.Sprintf("have a superuser run GRANT EXECUTE ON FUNCTION pg_catalog.pg_replication_origin_drop(text) TO %s", sqltext.Ident(role)))
}

// SweepOrphanOrigins drops the replication origins siphon created for
// target databases of c's server that no longer exist, and returns how many
// it dropped. Origins belong to the server, not to a database: dropping a
// target database leaves its origins behind, and each keeps one of the
// server's origin states (max_active_replication_origins from PostgreSQL
// 18 on, max_replication_slots before) until it is dropped. Origins of
// existing databases, and origins not named by siphon, are never touched.
// It needs a role that may drop replication origins (a superuser, or one
// granted EXECUTE on pg_replication_origin_drop). To forget also what a
// target holds of source slots that were dropped, see
// [Conn.SweepOrphanOriginsWith].
func (c *Conn) SweepOrphanOrigins(ctx context.Context) (int, error) {
	rows, err := c.pool.Query(ctx, `SELECT roname FROM pg_replication_origin
		WHERE roname ~ '^siphon_[0-9]{1,10}_'
		  AND substring(roname FROM '^siphon_([0-9]+)_')::int8 NOT IN (SELECT oid::int8 FROM pg_database)
		ORDER BY roname`)
	if err != nil {
		return 0, errorf("siphon: sweep orphan origins: %w", err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return 0, errorf("siphon: sweep orphan origins: %w", err)
	}
	var dropped []string
	defer func() {
		if len(dropped) > 0 {
			c.log.Info("orphan origins swept", "dropped", dropped)
		}
	}()
	for _, name := range names {
		_, err := c.pool.Exec(ctx, "SELECT pg_catalog.pg_replication_origin_drop($1)", name)
		switch {
		case err == nil:
			dropped = append(dropped, name)
		case pgerr.Is(err, pgerrcode.ObjectInUse, pgerrcode.UndefinedObject): // taken or dropped meanwhile
		default:
			return len(dropped), errorf("siphon: sweep orphan origins: drop %q: %w", name, originDropPrivilege(c.config.User, err))
		}
	}
	return len(dropped), nil
}
