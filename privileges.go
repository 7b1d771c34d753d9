package siphon

// Privileges: what the role may not do, read from the catalog and turned
// into the statements that grant it, for a *PrivilegeError. Preflight asks
// before anything fails; a call that failed for lack of a privilege asks
// after, to say which one.

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"

	"github.com/siphondb/siphon/canonical"
	"github.com/siphondb/siphon/internal/pgerr"
	"github.com/siphondb/siphon/internal/sqltext"
)

// grantGap is one privilege the role lacks, and the statement that gives
// it.
type grantGap struct {
	what  string // "SELECT on sequence public.orders_id_seq"
	grant string // "GRANT SELECT ON SEQUENCE public.orders_id_seq TO app"
}

// maxGapsShown bounds the gaps an error or a check lists one by one.
const maxGapsShown = 5

// gapsError returns the *PrivilegeError of role lacking gaps (at least
// one) for what needed says, caused by err (nil in Preflight).
func gapsError(role, needed string, gaps []grantGap, err error) *PrivilegeError {
	what := make([]string, 0, len(gaps))
	grants := make([]string, 0, len(gaps))
	for i, g := range gaps {
		if i == maxGapsShown {
			what = append(what, fmt.Sprintf("and %d more", len(gaps)-i))
			grants = append(grants, fmt.Sprintf("the like for the %d more", len(gaps)-i))
			break
		}
		what, grants = append(what, g.what), append(grants, g.grant)
	}
	return &PrivilegeError{Role: role, Privilege: strings.Join(what, ", "), Needed: needed,
		Fix: "have a superuser (or each object's owner) run " + strings.Join(grants, "; "), Err: err}
}

// relationAccess is what the role may do with one relation pg_dump
// dumps: a table (ordinary or partitioned) or a sequence.
type relationAccess struct {
	name     canonical.TableName
	sequence bool
	// ownedBy is, for a sequence, the table that owns it (an identity or
	// serial column's); nil for others.
	ownedBy     *canonical.TableName
	schemaUsage bool // USAGE on its schema
	read        bool // SELECT on it
	// rowSecurity: row-level security applies to the role on it, which
	// pg_dump refuses (it dumps with row_security off).
	rowSecurity bool
}

// relationAccessQuery lists the user tables and sequences pg_dump would
// dump (not temporary, not an extension's, not siphon's), with what the
// current role may do with each. The first row is the role's own: its
// name, and whether row-level security never applies to it.
const relationAccessQuery = `
WITH me AS (SELECT rolname, rolsuper OR rolbypassrls AS bypass FROM pg_roles WHERE rolname = current_user)
SELECT me.rolname, NULL::text, NULL::text, false, NULL::text, NULL::text, me.bypass, false, false FROM me
UNION ALL
SELECT n.nspname, c.relname, c.relkind::text, c.relkind = 'S', o.nspname, o.relname,
       pg_catalog.has_schema_privilege(n.oid, 'USAGE'),
       CASE WHEN c.relkind = 'S' THEN pg_catalog.has_sequence_privilege(c.oid, 'SELECT') ELSE pg_catalog.has_table_privilege(c.oid, 'SELECT') END,
       c.relkind <> 'S' AND c.relrowsecurity AND NOT (SELECT bypass FROM me)
         AND (NOT pg_catalog.pg_has_role(c.relowner, 'USAGE') OR c.relforcerowsecurity)
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
LEFT JOIN LATERAL (
  SELECT tn.nspname, t.relname FROM pg_depend d
  JOIN pg_class t ON t.oid = d.refobjid JOIN pg_namespace tn ON tn.oid = t.relnamespace
  WHERE c.relkind = 'S' AND d.classid = 'pg_class'::regclass AND d.objid = c.oid
    AND d.refclassid = 'pg_class'::regclass AND d.deptype IN ('a', 'i')
  LIMIT 1) o ON true
WHERE c.relkind IN ('r', 'p', 'S') AND c.relpersistence <> 't' AND ` + inUserSchema + ` AND ` + notOfExtension

// readRelationAccess reads what the current role may do with the
// relations pg_dump would dump, and the role's name.
func readRelationAccess(ctx context.Context, q querier) (role string, rels []relationAccess, err error) {
	rows, err := q.Query(ctx, relationAccessQuery)
	if err != nil {
		return "", nil, fmt.Errorf("read the role's privileges: %w", err)
	}
	type row struct {
		Schema              string
		Name, Kind          *string
		Sequence            bool
		OwnerSchema, Owner  *string
		Usage, Read, Secure bool
	}
	all, err := pgx.CollectRows(rows, pgx.RowToStructByPos[row])
	if err != nil {
		return "", nil, fmt.Errorf("read the role's privileges: %w", err)
	}
	if len(all) == 0 {
		return "", nil, errors.New("read the role's privileges: the current role is not in pg_roles")
	}
	role = all[0].Schema // the role's own row comes first
	for _, r := range all[1:] {
		a := relationAccess{name: canonical.TableName{Schema: r.Schema, Name: *r.Name}, sequence: r.Sequence,
			schemaUsage: r.Usage, read: r.Read, rowSecurity: r.Secure}
		if r.Owner != nil {
			a.ownedBy = &canonical.TableName{Schema: *r.OwnerSchema, Name: *r.Owner}
		}
		rels = append(rels, a)
	}
	return role, rels, nil
}

// dumpGaps returns what role lacks for pg_dump to read the relations of
// rels that a dump with opt's selection holds: USAGE on their schemas,
// SELECT on each table (which pg_dump locks) and, unless schemaOnly, on
// each sequence (whose state it reads), and BYPASSRLS where row-level
// security would apply to rows it reads (it refuses to dump them
// through it).
func dumpGaps(role string, rels []relationAccess, opt BackupOptions, schemaOnly bool) ([]grantGap, error) {
	selected, err := dumpSelection(rels, opt)
	if err != nil {
		return nil, err
	}
	var gaps []grantGap
	schemas := map[string]bool{}
	rowSecurity := false
	for _, r := range rels {
		if !selected[r.name] || (schemaOnly && r.sequence) {
			continue // a schema-only dump reads sequences' definitions from the catalog
		}
		if !r.schemaUsage && !schemas[r.name.Schema] {
			schemas[r.name.Schema] = true
			gaps = append(gaps, schemaUsageGap(role, r.name.Schema))
		}
		kind := "TABLE"
		if r.sequence {
			kind = "SEQUENCE"
		}
		if !r.read {
			gaps = append(gaps, grantGap{what: "SELECT on " + strings.ToLower(kind) + " " + r.name.String(),
				grant: fmt.Sprintf("GRANT SELECT ON %s %s TO %s", kind, r.name, sqltext.Ident(role))})
		}
		rowSecurity = rowSecurity || (r.rowSecurity && !schemaOnly)
	}
	if rowSecurity {
		gaps = append(gaps, grantGap{what: "BYPASSRLS (row-level security applies to tables it dumps)",
			grant: fmt.Sprintf("ALTER ROLE %s BYPASSRLS", sqltext.Ident(role))})
	}
	return gaps, nil
}

func schemaUsageGap(role, schema string) grantGap {
	return grantGap{what: "USAGE on schema " + sqltext.Ident(schema),
		grant: fmt.Sprintf("GRANT USAGE ON SCHEMA %s TO %s", sqltext.Ident(schema), sqltext.Ident(role))}
}

// dumpSelection says which of rels a dump with opt's selection holds, by
// pg_dump's rules: those selectTables keeps and, when tables are named,
// the sequences those tables own (pg_dump dumps them with their table).
func dumpSelection(rels []relationAccess, opt BackupOptions) (map[canonical.TableName]bool, error) {
	names := make([]canonical.TableName, len(rels))
	for i, r := range rels {
		names[i] = r.name
	}
	kept, err := selectTables(names, opt)
	if err != nil {
		return nil, err
	}
	selected := make(map[canonical.TableName]bool, len(kept))
	for _, t := range kept {
		selected[t] = true
	}
	if len(opt.Tables) > 0 {
		for _, r := range rels {
			if r.ownedBy != nil && selected[*r.ownedBy] {
				selected[r.name] = true
			}
		}
	}
	return selected, nil
}

// dumpAccessCheck is Preflight's check that the role may read everything
// a Backup of the whole database dumps.
func (c *Conn) dumpAccessCheck(ctx context.Context) ([]Check, error) {
	ch := Check{Name: CheckDumpPrivileges, Status: CheckOK, Needed: dumpNeeds}
	role, rels, err := readRelationAccess(ctx, c.pool)
	if err != nil {
		return nil, err
	}
	gaps, err := dumpGaps(role, rels, BackupOptions{}, false)
	if err != nil {
		return nil, err
	}
	if len(gaps) == 0 {
		ch.Found = fmt.Sprintf("role %q may read every table and sequence of the database", role)
		return []Check{ch}, nil
	}
	e := gapsError(role, "", gaps, nil)
	ch.Status, ch.Found, ch.Fix = CheckFailed, fmt.Sprintf("role %q lacks %s", role, e.Privilege), e.Fix
	return []Check{ch}, nil
}

// dumpNeeds says what needs the privileges dumpGaps checks.
const dumpNeeds = "Backup: pg_dump reads every table and sequence it dumps"

// explainDumpFailure returns, when the role lacks something pg_dump needs
// to dump what opt selects (its definitions only, with schemaOnly), the
// *PrivilegeError that says what, wrapping err (pg_dump's failure); err
// otherwise.
func (c *Conn) explainDumpFailure(ctx context.Context, opt BackupOptions, schemaOnly bool, err error) error {
	ctx, cancel := cleanupContext(ctx)
	defer cancel()
	role, rels, qerr := readRelationAccess(ctx, c.pool)
	if qerr != nil {
		return err
	}
	gaps, qerr := dumpGaps(role, rels, opt, schemaOnly)
	if qerr != nil || len(gaps) == 0 {
		return err
	}
	return gapsError(role, dumpNeeds, gaps, err)
}

// applyTablePrivileges are what apply needs on every table it applies to.
var applyTablePrivileges = []string{"SELECT", "INSERT", "UPDATE", "DELETE", "TRUNCATE"}

// tableGaps returns what the current role lacks of privs on tables
// (USAGE on their schemas first), and the role's name.
func tableGaps(ctx context.Context, q querier, tables []canonical.TableName, privs []string) (string, []grantGap, error) {
	schemas, names := nameArrays(tables)
	rows, err := q.Query(ctx, `SELECT current_user::text, u.s, u.n, pg_catalog.has_schema_privilege(n.oid, 'USAGE'),
		coalesce((SELECT pg_catalog.array_agg(p ORDER BY o) FROM pg_catalog.unnest($3::text[]) WITH ORDINALITY AS x(p, o)
		          WHERE NOT pg_catalog.has_table_privilege(c.oid, p)), '{}')
		FROM unnest($1::text[], $2::text[]) AS u(s, n)
		JOIN pg_namespace n ON n.nspname = u.s JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = u.n
		ORDER BY 2, 3`, schemas, names, privs)
	if err != nil {
		return "", nil, err
	}
	type row struct {
		Role, Schema, Name string
		Usage              bool
		Missing            []string
	}
	all, err := pgx.CollectRows(rows, pgx.RowToStructByPos[row])
	if err != nil || len(all) == 0 {
		return "", nil, err
	}
	role := all[0].Role
	var gaps []grantGap
	schemaGap := map[string]bool{}
	for _, r := range all {
		t := canonical.TableName{Schema: r.Schema, Name: r.Name}
		if !r.Usage && !schemaGap[r.Schema] {
			schemaGap[r.Schema] = true
			gaps = append(gaps, schemaUsageGap(role, r.Schema))
		}
		if len(r.Missing) > 0 {
			list := strings.Join(r.Missing, ", ")
			gaps = append(gaps, grantGap{what: list + " on table " + t.String(),
				grant: fmt.Sprintf("GRANT %s ON TABLE %s TO %s", list, t, sqltext.Ident(role))})
		}
	}
	return role, gaps, nil
}

// explainTablePrivileges returns, for err that is the server's refusal
// for lack of a privilege, the *PrivilegeError that says what the
// current role lacks of privs on tables, for what needed says; err when
// it is another error, one that says so already, or when the role lacks
// none of them.
func explainTablePrivileges(ctx context.Context, q querier, err error, tables []canonical.TableName, privs []string, needed string) error {
	var already *PrivilegeError
	var ddl *SchemaChangeError // a statement of the source's, refused: not apply's own privileges
	if !pgerr.Is(err, pgerrcode.InsufficientPrivilege) || errors.As(err, &already) || errors.As(err, &ddl) || len(tables) == 0 {
		return err
	}
	role, gaps, qerr := tableGaps(ctx, q, tables, privs)
	if qerr != nil || len(gaps) == 0 {
		return err
	}
	return gapsError(role, needed, gaps, err)
}

// schemaTables lists the names of schema's tables.
func schemaTables(schema *canonical.Schema) []canonical.TableName {
	names := make([]canonical.TableName, len(schema.Tables))
	for i := range schema.Tables {
		names[i] = schema.Tables[i].TableName()
	}
	return names
}

// explainPrivilege returns, for err that is the target's refusal for lack
// of a privilege, the *PrivilegeError that says what the applying role
// lacks on the tables the session applied to; err otherwise, explained as
// explainSearchPath does. The session must be out of the failed
// transaction (rolled back).
func (s *applySession) explainPrivilege(ctx context.Context, err error) error {
	if !pgerr.Is(err, pgerrcode.InsufficientPrivilege) || s.pg.IsClosed() {
		return explainSearchPath(err)
	}
	ctx, cancel := cleanupContext(ctx)
	defer cancel()
	tables := make([]canonical.TableName, 0, len(s.targets))
	for name := range s.targets {
		tables = append(tables, name)
	}
	return explainTablePrivileges(ctx, s.conn, err, tables, applyTablePrivileges, "apply: it writes every change of a table")
}
