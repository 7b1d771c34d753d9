package siphon

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"

	"github.com/siphondb/siphon/canonical"
	"github.com/siphondb/siphon/internal/pgerr"
	"github.com/siphondb/siphon/internal/sqltext"
	"github.com/siphondb/siphon/pgdump"
)

// A full backup's tables are guarded from the snapshot to pg_dump's end.
//
// TRUNCATE and the ALTER TABLEs that rewrite a table are not MVCC-safe:
// once one commits, a transaction whose snapshot is older reads the table
// as empty (the rows it wrote carry its own transaction, which the
// snapshot does not see). pg_dump locks its tables only once it has
// started and read the catalog, one after another, and an extension's
// configuration tables not at all before it reads them, so one committed
// between the backup's snapshot and pg_dump's lock on its table would
// leave the backup without the table's rows, and no error. A wait of
// pg_dump's for a lock on an earlier table (a migration holding it)
// stretches that window to the length of the wait.
//
// So before pg_dump starts, a transaction in the snapshot (the guard, a
// session of its own) locks every table the dump holds, with their
// partitions and children as pg_dump's LOCK does, and the extensions'
// configuration tables (ACCESS SHARE), never waiting for a lock while it
// holds another (lockTables: it does not deadlock with a user's TRUNCATE
// ... CASCADE), and then checks that none was rewritten, dropped or
// replaced since the snapshot. From then until pg_dump ends, no such
// statement commits: it waits for the guard. pg_dump's own locks are
// granted beside the guard's, unless such a statement queued for a table
// before pg_dump asked for it: pg_dump then waits behind it, which waits
// for the guard, which waits for pg_dump, a cycle the server cannot see.
// pg_dump gives up after backupLockWait instead (a parallel dump's
// workers at once, as they lock with NOWAIT), and Backup returns a
// [*BackupConflictError]; the statement goes on once the guard is gone.

// backupLockWait is how long pg_dump waits for a table lock
// (--lock-wait-timeout). Beside the guard's locks it waits only behind a
// statement that waits for the guard, or for a table the guard does not
// hold (an extension's own, which pg_dump locks for its policies).
const backupLockWait = 10 * time.Second

// backupTestHooks is what a test does inside a Backup: afterSnapshot
// runs once the snapshot exists, afterGuard once the guard holds its
// tables (both before pg_dump starts); lockWait replaces backupLockWait.
type backupTestHooks struct {
	afterSnapshot, afterGuard func()
	lockWait                  time.Duration
}

// run runs hook, if it is set.
func (h *backupTestHooks) run(hook func()) {
	if hook != nil {
		hook()
	}
}

// BackupConflictError reports a statement of another session that
// conflicted with [Conn.Backup] on a table: a TRUNCATE, a table-rewriting
// ALTER TABLE (or VACUUM FULL, CLUSTER, a DROP, a rename) committed after
// the backup's snapshot and before the backup locked the table, which
// would have left the dump without the table's rows as of the snapshot;
// or one queued for the table before pg_dump locked it, which would have
// waited for the backup while the backup waited for it (pg_dump gave up,
// after 10 s or, in a parallel dump, at once, and the statement went on).
// w then holds nothing (a table rewritten) or an incomplete envelope,
// which Verify and Restore refuse. It is [Retryable]: a new Backup takes
// a new snapshot.
type BackupConflictError struct {
	Table   canonical.TableName
	Problem string
	Err     error // pg_dump's failure, for a statement that queued
}

func (e *BackupConflictError) Error() string {
	msg := fmt.Sprintf("siphon: backup: table %s: %s; run the backup again", e.Table, e.Problem)
	if e.Err != nil {
		msg += " (" + e.Err.Error() + ")"
	}
	return msg
}

func (e *BackupConflictError) Unwrap() error { return e.Err }

// backupGuard is the transaction in the backup's snapshot that holds its
// tables until pg_dump ends, in a session of its own.
type backupGuard struct {
	conn *pgx.Conn
	// tables are what the dump holds, in name order, then the
	// extensions' configuration tables.
	tables []snapshotTable
}

// snapshotTable is a table as the backup's snapshot sees it.
type snapshotTable struct {
	name        canonical.TableName
	oid         uint32
	relfilenode uint32 // 0 for a partitioned table
	// extConfig: an extension's configuration table, whose rows pg_dump
	// dumps with the extension.
	extConfig bool
}

// guardBackup opens the guard in snapshot, lists the tables opt selects
// and locks and checks them (see above).
func (c *Conn) guardBackup(ctx context.Context, snapshot string, opt BackupOptions) (_ *backupGuard, err error) {
	conn, err := c.newSession(ctx)
	if err != nil {
		return nil, err
	}
	g := &backupGuard{conn: conn}
	defer func() {
		if err != nil {
			g.release()
		}
	}()
	// The guard waits for its locks as long as pg_dump would, and then
	// stays idle in its transaction until pg_dump ends: none of the
	// role's timeouts may end it half way.
	if _, err := conn.PgConn().Exec(ctx, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; "+
		"SET TRANSACTION SNAPSHOT "+sqltext.Literal(snapshot)+"; "+noTimeouts(true)).ReadAll(); err != nil {
		return nil, fmt.Errorf("import snapshot %q: %w", snapshot, err)
	}
	if g.tables, err = snapshotTables(ctx, conn, opt); err != nil {
		return nil, fmt.Errorf("list tables in snapshot: %w", err)
	}
	locks := make([]tableLock, len(g.tables))
	for i, t := range g.tables {
		locks[i] = tableLock{table: t.name, mode: accessShare}
	}
	if err := lockTables(ctx, conn, locks); err != nil {
		var lockErr *tableLockError
		if errors.As(err, &lockErr) && (pgerr.Is(err, pgerrcode.UndefinedTable) || pgerr.Is(err, pgerrcode.InvalidSchemaName)) {
			return nil, &BackupConflictError{Table: lockErr.table, Problem: "dropped or renamed (or its schema) after the backup's snapshot"}
		}
		return nil, err
	}
	if err := c.checkNotRewritten(ctx, g.tables, opt); err != nil {
		return nil, err
	}
	return g, nil
}

// snapshotTables lists the tables the dump holds, as the snapshot of q
// sees them: user tables (ordinary and partitioned, not those of
// extensions) that the options select, then the extensions'
// configuration tables.
func snapshotTables(ctx context.Context, q querier, opt BackupOptions) ([]snapshotTable, error) {
	rows, err := q.Query(ctx, `SELECT n.nspname, c.relname, c.oid, c.relfilenode, NOT (`+notOfExtension+`)
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE c.relkind IN ('r', 'p') AND c.relpersistence <> 't' AND `+inUserSchema+`
		  AND (`+notOfExtension+` OR c.oid IN (SELECT pg_catalog.unnest(extconfig) FROM pg_catalog.pg_extension))
		ORDER BY 5, n.nspname, c.relname`)
	if err != nil {
		return nil, err
	}
	all, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (t snapshotTable, err error) {
		return t, r.Scan(&t.name.Schema, &t.name.Name, &t.oid, &t.relfilenode, &t.extConfig)
	})
	if err != nil {
		return nil, err
	}
	byName := make(map[canonical.TableName]snapshotTable, len(all))
	var names []canonical.TableName
	var extConfig []snapshotTable
	for _, t := range all {
		if t.extConfig {
			extConfig = append(extConfig, t)
		} else {
			byName[t.name] = t
			names = append(names, t.name)
		}
	}
	names, err = selectTables(names, opt)
	if err != nil {
		return nil, err
	}
	out := make([]snapshotTable, len(names), len(names)+len(extConfig))
	for i, n := range names {
		out[i] = byName[n]
	}
	return append(out, extConfig...), nil
}

// checkNotRewritten compares the locked tables as they are now, read
// outside the snapshot, with the snapshot: a table whose rows pg_dump
// dumps must be the same relation with the same storage. It runs once the
// locks are granted, so what it sees stays so until pg_dump ends.
func (c *Conn) checkNotRewritten(ctx context.Context, tables []snapshotTable, opt BackupOptions) error {
	noData := map[canonical.TableName]bool{}
	for _, s := range opt.ExcludeTableData {
		if t, err := parseTableName(s); err == nil {
			noData[t] = true
		}
	}
	var names []string
	var checked []snapshotTable
	for _, t := range tables {
		if !noData[t.name] {
			names = append(names, sqltext.Name(t.name.Schema, t.name.Name))
			checked = append(checked, t)
		}
	}
	rows, err := c.pool.Query(ctx, `SELECT c.oid, c.relfilenode FROM unnest($1::text[]) WITH ORDINALITY AS q(name, i)
		LEFT JOIN pg_catalog.pg_class c ON c.oid = pg_catalog.to_regclass(q.name) ORDER BY q.i`, names)
	if err != nil {
		return fmt.Errorf("check tables: %w", err)
	}
	now, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (t snapshotTable, err error) {
		var oid, relfilenode *uint32
		if err := r.Scan(&oid, &relfilenode); err != nil || oid == nil {
			return t, err
		}
		return snapshotTable{oid: *oid, relfilenode: *relfilenode}, nil
	})
	if err != nil {
		return fmt.Errorf("check tables: %w", err)
	}
	for i, t := range checked {
		switch {
		case now[i].oid != t.oid:
			return &BackupConflictError{Table: t.name, Problem: "dropped, renamed or created again after the backup's snapshot"}
		case now[i].relfilenode != t.relfilenode:
			return &BackupConflictError{Table: t.name, Problem: "rewritten after the backup's snapshot (TRUNCATE, a rewriting ALTER TABLE, VACUUM FULL, CLUSTER): " +
				"its rows as of the snapshot may be gone from it"}
		}
	}
	return nil
}

// names lists the tables the dump holds (not the extensions').
func (g *backupGuard) names() []canonical.TableName {
	var names []canonical.TableName
	for _, t := range g.tables {
		if !t.extConfig {
			names = append(names, t.name)
		}
	}
	return names
}

// alive checks, once pg_dump has ended, that the guard held its locks
// all along: a session ended by the server or the network let go of them.
func (g *backupGuard) alive(ctx context.Context) error {
	if _, err := g.conn.Exec(ctx, "SELECT"); err != nil {
		return fmt.Errorf("the session that held the tables for the dump ended: %w", err)
	}
	return nil
}

// queuedConflict explains dumpErr, pg_dump's failure to lock a table,
// when a statement that needs the table alone waits for the guard: pg_dump
// waited behind it and gave up (backupLockWait). It returns nil for any
// other failure.
func (g *backupGuard) queuedConflict(ctx context.Context, q querier, dumpErr *pgdump.ExitError) error {
	if !strings.Contains(dumpErr.Stderr, "statement timeout") && !strings.Contains(dumpErr.Stderr, "could not obtain lock") {
		return nil // not a lock wait pg_dump gave up (as pg_dump words it in English)
	}
	ctx, cancel := cleanupContext(ctx)
	defer cancel()
	oids := make([]uint32, len(g.tables))
	for i, t := range g.tables {
		oids[i] = t.oid
	}
	var t canonical.TableName
	err := q.QueryRow(ctx, `SELECT n.nspname, c.relname FROM pg_catalog.pg_locks l
		JOIN pg_catalog.pg_class c ON c.oid = l.relation JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
		WHERE l.locktype = 'relation' AND NOT l.granted AND l.mode = 'AccessExclusiveLock' AND l.relation = ANY($1::oid[])
		  AND l.database = (SELECT oid FROM pg_catalog.pg_database WHERE datname = pg_catalog.current_database())
		  AND $2::int4 = ANY (pg_catalog.pg_blocking_pids(l.pid))
		ORDER BY 1, 2 LIMIT 1`, oids, int32(g.conn.PgConn().PID())).Scan(&t.Schema, &t.Name)
	if err != nil {
		return nil
	}
	return &BackupConflictError{Table: t, Err: dumpErr,
		Problem: "a statement that needs it alone (TRUNCATE, ALTER TABLE, DROP) waited for the backup's lock when pg_dump asked for its own, and pg_dump gave up waiting behind it"}
}

// release ends the guard: its locks go. It may be called again.
func (g *backupGuard) release() {
	if !g.conn.IsClosed() {
		closeSession(g.conn.PgConn())
	}
}
