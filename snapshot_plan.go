package siphon

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"

	"github.com/siphondb/siphon/canonical"
	"github.com/siphondb/siphon/internal/copytext"
	"github.com/siphondb/siphon/internal/pgerr"
	"github.com/siphondb/siphon/internal/sqltext"
)

// copyGroup is one table of the schema and the relations whose rows are
// delivered as it: the table itself, or leaf partitions of a partitioned
// table.
type copyGroup struct {
	table    *canonical.Table
	rels     []*relPlan
	tasks    int
	batches  chan *rowBatch
	progress Progress
}

// relPlan is how one relation is copied.
type relPlan struct {
	group *copyGroup
	name  canonical.TableName
	snap  relAtSnapshot
	kinds []copytext.Kind
	// selectList is "<column or output function call>, ..." .
	selectList string
	checkpoint TableCheckpoint // where its copy stands before this run
	restart    *TableCheckpoint
	tasks      []*copyTask
}

// copyTask is one ctid range of one relation, copied by one session.
type copyTask struct {
	rel      *relPlan
	from, to CTID
	// Consumer side: rows delivered so far.
	reached       CTID
	started, done bool
}

// relAtSnapshot is a relation as the snapshot's catalog describes it.
type relAtSnapshot struct {
	oid         uint32
	name        canonical.TableName
	partitioned bool
	relfilenode uint32
	toastEmpty  bool
	estRows     int64
	size        int64
	cols        []columnAtSnapshot
	primaryKey  []string
}

type columnAtSnapshot struct {
	attnum  int16
	name    string
	typeOID uint32
	base    uint32 // the type, or a domain's base type
	output  string // the type's output function, quoted and qualified
}

// relationsQuery reads relations as the transaction's snapshot sees them
// (plain catalog reads in a REPEATABLE READ transaction use its snapshot),
// by OID ($1) or by schema and name ($2, $3). Sizes are current.
const relationsQuery = `
SELECT c.oid, n.nspname, c.relname, c.relkind = 'p', c.relfilenode::int8,
       c.reltoastrelid = 0 OR coalesce(pg_catalog.pg_relation_size(nullif(c.reltoastrelid, 0)), 0) = 0,
       greatest(c.reltuples, 0)::int8, coalesce(pg_catalog.pg_relation_size(c.oid), 0),
       cols.attnums, cols.names, cols.types, cols.bases, cols.outputs,
       ` + primaryKeyColumns + `
FROM pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace
CROSS JOIN LATERAL (
  SELECT coalesce(pg_catalog.array_agg(a.attnum ORDER BY a.attnum), '{}') AS attnums,
         coalesce(pg_catalog.array_agg(a.attname ORDER BY a.attnum), '{}') AS names,
         coalesce(pg_catalog.array_agg(a.atttypid::int8 ORDER BY a.attnum), '{}') AS types,
         coalesce(pg_catalog.array_agg(b.base::int8 ORDER BY a.attnum), '{}') AS bases,
         coalesce(pg_catalog.array_agg(pg_catalog.quote_ident(pn.nspname) || '.' || pg_catalog.quote_ident(p.proname) ORDER BY a.attnum), '{}') AS outputs
  FROM pg_attribute a
  JOIN pg_type t ON t.oid = a.atttypid
  JOIN pg_proc p ON p.oid = t.typoutput
  JOIN pg_namespace pn ON pn.oid = p.pronamespace
  CROSS JOIN LATERAL (
    WITH RECURSIVE d(oid) AS (
      SELECT a.atttypid
      UNION ALL
      SELECT dt.typbasetype FROM pg_type dt JOIN d ON dt.oid = d.oid WHERE dt.typtype = 'd')
    SELECT d.oid FROM d JOIN pg_type bt ON bt.oid = d.oid WHERE bt.typtype <> 'd') b(base)
  WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = '') cols
WHERE c.relkind IN ('r', 'p')
  AND (c.oid = ANY($1::oid[]) OR (n.nspname, c.relname) IN (SELECT * FROM unnest($2::text[], $3::text[])))`

// relationsAtSnapshot runs relationsQuery in tx.
func relationsAtSnapshot(ctx context.Context, tx *pgx.Conn, oids []uint32, names []canonical.TableName) ([]relAtSnapshot, error) {
	schemas, tables := make([]string, len(names)), make([]string, len(names))
	for i, n := range names {
		schemas[i], tables[i] = n.Schema, n.Name
	}
	rows, err := tx.Query(ctx, relationsQuery, oids, schemas, tables)
	if err != nil {
		return nil, err
	}
	var out []relAtSnapshot
	for rows.Next() {
		var (
			r                     relAtSnapshot
			attnums               []int16
			names, outputs        []string
			types, bases          []int64
			relfilenode           int64
			toastEmpty, partition bool
		)
		if err := rows.Scan(&r.oid, &r.name.Schema, &r.name.Name, &partition, &relfilenode, &toastEmpty,
			&r.estRows, &r.size, &attnums, &names, &types, &bases, &outputs, &r.primaryKey); err != nil {
			rows.Close()
			return nil, err
		}
		r.partitioned, r.relfilenode, r.toastEmpty = partition, uint32(relfilenode), toastEmpty
		for i := range names {
			r.cols = append(r.cols, columnAtSnapshot{attnum: attnums[i], name: names[i],
				typeOID: uint32(types[i]), base: uint32(bases[i]), output: outputs[i]})
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// partitionTree lists the partitions below the given partitioned tables, at
// the snapshot: child OID to parent OID.
func partitionTree(ctx context.Context, tx *pgx.Conn, parents []uint32) (map[uint32][]uint32, error) {
	rows, err := tx.Query(ctx, `
WITH RECURSIVE tree(relid, parent) AS (
  SELECT inhrelid, inhparent FROM pg_inherits WHERE inhparent = ANY($1::oid[])
  UNION ALL
  SELECT i.inhrelid, i.inhparent FROM pg_inherits i JOIN tree ON i.inhparent = tree.relid)
SELECT relid, parent FROM tree ORDER BY relid`, parents)
	if err != nil {
		return nil, err
	}
	children := map[uint32][]uint32{}
	var child, parent uint32
	_, err = pgx.ForEachRow(rows, []any{&child, &parent}, func() error {
		children[parent] = append(children[parent], child)
		return nil
	})
	return children, err
}

// planGroups checks schema against the snapshot's catalog and decides which
// relations deliver each table's rows.
func planGroups(ctx context.Context, tx *pgx.Conn, schema *canonical.Schema) ([]*copyGroup, error) {
	names := make([]canonical.TableName, len(schema.Tables))
	for i := range schema.Tables {
		names[i] = schema.Tables[i].TableName()
	}
	found, err := relationsAtSnapshot(ctx, tx, nil, names)
	if err != nil {
		return nil, fmt.Errorf("read the catalog at the snapshot: %w", err)
	}
	byName := map[canonical.TableName]*relAtSnapshot{}
	byOID := map[uint32]*relAtSnapshot{}
	inSchema := map[uint32]bool{}
	for i := range found {
		byName[found[i].name], byOID[found[i].oid] = &found[i], &found[i]
	}
	var parents []uint32
	groups := make([]*copyGroup, len(schema.Tables))
	for i := range schema.Tables {
		t := &schema.Tables[i]
		r := byName[t.TableName()]
		if r == nil {
			return nil, &SchemaIncompatibleError{Table: t.TableName(), Problem: "the table does not exist at the snapshot (dropped or renamed after the schema was inspected): inspect the schema again"}
		}
		if err := checkAtSnapshot(t, r); err != nil {
			return nil, err
		}
		inSchema[r.oid] = true
		groups[i] = &copyGroup{table: t, progress: Progress{Table: t.TableName()}}
		if r.partitioned {
			parents = append(parents, r.oid)
		}
	}
	var children map[uint32][]uint32
	if len(parents) > 0 {
		if children, err = partitionTree(ctx, tx, parents); err != nil {
			return nil, fmt.Errorf("read partitions at the snapshot: %w", err)
		}
		var more []uint32
		for _, cs := range children {
			for _, c := range cs {
				if byOID[c] == nil {
					more = append(more, c)
				}
			}
		}
		extra, err := relationsAtSnapshot(ctx, tx, more, nil)
		if err != nil {
			return nil, fmt.Errorf("read partitions at the snapshot: %w", err)
		}
		for i := range extra {
			byOID[extra[i].oid] = &extra[i]
		}
	}
	for _, g := range groups {
		root := byName[g.table.TableName()]
		for _, r := range leavesOf(root, children, byOID, inSchema) {
			rel, err := newRelPlan(g, r)
			if err != nil {
				return nil, err
			}
			g.rels = append(g.rels, rel)
		}
	}
	return groups, nil
}

// leavesOf returns the relations whose rows are delivered as root: root
// itself when it holds rows, or the leaf partitions below it that are not in
// the schema themselves (nor below a partitioned table that is).
func leavesOf(root *relAtSnapshot, children map[uint32][]uint32, byOID map[uint32]*relAtSnapshot, inSchema map[uint32]bool) []*relAtSnapshot {
	if !root.partitioned {
		return []*relAtSnapshot{root}
	}
	var out []*relAtSnapshot
	var walk func(oid uint32)
	walk = func(oid uint32) {
		for _, c := range children[oid] {
			r := byOID[c]
			if r == nil || inSchema[c] {
				continue
			}
			if r.partitioned {
				walk(c)
			} else {
				out = append(out, r)
			}
		}
	}
	walk(root.oid)
	return out
}

// checkAtSnapshot compares a table of the caller's schema with the table at
// the snapshot.
func checkAtSnapshot(t *canonical.Table, r *relAtSnapshot) error {
	fail := func(column, problem string) error {
		return &SchemaIncompatibleError{Table: t.TableName(), Column: column,
			Problem: problem + " (changed after the schema was inspected): inspect the schema again"}
	}
	if r.partitioned != t.Partitioned {
		return fail("", "partitioned at the snapshot but not in the schema, or the other way round")
	}
	for i, col := range t.Columns {
		j := slices.IndexFunc(r.cols, func(c columnAtSnapshot) bool { return c.name == col.Name })
		switch {
		case j < 0:
			return fail(col.Name, "the column does not exist at the snapshot")
		case j != i:
			return fail(col.Name, fmt.Sprintf("the column is column %d at the snapshot, %d in the schema", j+1, i+1))
		case col.TypeOID != 0 && r.cols[j].typeOID != col.TypeOID:
			return fail(col.Name, fmt.Sprintf("the column's type OID is %d at the snapshot, %d in the schema", r.cols[j].typeOID, col.TypeOID))
		}
	}
	if len(r.cols) > len(t.Columns) {
		return fail(r.cols[len(t.Columns)].name, "the column exists at the snapshot but not in the schema")
	}
	if !slices.Equal(r.primaryKey, t.PrimaryKey) { // nil and empty are equal
		return fail("", fmt.Sprintf("the primary key is (%s) at the snapshot, (%s) in the schema",
			strings.Join(r.primaryKey, ", "), strings.Join(t.PrimaryKey, ", ")))
	}
	return nil
}

// newRelPlan prepares the copy of relation r into group g: the group
// table's columns, found by name.
func newRelPlan(g *copyGroup, r *relAtSnapshot) (*relPlan, error) {
	rel := &relPlan{group: g, name: r.name, snap: *r}
	var sel strings.Builder
	for i, col := range g.table.Columns {
		j := slices.IndexFunc(r.cols, func(c columnAtSnapshot) bool { return c.name == col.Name })
		if j < 0 {
			return nil, &SchemaIncompatibleError{Table: r.name, Column: col.Name,
				Problem: fmt.Sprintf("the partition of %s has no such column at the snapshot", g.table.TableName())}
		}
		c := r.cols[j]
		if i > 0 {
			sel.WriteString(", ")
		}
		if k, ok := copytext.KindOf(c.base); ok {
			rel.kinds = append(rel.kinds, k)
			sel.WriteString(sqltext.Ident(c.name))
			continue
		}
		// The output function prints exactly what pgoutput sends; a cast to
		// text may not (bool, inet, bpchar...). Its cstring result is sent as
		// the text itself.
		rel.kinds = append(rel.kinds, copytext.Text)
		sel.WriteString(c.output + "(" + sqltext.Ident(c.name) + ")")
	}
	rel.selectList = sel.String()
	return rel, nil
}

// lockRelations takes ACCESS SHARE locks on every relation to copy, in the
// lead session, for the rest of the copy, without waiting for one while it
// holds another (lockTables). A relation whose name no longer resolves was
// renamed or dropped after the snapshot.
func lockRelations(ctx context.Context, tx *pgx.Conn, rels []*relPlan) error {
	locks := make([]tableLock, len(rels))
	for i, r := range rels {
		locks[i] = tableLock{table: r.name, mode: accessShare, only: true}
	}
	err := lockTables(ctx, tx, locks)
	var lerr *tableLockError
	if errors.As(err, &lerr) && pgerr.Is(lerr.err, pgerrcode.UndefinedTable) {
		return &SchemaIncompatibleError{Table: lerr.table, Problem: "the table was renamed or dropped after the snapshot"}
	}
	return err
}

// lockRelationNoWait locks a relation in another copying session. The
// first session holds a lock already, so DDL waits for the copy; but DDL
// that queued in between would make this session wait for it while it waits
// for the copy: fail instead of deadlocking.
func lockRelationNoWait(ctx context.Context, tx *pgx.Conn, r *relPlan) error {
	_, err := tx.Exec(ctx, "LOCK TABLE ONLY "+sqltext.Name(r.name.Schema, r.name.Name)+" IN ACCESS SHARE MODE NOWAIT")
	if pgerr.Is(err, pgerrcode.LockNotAvailable) {
		return &SchemaIncompatibleError{Table: r.name, Problem: "a statement that needs an ACCESS EXCLUSIVE lock (ALTER TABLE, VACUUM FULL, TRUNCATE, CLUSTER...) is waiting for the table: the copy stops rather than deadlock with it; copy again once that statement is done"}
	}
	if err != nil {
		return fmt.Errorf("lock %s: %w", r.name, err)
	}
	return nil
}

// currentQuery reads relations as they are now (outside the snapshot), by
// name.
const currentQuery = `
SELECT q.i::int, c.oid, pg_catalog.pg_relation_filenode(c.oid),
       coalesce((SELECT pg_catalog.array_agg(a.attnum ORDER BY a.attnum) FROM pg_attribute a
                 WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped), '{}'),
       coalesce((SELECT pg_catalog.array_agg(a.attname ORDER BY a.attnum) FROM pg_attribute a
                 WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped), '{}'),
       coalesce((SELECT pg_catalog.array_agg(a.atttypid::int8 ORDER BY a.attnum) FROM pg_attribute a
                 WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped), '{}'),
       ` + primaryKeyColumns + `
FROM pg_catalog.unnest($1::text[]) WITH ORDINALITY AS q(name, i)
LEFT JOIN pg_class c ON c.oid = pg_catalog.to_regclass(q.name)
ORDER BY q.i`

// checkCurrent compares the locked relations as they are now with the
// snapshot. It runs after the locks are granted, so what it sees cannot
// change until the copy ends.
func (c *Conn) checkCurrent(ctx context.Context, rels []*relPlan) error {
	names := make([]string, len(rels))
	for i, r := range rels {
		names[i] = sqltext.Name(r.name.Schema, r.name.Name)
	}
	rows, err := c.pool.Query(ctx, currentQuery, names)
	if err != nil {
		return fmt.Errorf("check tables: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var (
			i           int
			oid         *uint32
			relfilenode *uint32
			attnums     []int16
			attnames    []string
			atttypes    []int64
			primaryKey  []string
		)
		if err := rows.Scan(&i, &oid, &relfilenode, &attnums, &attnames, &atttypes, &primaryKey); err != nil {
			return fmt.Errorf("check tables: %w", err)
		}
		r := rels[i-1]
		fail := func(column, problem string) error {
			return &SchemaIncompatibleError{Table: r.name, Column: column, Problem: problem}
		}
		switch {
		case oid == nil:
			return fail("", "the table was renamed or dropped after the snapshot")
		case *oid != r.snap.oid:
			return fail("", "the table was dropped and created again after the snapshot")
		case relfilenode == nil || *relfilenode != r.snap.relfilenode:
			return fail("", "the table was rewritten after the snapshot (VACUUM FULL, CLUSTER, TRUNCATE or a rewriting ALTER TABLE): its rows as of the snapshot are gone; take a new snapshot")
		}
		for _, col := range r.snap.cols {
			j := slices.Index(attnums, col.attnum)
			switch {
			case j < 0:
				return fail(col.name, "the column was dropped after the snapshot")
			case attnames[j] != col.name:
				return fail(col.name, fmt.Sprintf("the column was renamed to %q after the snapshot", attnames[j]))
			case uint32(atttypes[j]) != col.typeOID:
				return fail(col.name, fmt.Sprintf("the column's type changed after the snapshot (type OID %d, was %d)", atttypes[j], col.typeOID))
			}
		}
		if !slices.Equal(primaryKey, r.snap.primaryKey) && len(primaryKey)+len(r.snap.primaryKey) > 0 {
			return fail("", fmt.Sprintf("the primary key changed after the snapshot, from (%s) to (%s)",
				strings.Join(r.snap.primaryKey, ", "), strings.Join(primaryKey, ", ")))
		}
	}
	return rows.Err()
}

// planResume sets where each relation's copy stands: from scratch in this
// snapshot, or resumed from cp.
func planResume(groups []*copyGroup, pos canonical.Position, cfg CopyOptions) error {
	prior := map[canonical.TableName]TableCheckpoint{}
	if cfg.Resume != nil {
		for _, t := range cfg.Resume.Tables {
			prior[t.Relation] = t
		}
	}
	for _, g := range groups {
		for _, r := range g.rels {
			r.checkpoint = TableCheckpoint{Table: g.table.TableName(), Relation: r.name, Position: pos,
				Relfilenode: r.snap.relfilenode, TOASTEmpty: r.snap.toastEmpty}
			old, ok := prior[r.name]
			switch {
			case !ok || (len(old.Copied) == 0 && !old.Done):
				// Nothing delivered yet: a fresh start.
			case old.Done || (old.Relfilenode == r.snap.relfilenode && old.TOASTEmpty && r.snap.toastEmpty):
				r.checkpoint = old.clone()
				r.checkpoint.Table = g.table.TableName()
			case cfg.Restart == nil:
				return &SchemaIncompatibleError{Table: r.name, Problem: "the interrupted copy cannot resume (the table was rewritten or has TOAST values) and CopyOptions.Restart is nil"}
			default:
				o := old.clone()
				r.restart = &o
			}
		}
	}
	return nil
}

// planTasks splits what each relation still has to copy into ctid ranges
// of about a quarter of a session's share, between 1 MiB and 1 GiB.
func planTasks(groups []*copyGroup, sessions int, blockSize int64) []*copyTask {
	var tasks []*copyTask
	for _, g := range groups {
		for _, r := range g.rels {
			if r.checkpoint.Done {
				continue
			}
			blocks := uint64(r.snap.size / blockSize)
			chunk := min(max(blocks/uint64(sessions*4), uint64((1<<20)/blockSize)), uint64((1<<30)/blockSize))
			for _, want := range missingRanges(r.checkpoint.Copied) {
				from := want.From
				for {
					to := want.To
					if next := (uint64(from.Block)/chunk + 1) * chunk; next < blocks && next < uint64(want.To.Block) {
						to = CTID{Block: uint32(next)}
					}
					t := &copyTask{rel: r, from: from, to: to, reached: from}
					tasks, r.tasks = append(tasks, t), append(r.tasks, t)
					g.tasks++
					if to == want.To {
						break
					}
					from = to
				}
			}
		}
	}
	return tasks
}

// copySQL is the COPY statement of a task; withCTID selects each row's ctid
// first.
func (t *copyTask) copySQL(withCTID bool) string {
	var where []string
	if t.from != (CTID{}) {
		where = append(where, "ctid >= '"+t.from.String()+"'")
	}
	if t.to != maxCTID {
		where = append(where, "ctid < '"+t.to.String()+"'")
	}
	list := t.rel.selectList
	if withCTID {
		list = "ctid, " + list
	}
	q := "COPY (SELECT " + list + " FROM ONLY " + sqltext.Name(t.rel.name.Schema, t.rel.name.Name)
	if len(where) > 0 {
		q += " WHERE " + strings.Join(where, " AND ")
	}
	return q + ") TO STDOUT (FORMAT binary)"
}

// importSnapshot starts, in conn, a read-only transaction on the snapshot
// with the settings that make scans return rows in physical order.
func importSnapshot(ctx context.Context, conn *pgx.Conn, name string) error {
	_, err := conn.PgConn().Exec(ctx, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; "+
		"SET TRANSACTION SNAPSHOT "+sqltext.Literal(name)+"; "+
		"SET LOCAL synchronize_seqscans = off; SET LOCAL max_parallel_workers_per_gather = 0; "+
		"SET LOCAL enable_indexscan = off; SET LOCAL enable_indexonlyscan = off; SET LOCAL enable_bitmapscan = off; "+
		// Fail rather than copy only the rows a row-level security policy
		// lets through.
		"SET LOCAL row_security = off; "+
		// A copy takes as long as it takes, and a session waiting for the
		// consumer between two COPY statements is idle in its transaction.
		noTimeouts(true)).ReadAll()
	if err != nil {
		return fmt.Errorf("import snapshot %q: %w", name, err)
	}
	return nil
}
