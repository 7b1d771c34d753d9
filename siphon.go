// Package siphon moves PostgreSQL data out and back in on one timeline.
//
// Everything siphon produces carries a [canonical.Position] (a WAL location,
// LSN): a consistent snapshot taken at an exact Position, the logical change
// stream (pgoutput) that continues it, full backups (pg_dump) aligned to a
// snapshot's Position, and incremental backups that are bounded runs of that
// stream. Because each piece starts exactly where the previous one ended, a
// user can chain them with no gap and no duplicate, and apply them to another
// database exactly once.
//
// A [Conn] is the entry point:
//
//	c, err := siphon.Connect(ctx, dsn, siphon.WithSlot("orders_cdc"))
//	if err != nil { ... }
//	defer c.Close()
//	pos, err := c.EmitCanonical(ctx, nil, snapshotFile)    // snapshot at pos
//	last, err := c.StreamChanges(ctx, pos, handle)          // every commit after pos
//
// # What each piece does
//
//   - [Conn.InspectSchema]: the tables siphon works on, with columns, keys
//     and replica identity.
//   - [Conn.TakeSnapshot], [Snapshot.CopyTables], [Conn.EmitCanonical]: a
//     consistent snapshot from a slot that exports it, copied with binary
//     COPY in parallel sessions that import it, resumable from checkpoints.
//   - [Conn.StreamChanges], [Conn.CurrentPosition]: pgoutput logical
//     replication into a Go callback; [Conn.BackupIncremental]: the bounded
//     change set from a Position to the server's current WAL position.
//   - [Conn.Backup], [Conn.Restore], [Conn.Verify], [Conn.VerifyChain],
//     [Conn.RestoreChain]: pg_dump aligned to an exported snapshot, in a
//     versioned, checksummed envelope.
//   - [Conn.ApplyChange], [Conn.ConsumeCanonical], [Conn.AppliedPosition]:
//     apply snapshots and change sets to a target exactly once;
//     [Conn.AppliedSources], [Conn.ResetAppliedPosition] and
//     [Conn.SweepOrphanOriginsWith]: what a target holds of each source,
//     and forgetting what no stream continues.
//   - [Conn.CopySchema]: a target's schema made the source's (user objects
//     only), alone or as the start of [Conn.Replicate].
//   - [Conn.Replicate]: a live replica, its progress in time and bytes;
//     [Conn.Cutover]: the end of a live migration, the target checked.
//   - [Conn.Slots], [Conn.CreateBaseSlot], [Conn.DropSlot],
//     [Conn.SweepOrphanSlots], [Conn.Detach]: slot health and lifecycle.
//   - [Conn.Preflight]: what siphon can and cannot do on a server, and the
//     fix for each; [Conn.SyncPublication]: the publication in line with
//     the tables of today.
//
// # Guarantees
//
// Positions: a resume Position is the end of a committed transaction (the
// Position of an [canonical.OpCommit]) or a snapshot's consistent point.
// StreamChanges(from) delivers exactly the transactions whose commit ends
// after from, each as OpBegin, its changes, OpCommit. A consumer that stores
// the Position of the last OpCommit it handled and restarts from it sees
// nothing twice and misses nothing.
//
// Delivery: the slot is acknowledged only up to the end of a transaction
// whose OpCommit callback returned nil. A resume that would silently skip
// changes (a Position behind the slot, a lost or dropped slot) is a
// [*ResumeGapError], never a silent skip. Keepalives are answered while the
// callback is slow, memory stays bounded however large a transaction is, and
// an idle slot keeps advancing so it does not pin WAL.
//
// Alignment: snapshots and full backups are taken inside a snapshot exported
// by a replication slot created after the persistent slot, so the rows they
// hold are exactly the transactions committed at or before their Position,
// and streaming from that Position continues with no gap.
//
// Apply: each source transaction is applied in one target transaction
// together with its Position, exactly once, and as PostgreSQL's logical
// replication applies it: with session_replication_role = replica, so the
// target's ordinary triggers, rules and foreign-key checks and actions do
// not fire (the source ran them, and their effects arrive as changes of
// their own) while ENABLE REPLICA and ENABLE ALWAYS ones do; the target
// ends equal to the source. See [Conn.ConsumeCanonical] for roles that may
// not set that parameter, and [WithTriggersOnApply].
//
// Slots: creating one waits for every transaction holding a transaction ID.
// siphon bounds that wait, names the blocking sessions in a
// [*SlotBlockedError], and leaves no slot, session or lock behind on failure,
// nor the publication the failed call created for the slot. A role without
// the REPLICATION attribute gets a [*PrivilegeError] that says who grants
// it; a full max_replication_slots is mended once by dropping siphon's base
// slots that lost their WAL, never a live chain's. [Conn.Detach] removes
// what the role may remove and returns a [*DetachIncompleteError] naming
// what stays and who may remove it.
//
// # What is and is not captured
//
// Captured: INSERT, UPDATE, DELETE and TRUNCATE of published tables (the
// publication siphon creates names every table of the database that has a
// usable replica identity, or the [WithTables] set; see [WithKeylessTables]
// for the others), transactional and non-transactional logical decoding
// messages, schema changes and sequences (below), and, through table
// records in the canonical stream, the column set of each table as it
// changes. Not captured, as with any logical replication: large objects,
// unlogged and temporary tables, and generated columns (the target
// computes them). Full backups (pg_dump) include large objects.
//
// Partitioned tables: each partition's rows and changes carry the
// partition's own name, unless [WithPartitionRoots] makes them carry the
// partitioned table's (PostgreSQL's publish_via_partition_root): then a
// target needs only the root, partitioned as it likes or not at all.
//
// # Schema changes
//
// Logical decoding carries no DDL, so siphon captures it with an event
// trigger a superuser installs in the source database when asked to
// ([Conn.InstallSchemaCapture]: nothing installs it as a side effect, and
// [Conn.Preflight] says what it would install): every CREATE, ALTER, DROP, COMMENT,
// GRANT and REVOKE the application runs (tables, columns, types, enums,
// domains, constraints, indexes, partitions, views, functions, renames...)
// reaches the stream as an [canonical.OpDDL] change at its exact place
// among the row changes of its transaction: the statement as it ran (one
// statement of a multi-statement query, the statement a function or DO
// block ran, as PostgreSQL's own grammar splits the query; CONCURRENTLY
// left out), with the source's effective schemas and the role that ran
// it. Apply
// ([Conn.ConsumeCanonical], [Conn.RestoreChain], [Conn.Replicate],
// [Conn.ApplyChange]) runs it on the target at that place, in the same
// target transaction as the source's rows around it, as the source role
// that ran it where the target has it; a statement the target refuses, or
// one siphon cannot replay with certainty, stops the
// apply with a [*SchemaChangeError], nothing of that transaction applied
// (see [ApplyOptions].SkipSchemaChanges to go on once the target is put
// right by hand). Statements that fill tables as they create them (CREATE TABLE AS,
// SELECT INTO, REFRESH MATERIALIZED VIEW) fill them on the target from the
// same rows. The trigger also keeps the publications safe: a table created
// in a transaction joins every publication of all tables before its first
// row, and a published table that loses its usable replica identity leaves
// it (as [WithKeylessTables] says), so the application's statements never
// fail; a table created earlier and filled before it had a key is drift
// ([Conn.SyncPublication]). The trigger never makes the application's DDL
// fail; the [Conn.Detach] that drops the database's last change-stream slot
// removes it, with the publications it looks after. Without it (not installed, or [WithoutSchemaCapture]), apply
// follows the column changes the stream
// shows where that is exact (a nullable column added without a default, a
// column dropped) and stops at any other with a
// [*SchemaIncompatibleError] naming it. A canonical stream is a file or a
// message, which whoever can write it may change: [Conn.ConsumeCanonical]
// and [Conn.RestoreChain] run its schema changes only when it is
// authenticated with one of the Conn's keys ([WithStreamKey]), unless
// [ApplyOptions].UnauthenticatedSchemaChanges; the column types a stream shows are
// checked by the target before they are used. A target applies the schema
// changes of the source's superusers and of the roles it is told to trust
// only; SECURITY.md in the repository says whom siphon trusts and what
// each attack meets. The capture's rows pass through the table
// siphon.schema_changes, which siphon's publications hold: a native
// subscription (CREATE SUBSCRIPTION) of one of them needs that table on the
// subscriber too (CREATE SCHEMA siphon; CREATE TABLE siphon.schema_changes
// (id bigint PRIMARY KEY, change jsonb NOT NULL)).
//
// A schema change is code the target runs, so apply runs it only from a
// source role it trusts, and as that role, so that the target never grants
// more than the source had. Trusted are the source's superusers, the role
// that installed the capture and the roles named by
// [WithTrustedSchemaRoles], decided on the role that logged in on the
// source (session_user: SET ROLE does not change it). The statement runs
// under the role it ran as on the source (SET LOCAL ROLE, as PostgreSQL
// 16's run_as_owner = false does for its apply); where the target has no
// such role, or the applying role may not take it, it runs as the applying
// role only when it ran as a source superuser (logged once at Info), and
// stops the apply with an [*UntrustedSchemaChangeError] otherwise, since
// as the applying role it could hold more than the source role did. The
// source's search_path comes with "$user" already expanded. A statement whose meaning depends on who runs
// it (GRANT, REVOKE, ALTER DEFAULT PRIVILEGES, DROP or REASSIGN OWNED, a
// CURRENT_USER, SESSION_USER or CURRENT_ROLE role, user mappings, servers,
// foreign data wrappers, IMPORT FOREIGN SCHEMA, SECURITY LABEL) runs only
// with [WithRoleDependentSchemaChanges]. Any other schema change stops the
// apply with an [*UntrustedSchemaChangeError] naming the role and the
// option to give, nothing of its transaction applied: it is never applied
// nor skipped silently ([ApplyOptions].SkipSchemaChanges skips it when
// asked).
//
// # Sequences
//
// Sequences change outside transactions and logical decoding does not
// carry them. A snapshot carries every sequence's state read after its
// rows, an incremental the state read once its bound is reached, so at or
// after its Position; [Conn.Replicate] sets the target's every 10 seconds
// and when it stops. Apply moves a target sequence forward to the
// source's state and never back: the target's next value is never one the
// source used up to that Position (target >= source), whenever the target
// is promoted. With [WithTables], the sequences the tables own or use in
// defaults are carried.
//
// # Requirements
//
// PostgreSQL 15 or later with wal_level=logical, free replication slots and
// WAL senders, a UTF8 database, and a role with the REPLICATION attribute
// that may create publications (or owns the tables); a superuser, once, to
// install the schema capture (see "Schema changes"); pg_dump and pg_restore
// of the server's release or newer for backups. Replication origins (used by
// apply to record progress atomically) need a superuser or EXECUTE on the
// pg_replication_origin functions; other roles fall back to a bookkeeping
// table.
//
// # Session settings
//
// Every session siphon opens uses fixed settings, so that values print the
// same way everywhere (see [canonical.Value]): DateStyle ISO, TimeZone UTC,
// IntervalStyle postgres, extra_float_digits 3, bytea_output hex and
// lc_monetary C.
//
// # Logging, metrics and secrets
//
// siphon logs state changes only (slot created, blocked, retrying, resumed)
// to the [WithLogger] logger, never per row, and reports metrics through
// an OpenTelemetry MeterProvider given with [WithMeterProvider] (none by
// default). A DSN's password never appears
// in siphon's errors or log lines, and child processes (pg_dump) receive it
// through a password file in their environment, never argv.
package siphon

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/siphondb/siphon/canonical"
	dsnpkg "github.com/siphondb/siphon/internal/dsn"
	"github.com/siphondb/siphon/internal/fkgraph"
	"github.com/siphondb/siphon/internal/sqltext"
)

// sessionSettings are set on every session siphon opens, replication
// sessions included, so output functions print values the same way.
var sessionSettings = map[string]string{
	"DateStyle":          "ISO, MDY",
	"TimeZone":           "UTC",
	"IntervalStyle":      "postgres",
	"extra_float_digits": "3",
	"bytea_output":       "hex",
	"lc_monetary":        "C",
	"application_name":   "siphon",
}

// Conn is a connection to one PostgreSQL database. It is safe for
// concurrent use; each operation takes the sessions it needs.
type Conn struct {
	config *pgx.ConnConfig // the parsed DSN with siphon's session settings
	pool   *sessionPool
	opts   options
	tables []canonical.TableName // from WithTables; empty means every user table
	log    *slog.Logger
	apply  applyCache // target tables ApplyChange has looked up
	// streaming is set while a stream reads the Conn's slot.
	streaming atomic.Bool
	// walLevel is the server's wal_level, as Connect checked it.
	walLevel Check
	// bases hold the base slots CreateBaseSlot made and CaptureBaseEnd
	// has not completed.
	bases heldBases
	// captureWarning says once that schema changes are not captured.
	captureWarning sync.Once
	// identityNotes holds the source roles whose schema changes were said
	// to run as the applying role.
	identityNotes sync.Map
	// stats is what the Conn's calls did; meters observe it.
	stats  connStats
	meters *meters
	// catchUp tunes the SQL catch-up of a stream; the zero value means
	// the defaults (see stream_sql.go). Only tests change it.
	catchUpTuning catchUpSettings
}

// Connect checks the options, connects to the database dsn names (a
// PostgreSQL URL or keyword/value string) and checks that the server can
// serve siphon. It returns an [*OptionError] for an invalid option, an
// error wrapping [ErrInvalidDSN] that says which part of the DSN is wrong
// (never quoting a password) for a DSN that does not parse, and a
// [*PreflightError] for what nothing can work without: a database that is
// not UTF8, a table [WithTables] names that does not exist, and, for a
// Conn given a source option ([WithSlot], [WithPublication], [WithTables],
// [WithKeylessTables]), a server whose wal_level is not logical (a Conn
// without one, which may only apply changes, gets that error from its
// first operation that reads changes). [Conn.Preflight] checks the rest.
func Connect(ctx context.Context, dsn string, opts ...Option) (*Conn, error) {
	o := defaultOptions()
	for _, opt := range opts {
		opt(&o)
	}
	tables, err := o.validate()
	if err != nil {
		return nil, err
	}
	poolConfig, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		// The parse error may quote the DSN, password included: say which
		// part is wrong in words that quote no secret.
		return nil, errorf("siphon: %w: %s", ErrInvalidDSN, dsnpkg.Problem(dsn))
	}
	for name, value := range sessionSettings {
		if _, set := poolConfig.ConnConfig.RuntimeParams[name]; set && name == "application_name" {
			continue // the user's own application name wins
		}
		poolConfig.ConnConfig.RuntimeParams[name] = value
	}
	poolConfig.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(ctx, poolConfig)
	if err != nil {
		return nil, errorf("siphon: connect: %w", err)
	}
	c := &Conn{config: poolConfig.ConnConfig, pool: &sessionPool{Pool: pool}, opts: o, tables: tables, log: o.logger}
	if err := c.checkConnect(ctx); err != nil {
		pool.Close()
		return nil, err
	}
	if c.meters, err = newMeters(c, o.meterProvider); err != nil {
		pool.Close()
		return nil, &OptionError{Option: "WithMeterProvider", Problem: "the provider refused siphon's instruments: " + err.Error(),
			Fix: "pass a working metric.MeterProvider, or leave the option out"}
	}
	return c, nil
}

// Close releases the Conn's sessions: a base slot it made and did not
// complete is gone when Close returns (see [Conn.CreateBaseSlot]). It is
// safe to call more than once (the pool closes once) and returns nil:
// closing cannot fail. A Conn used after Close returns errors wrapping
// [ErrClosed].
func (c *Conn) Close() error {
	c.pool.closed.Store(true)
	c.meters.close()
	c.bases.release(c.pool.Pool) // the pool itself, which takes work until it is closed
	c.pool.Close()
	return nil
}

// sessionPool is the Conn's pool of sessions; it refuses work once the
// Conn is closed, with ErrClosed.
type sessionPool struct {
	*pgxpool.Pool
	closed atomic.Bool
}

func (p *sessionPool) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if p.closed.Load() {
		return pgconn.CommandTag{}, ErrClosed
	}
	return p.Pool.Exec(ctx, sql, args...)
}

func (p *sessionPool) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if p.closed.Load() {
		return nil, ErrClosed
	}
	return p.Pool.Query(ctx, sql, args...)
}

func (p *sessionPool) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if p.closed.Load() {
		return closedRow{}
	}
	return p.Pool.QueryRow(ctx, sql, args...)
}

func (p *sessionPool) Acquire(ctx context.Context) (*pgxpool.Conn, error) {
	if p.closed.Load() {
		return nil, ErrClosed
	}
	return p.Pool.Acquire(ctx)
}

func (p *sessionPool) Begin(ctx context.Context) (pgx.Tx, error) {
	return p.BeginTx(ctx, pgx.TxOptions{})
}

func (p *sessionPool) BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error) {
	if p.closed.Load() {
		return nil, ErrClosed
	}
	return p.Pool.BeginTx(ctx, opts)
}

// closedRow is the row a closed Conn's QueryRow returns.
type closedRow struct{}

func (closedRow) Scan(...any) error { return ErrClosed }

// inspectQuery lists user tables (ordinary and partitioned) with their
// columns, keys and replica identity. Generated columns are left out: they
// are neither published nor insertable, the target computes them.
const inspectQuery = `
SELECT n.nspname, c.relname, c.relkind = 'p', c.relreplident,
       pn.nspname, pc.relname,
       cols.names, cols.types, cols.oids, cols.nullable,
       ` + primaryKeyColumns + `,
       ` + identityIndexColumns + `
FROM pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace
CROSS JOIN LATERAL (
  SELECT coalesce(array_agg(a.attname ORDER BY a.attnum), '{}') AS names,
         coalesce(array_agg(format_type(a.atttypid, a.atttypmod) ORDER BY a.attnum), '{}') AS types,
         coalesce(array_agg(a.atttypid::int8 ORDER BY a.attnum), '{}') AS oids,
         coalesce(array_agg(NOT a.attnotnull ORDER BY a.attnum), '{}') AS nullable
  FROM pg_attribute a
  WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = '') cols
LEFT JOIN pg_inherits inh ON c.relispartition AND inh.inhrelid = c.oid
LEFT JOIN pg_class pc ON pc.oid = inh.inhparent
LEFT JOIN pg_namespace pn ON pn.oid = pc.relnamespace
WHERE c.relkind IN ('r', 'p') AND ` + inUserSchema + ` AND ` + notOfExtension + `
ORDER BY n.nspname, c.relname`

// InspectSchema describes the tables siphon works on: those named by
// [WithTables], or every user table in every schema but siphon's. Each
// table lists its columns (name, type with modifiers, type OID,
// nullability) in order, generated columns left out; its primary key; its
// replica identity and the
// columns that identify a row in old values; and whether it is a partitioned
// parent or a partition. With [WithPartitionRoots], partitions are left out
// (their rows are the root's), unless WithTables names them. A table named
// by WithTables that does not exist is an error.
func (c *Conn) InspectSchema(ctx context.Context) (*canonical.Schema, error) {
	rows, err := c.pool.Query(ctx, inspectQuery)
	if err != nil {
		return nil, errorf("siphon: inspect schema: %w", err)
	}
	var all []canonical.Table
	for rows.Next() {
		t, err := scanTable(rows)
		if err != nil {
			rows.Close()
			return nil, errorf("siphon: inspect schema: %w", err)
		}
		if t.PartitionOf == nil || !c.opts.partitionRoots || len(c.tables) > 0 {
			all = append(all, t)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, errorf("siphon: inspect schema: %w", err)
	}
	if len(c.tables) == 0 {
		return &canonical.Schema{Tables: all}, nil
	}
	byName := make(map[canonical.TableName]canonical.Table, len(all))
	for _, t := range all {
		byName[t.TableName()] = t
	}
	schema := &canonical.Schema{}
	for _, name := range c.tables {
		t, ok := byName[name]
		if !ok {
			return nil, errorf("siphon: inspect schema: %w", &SchemaIncompatibleError{Table: name, Problem: missingTableProblem})
		}
		schema.Tables = append(schema.Tables, t)
	}
	return schema, nil
}

func scanTable(rows pgx.Rows) (canonical.Table, error) {
	var (
		t                       canonical.Table
		identity                string
		parentSchema, parent    *string
		names, types            []string
		oids                    []int64
		nullable                []bool
		primaryKey, identityKey []string
	)
	if err := rows.Scan(&t.Schema, &t.Name, &t.Partitioned, &identity, &parentSchema, &parent,
		&names, &types, &oids, &nullable, &primaryKey, &identityKey); err != nil {
		return t, err
	}
	for i := range names {
		t.Columns = append(t.Columns, canonical.Column{Name: names[i], Type: types[i], TypeOID: uint32(oids[i]), Nullable: nullable[i]})
	}
	t.PrimaryKey = primaryKey
	switch identity {
	case "d":
		t.ReplicaIdentity, t.IdentityKey = canonical.IdentityDefault, primaryKey
	case "i":
		t.ReplicaIdentity, t.IdentityKey = canonical.IdentityIndex, identityKey
	case "f":
		t.ReplicaIdentity = canonical.IdentityFull
		for _, col := range t.Columns {
			t.IdentityKey = append(t.IdentityKey, col.Name)
		}
	default:
		t.ReplicaIdentity = canonical.IdentityNothing
	}
	if parent != nil {
		t.PartitionOf = &canonical.TableName{Schema: *parentSchema, Name: *parent}
	}
	return t, nil
}

// foreignKeysQuery lists the foreign keys among the tables named by $1
// (schemas) and $2 (names): referencing table, referenced table,
// constraint, deferrable. The copies of a constraint on partitions are
// listed too, so the references between leaf partitions are there.
const foreignKeysQuery = `
WITH t AS (
  SELECT c.oid, u.s, u.n FROM unnest($1::text[], $2::text[]) AS u(s, n)
  JOIN pg_namespace ns ON ns.nspname = u.s JOIN pg_class c ON c.relnamespace = ns.oid AND c.relname = u.n)
SELECT ct.s, ct.n, pt.s, pt.n, k.conname::text, k.condeferrable
FROM pg_constraint k JOIN t ct ON ct.oid = k.conrelid JOIN t pt ON pt.oid = k.confrelid
WHERE k.contype = 'f'
ORDER BY 1, 2, 3, 4, 5`

// readForeignKeys reads the foreign keys among tables.
func readForeignKeys(ctx context.Context, q querier, tables []canonical.TableName) ([]fkgraph.Edge, error) {
	schemas, names := nameArrays(tables)
	rows, err := q.Query(ctx, foreignKeysQuery, schemas, names)
	if err != nil {
		return nil, fmt.Errorf("read foreign keys: %w", err)
	}
	edges, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (fkgraph.Edge, error) {
		var e fkgraph.Edge
		return e, r.Scan(&e.Child.Schema, &e.Child.Name, &e.Parent.Schema, &e.Parent.Name, &e.Constraint, &e.Deferrable)
	})
	if err != nil {
		return nil, fmt.Errorf("read foreign keys: %w", err)
	}
	return edges, nil
}

// nameArrays splits table names into the arrays of their schemas and
// names, for queries that unnest them.
func nameArrays(tables []canonical.TableName) (schemas, names []string) {
	schemas, names = make([]string, len(tables)), make([]string, len(tables))
	for i, t := range tables {
		schemas[i], names[i] = t.Schema, t.Name
	}
	return schemas, names
}

// newSession opens a dedicated session (outside the pool) with siphon's
// session settings, for work that must own its session: holding a lock,
// importing a snapshot, copying a table.
func (c *Conn) newSession(ctx context.Context) (*pgx.Conn, error) { return c.newSessionIn(ctx, "") }

// newSessionIn is newSession in another database of the server; "" is the
// Conn's.
func (c *Conn) newSessionIn(ctx context.Context, database string) (*pgx.Conn, error) {
	if c.pool.closed.Load() {
		return nil, ErrClosed
	}
	config := c.config.Copy()
	if database != "" {
		config.Database = database
	}
	conn, err := pgx.ConnectConfig(ctx, config)
	if err != nil {
		return nil, fmt.Errorf("open session: %w", err)
	}
	return conn, nil
}

// newReplicationSession opens a logical replication session
// (replication=database) with siphon's session settings, which the
// walsender's output functions use too. wrap, when not nil, wraps the
// socket of each connection attempt.
func (c *Conn) newReplicationSession(ctx context.Context, wrap func(net.Conn) net.Conn) (*pgconn.PgConn, error) {
	if c.pool.closed.Load() {
		return nil, ErrClosed
	}
	config := c.config.Config.Copy()
	config.RuntimeParams["replication"] = "database"
	if wrap != nil {
		dial := config.DialFunc
		config.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
			conn, err := dial(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return wrap(conn), nil
		}
	}
	conn, err := pgconn.ConnectConfig(ctx, config)
	if err != nil {
		return nil, fmt.Errorf("open replication session: %w", c.noReplication(err))
	}
	return conn, nil
}

// noReplication turns the server's refusal of a replication session to a
// role without the REPLICATION attribute into a *PrivilegeError that says
// who grants it. No role may grant it to itself: PostgreSQL 15 lets only
// superusers change it, 16 and later only roles that have it.
func (c *Conn) noReplication(err error) error {
	return privilegeError(err, c.config.User, "the REPLICATION attribute", "replication sessions: slots, snapshots, streams, backups",
		fmt.Sprintf("have a superuser run ALTER ROLE %s WITH REPLICATION", sqltext.Ident(c.config.User)))
}
