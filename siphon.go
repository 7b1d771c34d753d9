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
	// warm keeps the session of the last apply that ended cleanly.
	warm warmApply
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
	// backupTest holds what tests do inside a Backup; the zero value does
	// nothing.
	backupTest backupTestHooks
}

// Connect checks the options, connects to the database dsn names (a
// PostgreSQL URL or keyword/value string) and checks that the server can
// serve siphon. It returns an [*OptionError] for an invalid option, an
// error wrapping [ErrInvalidDSN] that says which part of the DSN is wrong
// (never quoting a password) for a DSN that does not parse, one wrapping
// [ErrUnsafeSearchPath] for a DSN whose search_path names a schema before
// pg_catalog, and a [*PreflightError] for what nothing can work without: a
// database that is not UTF8, a table [WithTables] names that does not
// exist, and, for a Conn given a source option ([WithSlot],
// [WithPublication], [WithTables], [WithKeylessTables]), a server whose
// wal_level is not logical (a Conn without one, which may only apply
// changes, gets that error from its first operation that reads changes).
// [Conn.Preflight] checks the rest.
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
	setSessionSettings(&poolConfig.ConnConfig.Config)
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
// complete is gone when Close returns (see [Conn.CreateBaseSlot]), and so
// is the session its last apply kept (see [Conn.ConsumeCanonical]). It is
// safe to call more than once (the pool closes once) and returns nil:
// closing cannot fail. A Conn used after Close returns errors wrapping
// [ErrClosed].
func (c *Conn) Close() error {
	c.pool.closed.Store(true)
	c.meters.close()
	c.bases.release(c.pool.Pool) // the pool itself, which takes work until it is closed
	c.warm.release(c.pool.Pool)
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
  SELECT coalesce(pg_catalog.array_agg(a.attname ORDER BY a.attnum), '{}') AS names,
         coalesce(pg_catalog.array_agg(pg_catalog.format_type(a.atttypid, a.atttypmod) ORDER BY a.attnum), '{}') AS types,
         coalesce(pg_catalog.array_agg(a.atttypid::int8 ORDER BY a.attnum), '{}') AS oids,
         coalesce(pg_catalog.array_agg(NOT a.attnotnull ORDER BY a.attnum), '{}') AS nullable
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
