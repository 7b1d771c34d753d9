package siphon

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/siphondb/siphon/internal/sqltext"
	"github.com/siphondb/siphon/pgdump"
)

// serverFacts are what Connect reads in one round trip.
type serverFacts struct {
	versionNum int
	version    string
	encoding   string
	walLevel   string
	missing    []string // WithTables tables that do not exist
	// idleSlotTimeout is idle_replication_slot_timeout (18+), "" before.
	idleSlotTimeout string
}

// readServerFacts reads the server's version, encoding and wal_level, and
// which WithTables tables do not exist.
func (c *Conn) readServerFacts(ctx context.Context) (serverFacts, error) {
	var f serverFacts
	schemas, names := nameArrays(c.tables)
	err := c.pool.QueryRow(ctx, `SELECT pg_catalog.current_setting('server_version_num')::int, pg_catalog.current_setting('server_version'),
		pg_catalog.current_setting('server_encoding'), pg_catalog.current_setting('wal_level'),
		coalesce(pg_catalog.current_setting('idle_replication_slot_timeout', true), ''),
		coalesce((SELECT pg_catalog.array_agg(pg_catalog.format('%I.%I', u.s, u.n)) FROM unnest($1::text[], $2::text[]) AS u(s, n)
		          WHERE pg_catalog.to_regclass(pg_catalog.format('%I.%I', u.s, u.n)) IS NULL), '{}')`, schemas, names).
		Scan(&f.versionNum, &f.version, &f.encoding, &f.walLevel, &f.idleSlotTimeout, &f.missing)
	return f, err
}

// encodingCheck is the check of the database's encoding.
func (f serverFacts) encodingCheck() Check {
	ch := Check{Name: CheckEncoding, Status: CheckOK, Found: "the database is " + f.encoding,
		Needed: "everything: canonical values are UTF-8 text"}
	if f.encoding != "UTF8" {
		ch.Status = CheckFailed
		ch.Fix = "create the database WITH ENCODING 'UTF8' (pg_dump, then restore into it)"
	}
	return ch
}

// walLevelCheck is the check of wal_level.
func (f serverFacts) walLevelCheck() Check {
	ch := Check{Name: CheckWALLevel, Status: CheckOK, Found: "wal_level is " + f.walLevel,
		Needed: "reading changes: streaming, snapshots, incremental and aligned full backups"}
	if f.walLevel != "logical" {
		ch.Status = CheckFailed
		ch.Fix = "run ALTER SYSTEM SET wal_level = logical and restart the server (a Conn that only applies into this database does not need it)"
	}
	return ch
}

// tablesCheck is the check that the WithTables tables exist.
func (f serverFacts) tablesCheck() Check {
	ch := Check{Name: CheckTables, Status: CheckOK, Found: "the tables WithTables names exist", Needed: "capturing them"}
	if len(f.missing) > 0 {
		ch.Status = CheckFailed
		ch.Found = "WithTables names tables that do not exist: " + strings.Join(f.missing, ", ")
		ch.Fix = "create them, or leave them out of WithTables"
	}
	return ch
}

// checkConnect makes the checks Connect fails fast on: the encoding, the
// WithTables tables, and, for a Conn given a source option, wal_level
// (otherwise the first operation that reads changes reports it).
func (c *Conn) checkConnect(ctx context.Context) error {
	f, err := c.readServerFacts(ctx)
	if err != nil {
		return errorf("siphon: connect: %w", err)
	}
	c.walLevel = f.walLevelCheck()
	checks := []Check{f.encodingCheck(), f.tablesCheck()}
	if c.opts.source {
		checks = append(checks, c.walLevel)
	}
	for _, ch := range checks {
		if ch.Status == CheckFailed {
			return &PreflightError{Check: ch}
		}
	}
	return nil
}

// Preflight reports what siphon can and cannot do with this Conn's server
// and database, as a source (reading changes, snapshots, backups) and as a
// target (applying them), each check with what needs it and the exact fix.
// It changes nothing: it reads settings, privileges and the catalog, and
// runs pg_dump --version and pg_restore --version. It returns an error only
// when it could not look (the server is unreachable, ctx ended).
//
// The checks: wal_level; the database's encoding; the tables WithTables
// names; the REPLICATION privilege; free replication slots and WAL
// senders; max_slot_wal_keep_size; the publication (whether it exists and
// matches the options, or can be created); every captured table without a
// usable replica identity and what happens to it (see
// [WithKeylessTables]); the schema capture (see
// [Conn.InstallSchemaCapture]); the persistent slot's state; pg_dump and pg_restore
// against the server's release, and that the role may read every table and
// sequence pg_dump dumps (SELECT on each, USAGE on their schemas, no
// row-level security in the way), each missing privilege with its GRANT;
// for apply, replication origins, session_replication_role and the tables
// of other roles (their owners' code runs as the applying role); and what
// the server's release offers.
func (c *Conn) Preflight(ctx context.Context) (*PreflightReport, error) {
	f, err := c.readServerFacts(ctx)
	if err != nil {
		return nil, errorf("siphon: preflight: %w", err)
	}
	r := &PreflightReport{ServerVersion: f.version}
	r.Checks = append(r.Checks, f.walLevelCheck(), f.encodingCheck())
	if len(c.tables) > 0 {
		r.Checks = append(r.Checks, f.tablesCheck())
	}
	for _, check := range []func(context.Context) ([]Check, error){
		c.roleChecks, c.capacityChecks, c.publicationChecks, c.captureChecks, c.slotCheck, c.clientChecks, c.dumpAccessCheck, c.applyChecks,
	} {
		checks, err := check(ctx)
		if err != nil {
			return nil, errorf("siphon: preflight: %w", err)
		}
		r.Checks = append(r.Checks, checks...)
	}
	r.Checks = append(r.Checks, releaseCheck(f))
	return r, nil
}

// roleChecks checks the REPLICATION attribute.
func (c *Conn) roleChecks(ctx context.Context) ([]Check, error) {
	var role string
	var replication, super bool
	err := c.pool.QueryRow(ctx, `SELECT rolname, rolreplication, rolsuper FROM pg_roles WHERE rolname = current_user`).
		Scan(&role, &replication, &super)
	if err != nil {
		return nil, err
	}
	ch := Check{Name: CheckReplicationRole, Status: CheckOK, Found: fmt.Sprintf("role %q may open replication sessions", role),
		Needed: "slots and streaming"}
	if !replication && !super {
		// No role may grant it to itself (see Conn.noReplication).
		ch.Status, ch.Found = CheckFailed, fmt.Sprintf("role %q lacks the REPLICATION attribute", role)
		ch.Fix = fmt.Sprintf("have a superuser run ALTER ROLE %s WITH REPLICATION", sqltext.Ident(role))
	}
	return []Check{ch}, nil
}

// capacityChecks checks free slots and WAL senders, and
// max_slot_wal_keep_size.
func (c *Conn) capacityChecks(ctx context.Context) ([]Check, error) {
	var maxSlots, usedSlots, maxSenders, usedSenders int
	var keep string
	var haveSlot bool
	err := c.pool.QueryRow(ctx, `SELECT pg_catalog.current_setting('max_replication_slots')::int, (SELECT pg_catalog.count(*) FROM pg_replication_slots),
		pg_catalog.current_setting('max_wal_senders')::int, (SELECT pg_catalog.count(*) FROM pg_stat_activity WHERE backend_type = 'walsender'),
		pg_catalog.current_setting('max_slot_wal_keep_size'), EXISTS (SELECT FROM pg_replication_slots WHERE slot_name = $1)`, c.opts.slot).
		Scan(&maxSlots, &usedSlots, &maxSenders, &usedSenders, &keep, &haveSlot)
	if err != nil {
		return nil, err
	}
	// The persistent slot (unless it exists), and one temporary slot for a
	// snapshot or backup at a time.
	needSlots := 1
	if !haveSlot {
		needSlots++
	}
	slots := Check{Name: CheckSlots, Status: CheckOK, Found: fmt.Sprintf("%d of %d replication slots in use", usedSlots, maxSlots),
		Needed: fmt.Sprintf("the persistent slot and one temporary slot per snapshot or backup: %d more", needSlots)}
	if free := maxSlots - usedSlots; free < needSlots {
		slots.Status = CheckFailed
		slots.Fix = fmt.Sprintf("raise max_replication_slots to at least %d (a restart), or drop unused slots (pg_replication_slots lists them; Conn.Slots lists siphon's)", usedSlots+needSlots)
	}
	senders := Check{Name: CheckWALSenders, Status: CheckOK, Found: fmt.Sprintf("%d of %d WAL senders in use", usedSenders, maxSenders),
		Needed: "one per stream, and one per snapshot or backup while it runs: 2 more"}
	if maxSenders-usedSenders < 2 {
		senders.Status = CheckFailed
		senders.Fix = fmt.Sprintf("raise max_wal_senders to at least %d (a restart), or end idle replication sessions", usedSenders+2)
	}
	limit := Check{Name: CheckSlotWALLimit, Status: CheckOK, Found: "max_slot_wal_keep_size is " + keep,
		Needed: "keeping a slot nobody consumes from filling the disk"}
	if keep == "-1" {
		limit.Status = CheckWarning
		limit.Found = "max_slot_wal_keep_size is -1: a slot nobody consumes keeps WAL until the disk is full"
		limit.Fix = "run ALTER SYSTEM SET max_slot_wal_keep_size = '<size>' and SELECT pg_reload_conf(): a slot past it is invalidated, and siphon then reports a *ResumeGapError rather than the server running out of disk"
	}
	return []Check{slots, senders, limit}, nil
}

// publicationChecks checks the publication, and the tables without a
// usable replica identity.
func (c *Conn) publicationChecks(ctx context.Context) ([]Check, error) {
	pub := Check{Name: CheckPublication, Status: CheckOK, Needed: "choosing what the change stream and snapshots carry"}
	v, err := c.readPublicationView(ctx)
	if err != nil {
		return nil, err
	}
	s, tables := v.pub, v.tables
	var drift error
	if s.exists {
		drift = c.checkView(v)
	}
	switch {
	case drift != nil:
		pub.Status, pub.Found = CheckFailed, drift.Error()
		pub.Fix = "see the error: SyncPublication or ALTER PUBLICATION, or name another publication with WithPublication"
	case s.exists:
		pub.Found = fmt.Sprintf("publication %q exists and matches the options", c.opts.publication)
	default:
		pub.Found = fmt.Sprintf("publication %q does not exist yet: siphon creates it", c.opts.publication)
		lacks, err := c.canCreatePublication(ctx, tables)
		if err != nil {
			return nil, err
		}
		if lacks != nil {
			pub.Status, pub.Fix = CheckFailed, lacks.Fix
			pub.Found = fmt.Sprintf("publication %q does not exist, and role %q may not create it: it lacks %s", c.opts.publication, lacks.Role, lacks.Privilege)
		}
	}
	var keyless, held []string // held: by a schema the publication publishes
	for _, t := range tables {
		if !t.usable {
			keyless = append(keyless, t.name.String())
			if slices.Contains(s.bySchema, t.name) {
				held = append(held, t.name.String())
			}
		}
	}
	identity := Check{Name: CheckReplicaIdentity, Status: CheckOK, Found: "every captured table has a usable replica identity",
		Needed: "capturing updates and deletes while the application's own UPDATE and DELETE keep working"}
	if len(keyless) > 0 {
		list := strings.Join(keyless, ", ")
		identity.Status = CheckWarning
		them, their := "it", "its"
		if len(keyless) > 1 {
			them, their = "them", "their"
		}
		switch {
		case s.allTables:
			identity.Status = CheckFailed
			identity.Found = fmt.Sprintf("publication %q is FOR ALL TABLES and %s %s no usable replica identity: the application's UPDATE and DELETE on them fail",
				c.opts.publication, list, pluralHas(len(keyless)))
			identity.Fix = "drop the publication (siphon makes one that names its tables), or give " + them + " a primary key or REPLICA IDENTITY FULL"
		case len(held) > 0 && c.opts.keyless != KeylessFull:
			identity.Status = CheckFailed
			identity.Found = fmt.Sprintf("publication %q publishes the schema of %s, which %s no usable replica identity: it holds them whatever "+
				"WithKeylessTables says, and the application's UPDATE and DELETE on them fail", c.opts.publication, strings.Join(held, ", "), pluralHas(len(held)))
			identity.Fix = "give them a primary key or REPLICA IDENTITY FULL (WithKeylessTables(KeylessFull) sets it), or publish the tables by name"
		case c.opts.keyless == KeylessFull:
			identity.Found = "with REPLICA IDENTITY FULL (KeylessFull), siphon captures " + list + " whole"
			identity.Fix = "nothing to do; a primary key would make " + their + " updates cheaper in WAL and apply"
		case c.opts.keyless == KeylessInsertsOnly:
			identity.Found = "only the inserts and truncates of " + list + " are captured (KeylessInsertsOnly)"
			identity.Fix = "give " + them + " a primary key to capture " + their + " updates and deletes"
		default:
			identity.Found = fmt.Sprintf("%s %s no usable replica identity (no primary key, REPLICA IDENTITY FULL or USING INDEX), "+
				"so siphon leaves %s out of the publication and captures none of %s changes (KeylessSkip)", list, pluralHas(len(keyless)), them, their)
			identity.Fix = "give " + them + " a primary key, or connect WithKeylessTables(KeylessFull) or WithKeylessTables(KeylessInsertsOnly)"
		}
	}
	return []Check{pub, identity}, nil
}

// slotCheck reports the persistent slot's state.
func (c *Conn) slotCheck(ctx context.Context) ([]Check, error) {
	s, err := readSlotRow(ctx, c.pool, c.opts.slot)
	if err != nil {
		return nil, err
	}
	ch := Check{Name: CheckSlot, Status: CheckOK, Needed: "resuming the change stream and incrementals"}
	switch {
	case !s.exists:
		ch.Found = fmt.Sprintf("slot %q does not exist yet: siphon creates it when a stream, snapshot or chain needs it", c.opts.slot)
	case s.walStatus == "lost":
		ch.Status, ch.Found = CheckFailed, fmt.Sprintf("slot %q was invalidated (wal_status lost): the changes it held are gone", c.opts.slot)
		ch.Fix = "drop it (Detach), then take a new snapshot or full backup and stream from its Position"
	default:
		ch.Found = fmt.Sprintf("slot %q exists (confirmed %v, wal_status %s, active %v)", c.opts.slot, s.confirmed, s.walStatus, s.active)
	}
	return []Check{ch}, nil
}

// clientChecks checks pg_dump and pg_restore against the server.
func (c *Conn) clientChecks(ctx context.Context) ([]Check, error) {
	server, err := c.serverVersion(ctx)
	if err != nil {
		return nil, err
	}
	var checks []Check
	for _, p := range []struct {
		name   CheckName
		needed string
	}{{CheckPgDump, "Backup"}, {CheckPgRestore, "Restore, RestoreChain and verifying dumps"}} {
		ch := Check{Name: p.name, Status: CheckOK, Needed: p.needed}
		prog, err := pgdump.Find(ctx, string(p.name), "", server)
		if err != nil {
			ch.Status, ch.Found = CheckFailed, err.Error()
			ch.Fix = fmt.Sprintf("install the PostgreSQL %s client programs (Debian: apt-get install postgresql-client-%s), or name them with BackupOptions.PgDump and RestoreOptions.PgRestore",
				server.Release(), server.Release())
		} else {
			ch.Found = fmt.Sprintf("%s %s (%s)", prog.Name, prog.Version, prog.Path)
		}
		checks = append(checks, ch)
	}
	return checks, nil
}

// applyChecks checks what apply into this database needs.
func (c *Conn) applyChecks(ctx context.Context) ([]Check, error) {
	env, err := readApplyEnv(ctx, c.pool)
	if err != nil {
		return nil, err
	}
	role, err := c.readApplyRole(ctx, c.pool)
	if err != nil {
		return nil, err
	}
	origins := Check{Name: CheckOrigins, Status: CheckOK, Found: "the role may use replication origins",
		Needed: "apply: recording what was applied with each transaction"}
	if !env.origins {
		origins.Status = CheckWarning
		origins.Found = "the role may not use replication origins: apply records its progress in the table siphon.applied_position instead"
		origins.Fix = "nothing to do if the role may create that schema (CREATE on the database); or grant EXECUTE on the pg_replication_origin_* functions"
	}
	replica := Check{Name: CheckApplyRole, Status: CheckOK, Found: "the role may set session_replication_role: apply runs as a replica",
		Needed: "apply: the target's triggers and foreign keys do not fire on replicated changes"}
	switch {
	case c.opts.triggersOnApply:
		replica.Found = "WithTriggersOnApply: apply runs as an ordinary session, the target's triggers fire"
	case !role.replica:
		replica.Status = CheckWarning
		replica.Found = fmt.Sprintf("role %q may not set session_replication_role: apply refuses tables whose triggers, rules or foreign-key actions would fire", role.role)
		replica.Fix = fmt.Sprintf("have a superuser run GRANT SET ON PARAMETER session_replication_role TO %s", sqltext.Ident(role.role))
	}
	owners, err := c.tableOwnersCheck(ctx)
	if err != nil {
		return nil, err
	}
	return []Check{origins, replica, owners}, nil
}

// foreignOwnedTables lists, as "table (owned by role)", the first five
// user tables of roles other than the current one that are not
// superusers, each with the count of them all.
const foreignOwnedTables = `
SELECT pg_catalog.count(*) OVER (),
       pg_catalog.format('%s (owned by %I)', c.oid::pg_catalog.regclass, r.rolname)
FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
JOIN pg_catalog.pg_roles r ON r.oid = c.relowner
WHERE ` + isUserTable + ` AND r.rolname <> current_user AND NOT r.rolsuper
ORDER BY 2 LIMIT 5`

// tableOwnersCheck names the tables whose owners' code would run as the
// applying role: apply writes every table as itself, so the ENABLE ALWAYS
// and ENABLE REPLICA triggers, constraints, index expressions and defaults
// another role attached to its tables run with the applying role's rights
// (see SECURITY.md).
func (c *Conn) tableOwnersCheck(ctx context.Context) (Check, error) {
	ch := Check{Name: CheckTableOwners, Status: CheckOK, Found: "the role or superusers own every table",
		Needed: "apply: the code of the tables it writes (triggers, constraints, index expressions) runs as the applying role"}
	rows, err := c.pool.Query(ctx, foreignOwnedTables)
	if err != nil {
		return ch, err
	}
	var total int
	var names []string
	for rows.Next() {
		var name string
		if err := rows.Scan(&total, &name); err != nil {
			return ch, err
		}
		names = append(names, name)
	}
	if err := rows.Err(); err != nil || total == 0 {
		return ch, err
	}
	if total > len(names) {
		names = append(names, fmt.Sprintf("and %d more", total-len(names)))
	}
	ch.Status = CheckWarning
	ch.Found = fmt.Sprintf("tables of other roles that are not superusers (%d): %s; the code their owners attach to them "+
		"(ENABLE ALWAYS and ENABLE REPLICA triggers, constraints, index expressions) runs as this role when apply writes them",
		total, strings.Join(names, ", "))
	ch.Fix = "apply into them as their owner (a Conn that logs in as it), or trust their owners as much as this role"
	return ch, nil
}

// releaseCheck says what the server's release offers.
func releaseCheck(f serverFacts) Check {
	major := f.versionNum / 10000
	ch := Check{Name: CheckRelease, Status: CheckOK, Needed: "features that depend on the release"}
	switch {
	case major < 15:
		ch.Status, ch.Found = CheckFailed, fmt.Sprintf("PostgreSQL %d: siphon needs 15 or later", major)
		ch.Fix = "upgrade the server to PostgreSQL 15 or later"
	case major == 15:
		ch.Found = "PostgreSQL 15: every siphon feature but those of later releases (streaming only local changes: 16; failover slots: 17)"
	case major == 16:
		ch.Found = "PostgreSQL 16: streaming only local changes; failover slots need 17"
	default:
		ch.Found = fmt.Sprintf("PostgreSQL %d: streaming only local changes (WithLocalChangesOnly), failover slots (WithFailoverSlot)", major)
	}
	if f.idleSlotTimeout != "" && f.idleSlotTimeout != "0" {
		ch.Status = CheckWarning
		ch.Found += fmt.Sprintf("; idle_replication_slot_timeout is %s: a slot no stream reads for that long is invalidated (a *ResumeGapError)", f.idleSlotTimeout)
		ch.Fix = "stream (or take incrementals) more often than that, or ALTER SYSTEM SET idle_replication_slot_timeout = 0"
	}
	return ch
}
