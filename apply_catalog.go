package siphon

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/siphondb/siphon/canonical"
	"github.com/siphondb/siphon/internal/sqltext"
)

// targetTable describes a table of the target database, from its catalog.
type targetTable struct {
	name        canonical.TableName
	partitioned bool
	columns     []targetColumn
	// key lists the primary key's columns, else the replica identity
	// index's; nil when the table has neither.
	key []string
	// ceiling, when ceilingKnown, is at or above every key of a table with
	// one integer key column, as far as this apply session can tell: its
	// largest key when it was read, raised by what the session copied since.
	// An update (which may raise a key) or an insert the session does not
	// track makes it unknown.
	ceiling      int64
	ceilingKnown bool
}

// targetColumn describes one column of a target table.
type targetColumn struct {
	name     string
	typ      string // as format_type prints it
	typeOID  uint32
	arrayOID uint32 // the type's array type; 0 when it has none
	// exact is true when two values the type's equality operator calls
	// equal always print the same text, so = can match rows exactly (not so
	// for numeric 1.0 = 1.00, float 0 = -0, json, point...).
	exact bool
	// eq is the type's equality operator as a WHERE clause writes it,
	// always qualified: OPERATOR(pg_catalog.=) for a built-in one,
	// OPERATOR(schema.=) for one of another schema (an extension's, such as
	// citext's), which siphon's search_path would not find. A bare = would
	// let an operator of a schema in the DSN's search_path win where it is
	// the closer match (varchar, an enum, a domain: pg_catalog has no = of
	// exactly their types): PostgreSQL's own apply looks up the key index's
	// operator by its type too, never by name.
	eq string
	// required is true for a NOT NULL column with no default, no identity
	// and no generation expression: an insert must give it.
	required  bool
	generated bool
	// identityAlways is true for a GENERATED ALWAYS identity column: an
	// insert writes it with OVERRIDING SYSTEM VALUE, but an UPDATE may set
	// it only to DEFAULT.
	identityAlways bool
}

func (t *targetTable) column(name string) *targetColumn {
	for i := range t.columns {
		if t.columns[i].name == name {
			return &t.columns[i]
		}
	}
	return nil
}

// exactTypes are the built-in types (by OID) whose equality implies equal
// output text. Enums are exact too.
var exactTypes = []int64{pgtype.BoolOID, pgtype.ByteaOID, pgtype.QCharOID, pgtype.NameOID, pgtype.Int8OID, pgtype.Int2OID,
	pgtype.Int4OID, pgtype.TextOID, pgtype.OIDOID, pgtype.CIDROID, pgtype.Macaddr8OID, moneyOID, pgtype.MacaddrOID,
	pgtype.InetOID, pgtype.VarcharOID, pgtype.DateOID, pgtype.TimeOID, pgtype.TimestampOID, pgtype.TimestamptzOID,
	pgtype.BitOID, pgtype.VarbitOID, pgtype.UUIDOID, pgLSNOID}

// The OIDs of built-in types pgtype does not name.
const (
	moneyOID = 790
	pgLSNOID = 3220
)

// targetTableQuery lists a table's columns (none when it has none) with
// their types, and their place in the primary key and in the replica
// identity index (int2vector subscripts start at 0, hence + 1).
const targetTableQuery = `
SELECT c.relkind = 'p', a.attname, a.atttypid::int8, t.typarray::int8, pg_catalog.format_type(a.atttypid, a.atttypmod),
       a.attnotnull AND NOT a.atthasdef AND a.attidentity = '' AND a.attgenerated = '',
       a.attgenerated <> '', a.attidentity = 'a',
       coalesce((bt.typtype = 'e' OR bt.oid::int8 = ANY ($3::int8[])) AND coalesce(co.collisdeterministic, true), false),
       coalesce(pg_catalog.array_position(pk.indkey::int2[], a.attnum) + 1, 0),
       coalesce(pg_catalog.array_position(ri.indkey::int2[], a.attnum) + 1, 0),
       coalesce((SELECT 'OPERATOR(' || pg_catalog.quote_ident(opn.nspname) || '.' || o.oprname || ')'
                 FROM pg_catalog.pg_opclass oc
                 JOIN pg_catalog.pg_am am ON am.oid = oc.opcmethod AND am.amname = 'btree'
                 JOIN pg_catalog.pg_amop ao ON ao.amopfamily = oc.opcfamily AND ao.amopstrategy = 3
                   AND ao.amoplefttype = oc.opcintype AND ao.amoprighttype = oc.opcintype
                 JOIN pg_catalog.pg_operator o ON o.oid = ao.amopopr
                 JOIN pg_catalog.pg_namespace opn ON opn.oid = o.oprnamespace
                 WHERE oc.opcdefault AND oc.opcintype = bt.oid AND opn.nspname <> 'pg_catalog' LIMIT 1),
                'OPERATOR(pg_catalog.=)')
FROM pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace
LEFT JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
LEFT JOIN pg_type t ON t.oid = a.atttypid
LEFT JOIN pg_type bt ON bt.oid = CASE WHEN t.typtype = 'd' THEN t.typbasetype ELSE t.oid END
LEFT JOIN pg_collation co ON co.oid = a.attcollation
LEFT JOIN pg_index pk ON pk.indrelid = c.oid AND pk.indisprimary
LEFT JOIN pg_index ri ON ri.indrelid = c.oid AND ri.indisreplident
WHERE n.nspname = $1 AND c.relname = $2 AND c.relkind IN ('r', 'p')
ORDER BY a.attnum`

// loadTargetTable reads a table's description from the target's catalog.
// A table that does not exist is a *SchemaIncompatibleError.
func loadTargetTable(ctx context.Context, q querier, name canonical.TableName) (*targetTable, error) {
	rows, err := q.Query(ctx, targetTableQuery, name.Schema, name.Name, exactTypes)
	if err != nil {
		return nil, fmt.Errorf("read the target's catalog for %s: %w", name, err)
	}
	defer rows.Close()
	t := &targetTable{name: name}
	var pkPos, riPos []int
	found := false
	for rows.Next() {
		var (
			col        targetColumn
			attname    *string
			typeOID    *int64
			arrayOID   *int64
			typ        *string
			req, gen   *bool
			always     *bool
			pkAt, riAt int
		)
		if err := rows.Scan(&t.partitioned, &attname, &typeOID, &arrayOID, &typ, &req, &gen, &always, &col.exact, &pkAt, &riAt, &col.eq); err != nil {
			return nil, fmt.Errorf("read the target's catalog for %s: %w", name, err)
		}
		found = true
		if attname == nil {
			continue // a table without columns
		}
		col.name, col.typeOID, col.arrayOID, col.typ = *attname, uint32(*typeOID), uint32(*arrayOID), *typ
		col.required, col.generated, col.identityAlways = *req, *gen, *always
		t.columns = append(t.columns, col)
		pkPos, riPos = append(pkPos, pkAt), append(riPos, riAt)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read the target's catalog for %s: %w", name, err)
	}
	if !found {
		return nil, &SchemaIncompatibleError{Table: name, Problem: "the table does not exist in the target database: create it there (same DDL as the source)"}
	}
	if t.key = keyColumns(t.columns, pkPos); t.key == nil {
		t.key = keyColumns(t.columns, riPos)
	}
	return t, nil
}

// truncatedParentsQuery lists the partitioned tables all of whose leaf
// partitions are among the tables $1 (schemas), $2 (names).
const truncatedParentsQuery = `
WITH listed AS (
  SELECT c.oid FROM unnest($1::text[], $2::text[]) AS u(s, n)
  JOIN pg_namespace ns ON ns.nspname = u.s JOIN pg_class c ON c.relnamespace = ns.oid AND c.relname = u.n),
parents AS (SELECT DISTINCT a.relid FROM listed l CROSS JOIN LATERAL pg_catalog.pg_partition_ancestors(l.oid) a WHERE a.relid <> l.oid)
SELECT n.nspname, c.relname FROM parents p JOIN pg_class c ON c.oid = p.relid JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE NOT EXISTS (SELECT FROM pg_catalog.pg_partition_tree(p.relid) t WHERE t.isleaf AND t.relid NOT IN (SELECT oid FROM listed))
ORDER BY 1, 2`

// truncatedParents returns the partitioned tables that a TRUNCATE of
// tables empties whole: the source lists the leaf partitions it
// truncated, and a foreign key declared on (or referencing) a partitioned
// table lets its partitions be truncated only together with that table.
func truncatedParents(ctx context.Context, q querier, tables []*targetTable) ([]canonical.TableName, error) {
	names := make([]canonical.TableName, len(tables))
	for i, t := range tables {
		names[i] = t.name
	}
	schemas, relnames := nameArrays(names)
	rows, err := q.Query(ctx, truncatedParentsQuery, schemas, relnames)
	if err != nil {
		return nil, fmt.Errorf("read the partitions of truncated tables: %w", err)
	}
	parents, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (canonical.TableName, error) {
		var n canonical.TableName
		return n, r.Scan(&n.Schema, &n.Name)
	})
	if err != nil {
		return nil, fmt.Errorf("read the partitions of truncated tables: %w", err)
	}
	return parents, nil
}

// keyColumns returns the columns with a nonzero position, in position
// order; nil when there are none.
func keyColumns(cols []targetColumn, pos []int) []string {
	var key []string
	for p := 1; p <= len(cols); p++ {
		for i := range cols {
			if pos[i] == p {
				key = append(key, cols[i].name)
			}
		}
	}
	return key
}

// binding maps a source table's columns, as a table record or a change
// describes them, onto a target table: the statements built for it bind
// values in source column order.
type binding struct {
	source   canonical.TableName
	target   *targetTable
	srcCols  []canonical.Column
	quoted   string // the target table, quoted
	cols     []boundColumn
	key      []int // source indexes of the target's key columns; nil: keyless
	isKey    []bool
	identity canonical.ReplicaIdentity // the source's, "" when unknown
	// exactKey is true when two of the source's key values are equal in
	// the target exactly when their text is: every key column is of one
	// type, named alike, in both, and that type is exact (see
	// targetColumn.exact).
	exactKey bool

	// shapes caches the statement of each change shape (see shape.key).
	shapes map[string]*statement
}

// boundColumn is a source column with what the target says about it.
type boundColumn struct {
	quoted   string
	typeOID  uint32
	arrayOID uint32
	exact    bool
	eq       string // the equality operator (see targetColumn.eq)
	// identityAlways: see targetColumn.identityAlways.
	identityAlways bool
}

// bind checks that the source columns fit the target table and maps them.
// src, the source's table record, is nil when only the columns are known.
// The problems it finds are *SchemaIncompatibleError.
func bind(t *targetTable, cols []canonical.Column, src *canonical.Table) (*binding, error) {
	var identity canonical.ReplicaIdentity
	if src != nil {
		identity = src.ReplicaIdentity
	}
	fail := func(col, problem string) error {
		return &SchemaIncompatibleError{Table: t.name, Column: col, Problem: problem}
	}
	b := &binding{source: t.name, target: t, srcCols: cols, quoted: sqltext.Name(t.name.Schema, t.name.Name),
		identity: identity, isKey: make([]bool, len(cols)), shapes: map[string]*statement{}}
	for _, sc := range cols {
		tc := t.column(sc.Name)
		switch {
		case tc == nil:
			return nil, fail(sc.Name, "the target table has no such column: add it to the target table (the source's schema changed, and "+
				"without the schema capture siphon adds only a nullable column without a default itself, see InstallSchemaCapture)")
		case tc.generated:
			return nil, fail(sc.Name, "the target column is generated and cannot take the source's values: make it a plain column")
		case sc.Type != "" && sc.Type != tc.typ && builtinType(sc.TypeOID):
			return nil, fail(sc.Name, fmt.Sprintf("the column is %s in the source but %s in the target: give both the same type", sc.Type, tc.typ))
		}
		b.cols = append(b.cols, boundColumn{quoted: sqltext.Ident(sc.Name), typeOID: tc.typeOID, arrayOID: tc.arrayOID, exact: tc.exact, eq: tc.eq,
			identityAlways: tc.identityAlways})
	}
	for _, tc := range t.columns {
		if tc.required && !slices.ContainsFunc(cols, func(c canonical.Column) bool { return c.Name == tc.name }) {
			return nil, fail(tc.name, "the target column is NOT NULL without a default and the source has no such column: give it a default or drop it")
		}
	}
	for _, k := range t.key {
		i := slices.IndexFunc(cols, func(c canonical.Column) bool { return c.Name == k })
		if i < 0 {
			return nil, fail(k, "the column is part of the target table's key but the source has no such column: give both tables the same key")
		}
		b.key, b.isKey[i] = append(b.key, i), true
	}
	b.exactKey = b.key != nil
	for _, k := range b.key {
		tc := t.column(cols[k].Name)
		b.exactKey = b.exactKey && tc.exact && cols[k].Type != "" && cols[k].Type == tc.typ
	}
	if src != nil {
		if err := checkIdentity(t, src); err != nil {
			return nil, err
		}
	}
	return b, nil
}

// builtinType reports whether a source type OID is one of PostgreSQL's
// own types, whose names never change. A user type's name is read from
// today's catalog, which a stream read after the fact may find renamed
// (ALTER TYPE ... RENAME) while the target, at that point of the stream,
// still has the old name: its values are left to the target's input
// function to check. An unknown OID (0) counts as built in.
func builtinType(oid uint32) bool { return oid < firstNormalOID }

// firstNormalOID is PostgreSQL's FirstNormalObjectId: OIDs below it
// belong to the system.
const firstNormalOID = 16384

// checkIdentity checks that the old values the source sends with updates
// and deletes (its replica identity) can find the target's rows: they must
// hold the target's key or, for a keyless target, every column.
func checkIdentity(t *targetTable, src *canonical.Table) error {
	covered := src.IdentityKey
	if src.ReplicaIdentity == canonical.IdentityFull {
		covered = nil
		for _, c := range src.Columns {
			covered = append(covered, c.Name)
		}
	}
	if src.ReplicaIdentity == "" || len(covered) == 0 {
		return nil // unknown, or no updates nor deletes can come
	}
	if t.key == nil && src.ReplicaIdentity != canonical.IdentityFull {
		return &SchemaIncompatibleError{Table: t.name, Problem: fmt.Sprintf(
			"the target table has no primary key or replica identity index, and the source's replica identity is %s, not full: give the target the source's key, or set REPLICA IDENTITY FULL on the source table",
			src.ReplicaIdentity)}
	}
	for _, k := range t.key {
		if !slices.Contains(covered, k) {
			return &SchemaIncompatibleError{Table: t.name, Column: k, Problem: fmt.Sprintf(
				"the column is part of the target's key but not of the source's replica identity (%s): updates and deletes could not find their rows; give both tables the same key",
				strings.Join(covered, ", "))}
		}
	}
	return nil
}

// applyCache holds how [Conn.ApplyChange] applies, the target tables it
// has looked up, and their bindings to the latest source columns seen. The
// zero value is ready to use.
type applyCache struct {
	mu       sync.Mutex
	role     *applyRole // nil until read
	targets  map[canonical.TableName]*targetTable
	bindings map[canonical.TableName]*binding
}

// applyRole returns how c applies, read once.
func (a *applyCache) applyRole(ctx context.Context, c *Conn) (applyRole, error) {
	a.mu.Lock()
	role := a.role
	a.mu.Unlock()
	if role != nil {
		return *role, nil
	}
	r, err := c.readApplyRole(ctx, c.pool)
	if err != nil {
		return r, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.role = &r
	return r, nil
}

// target returns the target table name, from the cache or the catalog; an
// ordinary session (role.guard) first checks that applying changes to it
// fires nothing native apply would not.
func (a *applyCache) target(ctx context.Context, q querier, role applyRole, name canonical.TableName) (*targetTable, error) {
	a.mu.Lock()
	t := a.targets[name]
	a.mu.Unlock()
	if t != nil {
		return t, nil
	}
	t, err := loadTargetTable(ctx, q, name)
	if err != nil {
		return nil, err
	}
	if role.guard {
		if err := checkNothingFires(ctx, q, role.role, []canonical.TableName{name}, changeEvents); err != nil {
			return nil, err
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.targets == nil {
		a.targets = map[canonical.TableName]*targetTable{}
	}
	a.targets[name] = t
	return t, nil
}

// binding returns the binding of cols to the target table name, made anew
// when the columns differ from the cached binding's.
func (a *applyCache) binding(ctx context.Context, q querier, role applyRole, name canonical.TableName, cols []canonical.Column) (*binding, error) {
	a.mu.Lock()
	b := a.bindings[name]
	a.mu.Unlock()
	if b != nil && slices.Equal(b.srcCols, cols) {
		return b, nil
	}
	t, err := a.target(ctx, q, role, name)
	if err != nil {
		return nil, err
	}
	if b, err = bind(t, slices.Clone(cols), nil); err != nil {
		a.forget(name) // the cached table may be stale
		return nil, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.bindings == nil {
		a.bindings = map[canonical.TableName]*binding{}
	}
	a.bindings[name] = b
	return b, nil
}

// statement returns the statement of shape sh for b, built once.
func (a *applyCache) statement(b *binding, sh *shape) *statement {
	a.mu.Lock()
	defer a.mu.Unlock()
	return b.statement(sh)
}

// forgetAll drops what is cached about every table.
func (a *applyCache) forgetAll() {
	a.mu.Lock()
	defer a.mu.Unlock()
	clear(a.targets)
	clear(a.bindings)
}

// forget drops what is cached about a table, to read it again next time.
func (a *applyCache) forget(name canonical.TableName) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.targets, name)
	delete(a.bindings, name)
}
