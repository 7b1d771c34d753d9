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
	notOfExtension = `NOT EXISTS (SELECT FROM pg_depend d WHERE d.classid = 'pg_class'::regclass AND d.objid = c.oid AND d.deptype = 'e')`
)

// indexColumns selects, in key order, the column names of table c's index
// that matches the condition appended to it; primaryKeyColumns and
// identityIndexColumns complete it.
const indexColumns = `coalesce((SELECT array_agg(a.attname ORDER BY k.ord)
                 FROM pg_index i
                 CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord)
                 JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = k.attnum
                 WHERE i.indrelid = c.oid AND i.`

const (
	primaryKeyColumns    = indexColumns + `indisprimary), '{}')`
	identityIndexColumns = indexColumns + `indisreplident), '{}')`
)
