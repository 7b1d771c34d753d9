package siphon

// SQL fragments that say which relations are the user's, for the catalog
// queries that list tables and sequences. They name the relation c and its
// namespace n.
const (
	// inUserSchema is true for a relation outside the system's schemas
	// (pg_catalog, information_schema, pg_toast, pg_temp_N...) and
	// siphon's own.
	inUserSchema = `n.nspname NOT IN ('pg_catalog', 'information_schema', 'siphon') AND n.nspname NOT LIKE 'pg\_%'`
	// notOfExtension is true for a relation no extension owns.
	notOfExtension = `NOT EXISTS (SELECT FROM pg_catalog.pg_depend d WHERE d.classid = 'pg_catalog.pg_class'::pg_catalog.regclass AND d.objid = c.oid AND d.deptype = 'e')`
)

// indexColumns selects, in key order, the column names of table c's index
// that matches the condition appended to it; primaryKeyColumns and
// identityIndexColumns complete it.
const indexColumns = `coalesce((SELECT pg_catalog.array_agg(a.attname ORDER BY k.ord)
                 FROM pg_index i
                 CROSS JOIN LATERAL pg_catalog.unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord)
                 JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = k.attnum
                 WHERE i.indrelid = c.oid AND i.`

const (
	primaryKeyColumns    = indexColumns + `indisprimary), '{}')`
	identityIndexColumns = indexColumns + `indisreplident), '{}')`
)

// usableIdentity is true for a table c (an ordinary or partitioned table)
// every leaf of which has a usable replica identity. Its leaves are read
// from pg_inherits, as the query's snapshot sees it (pg_partition_tree
// would read the latest catalog, which a REPEATABLE READ transaction does
// not see).
const usableIdentity = `NOT EXISTS (
         WITH RECURSIVE tree (oid, leaf) AS (
           SELECT c.oid, c.relkind = 'r'
           UNION ALL
           SELECT i.inhrelid, k.relkind <> 'p' FROM tree
           JOIN pg_catalog.pg_inherits i ON i.inhparent = tree.oid JOIN pg_catalog.pg_class k ON k.oid = i.inhrelid
           WHERE NOT tree.leaf)
         SELECT FROM tree JOIN pg_catalog.pg_class l ON l.oid = tree.oid
         WHERE tree.leaf AND NOT CASE l.relreplident
           WHEN 'f' THEN true
           WHEN 'i' THEN EXISTS (SELECT FROM pg_catalog.pg_index i WHERE i.indrelid = l.oid AND i.indisreplident)
           WHEN 'd' THEN EXISTS (SELECT FROM pg_catalog.pg_index i WHERE i.indrelid = l.oid AND i.indisprimary)
           ELSE false END)`

// isUserTable is true for a table c (in schema n) that a publication may
// hold: an ordinary or partitioned table, not temporary or unlogged, not
// of an extension and not in a system schema or siphon's.
const isUserTable = `c.relkind IN ('r', 'p') AND c.relpersistence = 'p' AND ` + inUserSchema + ` AND ` + notOfExtension
