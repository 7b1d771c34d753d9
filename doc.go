// Package siphon moves PostgreSQL data out and back in on one timeline.
//
// Everything siphon produces carries a [canonical.Position] (a WAL location,
// LSN): a consistent snapshot taken at an exact Position, the logical change
// stream (pgoutput) that continues it, full backups (pg_dump) aligned to a
// snapshot's Position, and incremental backups that are bounded runs of that
// stream. Each piece starts exactly where the previous one ended, so they
// chain with no gap and no duplicate, and apply to another database exactly
// once.
//
// A [Conn] is the entry point:
//
//	c, err := siphon.Connect(ctx, dsn, siphon.WithSlot("orders_cdc"))
//	if err != nil { ... }
//	defer c.Close()
//	pos, err := c.EmitCanonical(ctx, nil, snapshotFile)    // snapshot at pos
//	last, err := c.StreamChanges(ctx, pos, handle)          // every commit after pos
//
// The examples show the main jobs whole: a snapshot and the stream after it
// ([Conn.EmitCanonical], [Conn.StreamChanges]), a backup chain
// ([Conn.Backup], [Conn.BackupIncremental]), applying it
// ([Conn.ConsumeCanonical]), a live migration ([Conn.Cutover]).
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
//     versioned, checksummed envelope; chains; point-in-time restore.
//   - [Conn.ApplyChange], [Conn.ConsumeCanonical], [Conn.AppliedPosition]:
//     apply snapshots and change sets to a target exactly once;
//     [Conn.AppliedSources], [Conn.ResetAppliedPosition] and
//     [Conn.SweepOrphanOriginsWith]: what a target holds of each source.
//   - [Conn.CopySchema]: a target's schema made the source's (user objects
//     only), alone or as the start of [Conn.Replicate].
//   - [Conn.Replicate]: a live replica, its progress in time and bytes;
//     [Conn.Cutover]: the end of a live migration, the target checked.
//   - [Conn.Slots], [Conn.CreateBaseSlot], [Conn.DropSlot],
//     [Conn.SweepOrphanSlots], [Conn.Detach]: slot health and lifecycle.
//   - [Conn.Preflight]: what siphon can and cannot do on a server, each with
//     its fix; [Conn.SyncPublication]: the publication in line with today's
//     tables.
//
// Settings: who a Conn is (its slot, publication, tables, policies, keys,
// logger, metrics) are the options of [Connect]; what one call does is that
// call's arguments and its …Options struct ([ApplyOptions],
// [BackupOptions], [ReplicateOptions]...), whose zero value is the default.
//
// # Positions and delivery
//
// A resume Position is the end of a committed transaction (the Position of
// an [canonical.OpCommit]) or a snapshot's consistent point.
// StreamChanges(from) delivers exactly the transactions whose commit ends
// after from, each as OpBegin, its changes, OpCommit. A consumer that stores
// the Position of the last OpCommit it handled, and restarts from it, sees
// nothing twice and misses nothing.
//
// The slot is acknowledged only up to the end of a transaction whose
// OpCommit callback returned nil (or, for a consumer that makes
// transactions durable later, up to what it reports through
// [StreamOptions].Durable of [Conn.StreamChangesWith]). A resume that would silently skip changes
// (a Position behind the slot, a lost or dropped slot) is a
// [*ResumeGapError]. Keepalives are answered while the callback is slow,
// memory stays bounded however large a transaction is, and an idle slot
// keeps advancing, so that it does not pin WAL.
//
// # Alignment
//
// Snapshots and full backups are taken inside a snapshot exported by a
// replication slot created after the persistent slot: the rows they hold are
// exactly the transactions committed at or before their Position, and
// streaming from that Position continues with no gap.
//
// # Apply
//
// Each source transaction is applied in one target transaction together
// with its Position, exactly once, as PostgreSQL's logical replication
// applies it: with session_replication_role = replica, so the target's
// ordinary triggers, rules and foreign-key checks and actions do not fire
// (the source ran them, and their effects arrive as changes of their own)
// while ENABLE REPLICA and ENABLE ALWAYS ones do. The target ends equal to
// the source. See [Conn.ConsumeCanonical] for roles that may not set that
// parameter, and [WithTriggersOnApply].
//
// Every session siphon opens, on sources and targets, runs with search_path
// = pg_catalog, pg_temp (PostgreSQL's own apply workers run with an empty
// one), so that no function or operator a database's owner puts first in the
// database's search_path runs in place of a built-in siphon calls. Code of
// the target's that fires during an apply (a trigger's function, a
// constraint's) must therefore name its tables and functions with their
// schema, or set its own search_path (CREATE FUNCTION … SET search_path); an
// apply that meets such a name says so in its error. A search_path the DSN
// gives (search_path=public, or in its options or PGOPTIONS) is kept: your
// choice, where only roles you trust may create objects in its schemas.
// Connect refuses one that names a schema before pg_catalog
// ([ErrUnsafeSearchPath]).
//
// # Slots
//
// Creating a slot waits for every transaction holding a transaction ID.
// siphon bounds that wait, names the blocking sessions in a
// [*SlotBlockedError], and leaves no slot, session or lock behind on
// failure, nor the publication the failed call created for the slot. A role
// without the REPLICATION attribute gets a [*PrivilegeError] that says who
// grants it. A full max_replication_slots is mended once by dropping
// siphon's base slots that lost their WAL, never a live chain's.
// [Conn.Detach] removes what the role may remove and returns a
// [*DetachIncompleteError] naming what stays and who may remove it.
//
// # What is and is not captured
//
// Captured: INSERT, UPDATE, DELETE and TRUNCATE of published tables (every
// table of the database with a usable replica identity, or the [WithTables]
// set; see [WithKeylessTables] for the others), transactional and
// non-transactional logical decoding messages, schema changes and sequences
// (below), and, through table records in the canonical stream, each table's
// columns as they change. Not captured, as with any logical replication:
// large objects, unlogged and temporary tables, and generated columns (the
// target computes them). Full backups (pg_dump) include large objects.
//
// A partition's rows and changes carry the partition's own name, unless
// [WithPartitionRoots] makes them carry the partitioned table's (PostgreSQL's
// publish_via_partition_root): a target then needs only the root,
// partitioned as it likes or not at all.
//
// # Schema changes
//
// Logical decoding carries no DDL. A superuser installs siphon's capture in
// the source database when asked to ([Conn.InstallSchemaCapture]: nothing
// installs it as a side effect, and [Conn.Preflight] says what it would
// install): an event trigger that puts every CREATE, ALTER, DROP, COMMENT,
// GRANT and REVOKE into the stream as an [canonical.OpDDL] change, at its
// exact place among its transaction's row changes. The change holds the
// statement as it ran (one statement of a multi-statement query, or the one
// a function or DO block ran, as PostgreSQL's own grammar splits them;
// CONCURRENTLY left out), the source's effective schemas and the role that
// ran it.
//
// Apply ([Conn.ConsumeCanonical], [Conn.RestoreChain], [Conn.Replicate],
// [Conn.ApplyChange]) runs it on the target at that place, in the same
// target transaction as the rows around it. A statement the target
// refuses, or one siphon cannot replay with certainty, stops the apply with
// a [*SchemaChangeError], nothing of its transaction applied;
// [ApplyOptions].SkipSchemaChanges goes on once the target was put right by
// hand. Statements that fill tables as they create them (CREATE TABLE AS,
// SELECT INTO, REFRESH MATERIALIZED VIEW) fill them on the target from the
// same rows, which is why a function such a statement calls runs again on
// the target.
//
// The trigger also keeps the publications safe: a table created in a
// transaction joins every publication of all tables before its first row,
// and a published table that loses its usable replica identity leaves it (as
// [WithKeylessTables] says), so the application's statements keep working. A
// publication of your own FOR ALL TABLES or FOR TABLES IN SCHEMA holds its
// new tables by itself, and keeps a table that lost its usable replica
// identity (PostgreSQL then refuses that table's UPDATE and DELETE; the
// stream logs it). It never makes the application's DDL fail, and a newer
// siphon's capture is installed by calling [Conn.InstallSchemaCapture] again
// (until then streams warn that schema changes are not captured). The
// [Conn.Detach] that drops the database's last change-stream slot removes
// it. The capture's rows pass through the table siphon.schema_changes, which
// siphon's publications hold: a native subscription (CREATE SUBSCRIPTION) of
// one of them needs that table on the subscriber too (CREATE SCHEMA siphon;
// CREATE TABLE siphon.schema_changes (id bigint PRIMARY KEY, change jsonb
// NOT NULL)).
//
// Without the capture (not installed, or [WithoutSchemaCapture]), apply
// follows the column changes the stream shows where that is exact (a
// nullable column added without a default, a column dropped) and stops at
// any other with a [*SchemaIncompatibleError] naming it.
//
// # Which schema changes a target runs
//
// A schema change is code the target runs. A target runs only those of the
// source's superusers, the role that installed the capture and the roles
// named by [WithTrustedSchemaRoles], decided on the role that logged in on
// the source (session_user: SET ROLE does not change it), and those of a
// file or a message only when it is authenticated with one of the Conn's
// keys ([WithStreamKey]) or the call accepts it
// ([ApplyOptions].UnauthenticatedSchemaChanges).
//
// A statement runs as the role it ran as on the source (SET LOCAL ROLE, as
// PostgreSQL 16's run_as_owner = false does for its apply), under the
// source's search_path with "$user" expanded. Where the target has no such
// role, or the applying role may not take it, it runs as the applying role
// only when it ran as a source superuser, and stops the apply with an
// [*UntrustedSchemaChangeError] otherwise: the target never grants more
// than the source had. A statement whose meaning depends on who runs it
// (GRANT, REVOKE, ALTER DEFAULT PRIVILEGES, DROP or REASSIGN OWNED, a
// CURRENT_USER, SESSION_USER or CURRENT_ROLE role, user mappings, servers,
// foreign data wrappers, IMPORT FOREIGN SCHEMA, SECURITY LABEL) runs only
// with [WithRoleDependentSchemaChanges]. Any other stops the apply with an
// [*UntrustedSchemaChangeError] naming the role and the option: never
// applied, never skipped silently. The column types a stream shows are
// checked by the target before they are used. SECURITY.md in the
// repository says whom siphon trusts and what each attack meets.
//
// # Sequences
//
// Sequences change outside transactions and logical decoding does not carry
// them. A snapshot carries every sequence's state read after its rows, an
// incremental the state read once its bound is reached, so at or after its
// Position; [Conn.Replicate] sets the target's every 10 seconds and when it
// stops. Apply moves a target sequence forward, never back: the target's
// next value is never one the source used up to that Position (target >=
// source). With [WithTables], the sequences the tables own or use in
// defaults are carried.
//
// # Requirements
//
// PostgreSQL 15 or later with wal_level=logical, free replication slots and
// WAL senders, a UTF8 database, and a role with the REPLICATION attribute
// that may create publications (or owns the tables); a superuser, once, to
// install the schema capture; pg_dump and pg_restore of the server's
// release or newer for backups. Replication origins, which apply uses to
// record progress atomically, need a superuser or EXECUTE on the
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
// to the [WithLogger] logger, never per row, and reports metrics through an
// OpenTelemetry MeterProvider given with [WithMeterProvider] (none by
// default). A DSN's password never appears in siphon's errors or log lines,
// and child processes (pg_dump) receive it through a password file in their
// environment, never argv.
package siphon
