package siphon_test

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/siphondb/siphon"
	"github.com/siphondb/siphon/canonical"
)

// shadowedBuiltins are built-in functions siphon's queries call, each as
// name, argument types and result type; plantShadows defines a function of
// the same name and argument types in the attacker's schema.
var shadowedBuiltins = [][3]string{
	{"current_setting", "text", "text"},
	{"current_setting", "text, boolean", "text"},
	{"set_config", "text, text, boolean", "text"},
	{"pg_current_wal_lsn", "", "pg_lsn"},
	{"pg_backend_pid", "", "integer"},
	{"pg_is_in_recovery", "", "boolean"},
	{"current_database", "", "name"},
	{"version", "", "text"},
	{"format_type", "oid, integer", "text"},
	{"quote_ident", "text", "text"},
	{"pg_get_userbyid", "oid", "name"},
	{"to_regclass", "text", "regclass"},
	{"to_regtype", "text", "regtype"},
	{"pg_replication_origin_oid", "text", "oid"},
	// Closer matches than the built-ins for the arguments siphon's queries
	// pass: theirs take text, regclass, or any array or value, hers the
	// very types; she wins wherever her schema is searched, even behind
	// pg_catalog, unless the call names pg_catalog.
	{"quote_ident", "name", "text"},
	{"pg_relation_size", "oid", "bigint"},
	{"unnest", "int2vector", "SETOF smallint"},
	{"unnest", "oid[]", "SETOF oid"},
	{"unnest", "text[]", "SETOF text"},
	{"unnest", "integer[]", "SETOF integer"},
	{"unnest", "character varying[]", "SETOF character varying"},
	{"cardinality", "text[]", "integer"},
	{"format", "text, name, name", "text"},
}

// shadowedAggregates are the built-in aggregates siphon's queries call,
// as name and argument type (closer matches than the built-ins'
// polymorphic ones); plantShadows defines one of each in the attacker's
// schema, as array_agg, whose step function springs her trap.
var shadowedAggregates = [][2]string{{"array_agg", "name"}, {"array_agg", "smallint"}, {"array_agg", "bigint"}, {"array_agg", "text"}}

// shadowedOperators are the operators plantShadows defines in the
// attacker's schema, by name and argument types: the comparisons of
// names, text and oids every catalog query makes; of varchar keys, for
// which built-in = has no operator of its own (it compares text): hers is
// the closer match, found even behind pg_catalog, unless apply names the
// operator; of the integer keys apply looks up a run of inserts by (key
// BETWEEN low AND high) and of the ctid it finds a keyless row by.
var shadowedOperators = [][2]string{{"=", "name, name"}, {"=", "name, text"}, {"=", "text, text"}, {"=", "oid, oid"},
	{"=", "integer, integer"}, {"=", "character varying, character varying"}, {"=", "tid, tid"},
	{">=", "integer, integer"}, {"<=", "integer, integer"}}

// plantShadows makes, as owner (the database's owner, not a superuser),
// schema evil with a function or operator for each of shadowedBuiltins and
// shadowedOperators that tries to make owner a superuser and records its
// call in evil.calls, then returns what the built-in would. A session
// whose search_path is hijackingSearchPath resolves unqualified names in
// evil first.
func plantShadows(t *testing.T, owner *pgx.Conn, role string) {
	t.Helper()
	execSQL(t, owner, `CREATE SCHEMA evil`,
		`CREATE TABLE evil.calls (what text, as_role text)`,
		`GRANT USAGE ON SCHEMA evil TO PUBLIC`,
		`GRANT INSERT ON evil.calls TO PUBLIC`,
		`CREATE FUNCTION evil.trap(what text) RETURNS void LANGUAGE plpgsql AS $$
		BEGIN
		  BEGIN
		    EXECUTE 'ALTER ROLE `+role+` SUPERUSER';
		  EXCEPTION WHEN OTHERS THEN NULL;
		  END;
		  BEGIN
		    INSERT INTO evil.calls VALUES (what, CURRENT_USER);
		  EXCEPTION
		    WHEN read_only_sql_transaction THEN
		      -- a read-only session: it cannot be recorded, so it fails
		      RAISE EXCEPTION 'her % ran in a read-only session as %', what, CURRENT_USER;
		    WHEN OTHERS THEN NULL;
		  END;
		END $$`)
	for i, f := range shadowedBuiltins {
		var params, args []string
		for j, typ := range strings.Split(f[1], ", ") {
			if typ != "" {
				params = append(params, typ)
				args = append(args, fmt.Sprintf("$%d", j+1))
			}
		}
		ret := "RETURN"
		if strings.HasPrefix(f[2], "SETOF ") {
			ret = "RETURN QUERY SELECT * FROM"
		}
		execSQL(t, owner, fmt.Sprintf(`CREATE FUNCTION evil.%s(%s) RETURNS %s LANGUAGE plpgsql AS $f%d$
			BEGIN PERFORM evil.trap('%s(%s)'); %s pg_catalog.%s(%s); END $f%d$`,
			f[0], strings.Join(params, ", "), f[2], i, f[0], f[1], ret, f[0], strings.Join(args, ", "), i))
	}
	for i, a := range shadowedAggregates {
		execSQL(t, owner, fmt.Sprintf(`CREATE FUNCTION evil.step%d(%s[], %s) RETURNS %s[] LANGUAGE plpgsql AS $a$
			BEGIN PERFORM evil.trap('%s(%s)'); RETURN pg_catalog.array_append($1, $2); END $a$`, i, a[1], a[1], a[1], a[0], a[1]),
			fmt.Sprintf(`CREATE AGGREGATE evil.%s(%s) (SFUNC = evil.step%d, STYPE = %s[])`, a[0], a[1], i, a[1]))
	}
	for i, op := range shadowedOperators {
		name, types := op[0], op[1]
		execSQL(t, owner, fmt.Sprintf(`CREATE FUNCTION evil.op%d(%s) RETURNS boolean LANGUAGE plpgsql AS $e$
			BEGIN PERFORM evil.trap('%s(%s)'); RETURN $1 OPERATOR(pg_catalog.%s) $2; END $e$`, i, types, name, types, name),
			fmt.Sprintf(`CREATE OPERATOR evil.%s (LEFTARG = %s, RIGHTARG = %s, FUNCTION = evil.op%d)`,
				name, strings.Split(types, ", ")[0], strings.Split(types, ", ")[1], i))
	}
}

// hijackingSearchPath puts plantShadows' schema before pg_catalog.
const hijackingSearchPath = "evil, pg_catalog, public"

// TestDatabaseOwnerCannotHijackSiphonsSessions: a database's owner, who is
// not a superuser, plants functions and = operators of the names and
// argument types siphon's queries call in her schema, and names it in the
// search_path of siphon's sessions: before pg_catalog through the
// database's settings (ALTER DATABASE … SET search_path, which siphon's
// sessions override), or through the DSN siphon was given (one that names
// the application's schemas, hers among them). Connect refuses a DSN that
// puts her schema before pg_catalog, however it spells the setting, and
// keeps one that does not, where the built-ins come first. siphon connects as a superuser to the source
// and to the target (both owned by her kind): every name it uses must
// resolve in pg_catalog, so none of her code runs as the superuser,
// through Preflight, InstallSchemaCapture, a live Replicate with its
// snapshot, a schema change, and Detach.
func TestDatabaseOwnerCannotHijackSiphonsSessions(t *testing.T) {
	t.Parallel()
	t.Run("database setting", func(t *testing.T) {
		t.Parallel()
		hijackSiphonsSessions(t, false)
	})
	t.Run("DSN", func(t *testing.T) {
		t.Parallel()
		hijackSiphonsSessions(t, true)
	})
}

// hijackSiphonsSessions is TestDatabaseOwnerCannotHijackSiphonsSessions,
// with her schema in the DSN siphon is given when viaDSN, and in the
// databases' settings otherwise.
func hijackSiphonsSessions(t *testing.T, viaDSN bool) {
	ctx := context.Background()
	srcDSN, srcAdmin := newDatabase(t)
	tgtDSN, tgtAdmin := newDatabase(t)
	for _, admin := range []*pgx.Conn{srcAdmin, tgtAdmin} {
		execSQL(t, admin, `CREATE TABLE accounts (id int PRIMARY KEY, owner text NOT NULL, balance numeric NOT NULL)`,
			`CREATE TABLE ledger (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, account int REFERENCES accounts, amount numeric)`,
			`CREATE TABLE labels (code varchar(20) PRIMARY KEY, hits int NOT NULL)`,
			`CREATE TABLE notes (label varchar(20), body text)`, `ALTER TABLE notes REPLICA IDENTITY FULL`)
	}
	execSQL(t, srcAdmin, `INSERT INTO accounts SELECT i, 'owner ' || i, i * 10 FROM generate_series(1, 100) i`,
		`INSERT INTO ledger (account, amount) SELECT i % 100 + 1, i FROM generate_series(1, 500) i`,
		`INSERT INTO labels SELECT 'label ' || i, i FROM generate_series(1, 50) i`,
		`INSERT INTO notes SELECT CASE WHEN i % 5 > 0 THEN 'note ' || i END, 'body ' || i FROM generate_series(1, 20) i`)
	var roles []string
	for _, db := range []struct {
		dsn   string
		admin *pgx.Conn
	}{{srcDSN, srcAdmin}, {tgtDSN, tgtAdmin}} {
		role, roleDSN := loginRole(t, db.dsn, db.admin, "dbowner", "")
		roles = append(roles, role)
		name := pgx.Identifier{dbName(t, db.admin)}.Sanitize()
		execSQL(t, db.admin, `ALTER DATABASE `+name+` OWNER TO `+role)
		owner := connectOrFail(t, roleDSN)
		plantShadows(t, owner, role)
		if !viaDSN {
			execSQL(t, owner, `ALTER DATABASE `+name+` SET search_path = `+hijackingSearchPath)
		}
		t.Cleanup(func() {
			// Before the leak checks connect again (her settings would
			// hijack their superuser sessions) and her role is dropped.
			execSQL(t, db.admin, `ALTER DATABASE `+name+` RESET search_path`, `ALTER DATABASE `+name+` OWNER TO CURRENT_USER`)
		})
	}
	if viaDSN {
		for _, options := range []string{
			"&search_path=evil,pg_catalog,public",
			"&options=-c%20search_path%3Devil,pg_catalog",
			"&SEARCH_PATH=evil,pg_catalog",
			"&options=-c%20search_path%3Dpublic&SEARCH_PATH=evil,pg_catalog",
			"&options=-c%20search_path%3Dpublic%20-nc%20search_path%3Devil,pg_catalog",
			// Her schema app does not exist yet: she can create it while
			// siphon's sessions last.
			"&search_path=app,pg_catalog",
			// pgx's check of the server's role runs pg_is_in_recovery(),
			// hers here, unless the search_path is checked first.
			"&search_path=evil,pg_catalog&target_session_attrs=primary",
		} {
			c, err := siphon.Connect(ctx, srcDSN+options)
			assert.ErrorIs(t, err, siphon.ErrUnsafeSearchPath, options)
			assert.False(t, siphon.Retryable(err), "a refused search_path is not retried: %s", options)
			if err == nil {
				c.Close()
			}
		}
		srcDSN, tgtDSN = srcDSN+"&search_path=evil,public", tgtDSN+"&search_path=evil,public"
	}

	src, slot := streamConn(t, srcDSN)
	report, err := src.Preflight(ctx)
	require.NoError(t, err)
	assert.NotEmpty(t, report.Checks)
	require.NoError(t, src.InstallSchemaCapture(ctx))
	// CopySchema's check of the owners lists her objects first, and
	// refuses to give them to the copying role.
	emptyDSN, _ := newDatabase(t)
	empty := connect(t, emptyDSN)
	var owners *siphon.OwnershipError
	require.ErrorAs(t, src.CopySchema(ctx, empty, siphon.CopySchemaOptions{}), &owners)
	target, err := siphon.Connect(ctx, tgtDSN)
	require.NoError(t, err)
	defer target.Close()
	run := startReplicate(t, src, target, siphon.ReplicateOptions{Snapshot: true})
	// Once the snapshot is loaded, the schema change comes through the
	// stream and is replayed (before, the snapshot carried it).
	waitApplied(t, target, systemIdentifier(t, srcAdmin), slot, 1, run)
	execSQL(t, srcAdmin, `ALTER TABLE accounts ADD COLUMN note text`,
		`INSERT INTO accounts VALUES (101, 'late', 1, 'after the snapshot')`,
		`INSERT INTO accounts SELECT i, 'run ' || i, i, 'a run of inserts' FROM generate_series(102, 300) i`,
		`UPDATE ledger SET amount = amount + 1 WHERE account <= 7`, // runs: statements of many rows
		`DELETE FROM ledger WHERE account BETWEEN 90 AND 99`,
		`UPDATE labels SET hits = hits + 1 WHERE hits <= 20`, // a run keyed by varchar
		`DELETE FROM labels WHERE hits > 40`,
		`UPDATE notes SET body = body || '!' WHERE body IN ('body 3', 'body 5')`, // keyless: the row by its old values, NULL among them
		`DELETE FROM notes WHERE body IN ('body 4', 'body 10')`)
	waitApplied(t, target, systemIdentifier(t, srcAdmin), slot, sourceMark(t, srcAdmin), run)
	_, err = run.stop()
	require.NoError(t, err)
	assertSameAsSource(t, srcAdmin, tgtAdmin, "replicated")
	require.NoError(t, src.Detach(ctx))
	require.NoError(t, src.Close())

	for i, admin := range []*pgx.Conn{srcAdmin, tgtAdmin} {
		assert.False(t, isSuperuser(t, admin, roles[i]), "the database owner did not become a superuser")
		assert.Equal(t, [][]*string(nil), rawRows(t, admin, `SELECT what, as_role FROM evil.calls GROUP BY 1, 2 ORDER BY 1, 2`),
			"none of her functions ran in siphon's sessions")
	}
}

// TestPreflightNamesTablesOfOtherOwners: apply writes a target's tables as
// the applying role, so the code another role attached to its tables runs
// with that role's rights (SECURITY.md's limits). Preflight names such
// tables and their owners, and passes once the applying role or a
// superuser owns them.
func TestPreflightNamesTablesOfOtherOwners(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn, admin := newDatabase(t)
	role, _ := loginRole(t, dsn, admin, "tableowner", "")
	execSQL(t, admin, `CREATE TABLE accounts (id int PRIMARY KEY)`, `CREATE TABLE "Ledger Lines" (id int PRIMARY KEY)`,
		`CREATE TABLE mine (id int PRIMARY KEY)`, `CREATE UNLOGGED TABLE scratch (id int)`,
		`ALTER TABLE accounts OWNER TO `+role, `ALTER TABLE "Ledger Lines" OWNER TO `+role, `ALTER TABLE scratch OWNER TO `+role)
	target := connect(t, dsn)
	owners := func() siphon.Check {
		report, err := target.Preflight(ctx)
		require.NoError(t, err)
		for _, ch := range report.Checks {
			if ch.Name == siphon.CheckTableOwners {
				return ch
			}
		}
		t.Fatal("no table owners check")
		return siphon.Check{}
	}
	ch := owners()
	assert.Equal(t, siphon.CheckWarning, ch.Status)
	assert.Contains(t, ch.Found, fmt.Sprintf(`tables of other roles that are not superusers (2): public."Ledger Lines" (owned by %s), public.accounts (owned by %s)`, role, role))
	assert.Contains(t, ch.Fix, "apply into them as their owner")
	execSQL(t, admin, `ALTER TABLE accounts OWNER TO CURRENT_USER`, `ALTER TABLE "Ledger Lines" OWNER TO CURRENT_USER`)
	assert.Equal(t, siphon.CheckOK, owners().Status)
}

// TestSchemaChangeReplayRunsOnlyItsStatementUnderTheSourcesSearchPath: a
// schema change made on a source whose database's owner put her schema
// first in the search_path is recorded with that search_path, which the
// target sets for the statement. On a target where she planted the same
// functions (set_config among them), only the statement runs under it:
// siphon's own statements around it (taking the source role, putting it
// back) call the built-ins, through ConsumeCanonical and ApplyChange.
func TestSchemaChangeReplayRunsOnlyItsStatementUnderTheSourcesSearchPath(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn, admin := newDatabase(t)
	execSQL(t, admin, "CREATE TABLE public.accounts (id int PRIMARY KEY, owner text)")
	role, roleDSN := loginRole(t, dsn, admin, "dbowner", "")
	name := pgx.Identifier{dbName(t, admin)}.Sanitize()
	execSQL(t, admin, `ALTER DATABASE `+name+` OWNER TO `+role)
	t.Cleanup(func() { execSQL(t, admin, `ALTER DATABASE `+name+` OWNER TO CURRENT_USER`) })
	plantShadows(t, connectOrFail(t, roleDSN), role)
	var superuser string
	require.NoError(t, admin.QueryRow(ctx, "SELECT current_user").Scan(&superuser))
	ddl := func(table string) canonical.Change {
		return canonical.Change{Op: canonical.OpDDL, DDL: &canonical.DDL{Tag: "CREATE TABLE",
			Statement: "CREATE TABLE public." + table + " (id int)", SearchPath: `"evil", "pg_catalog", "public"`,
			Role: superuser, SessionRole: superuser, Superuser: true}}
	}
	accounts := canonical.Table{Schema: "public", Name: "accounts",
		Columns:    []canonical.Column{{Name: "id", Type: "integer", TypeOID: 23}, {Name: "owner", Type: "text", TypeOID: 25, Nullable: true}},
		PrimaryKey: []string{"id"}, IdentityKey: []string{"id"}, ReplicaIdentity: canonical.IdentityDefault}

	c := connect(t, dsn)
	s := newStream(t, canonical.KindChanges, 0x1000, streamSlot(t), accounts)
	s.tx(ins(accounts.TableName(), tv("1"), tv("ann")), ddl("made_by_consume"))
	require.NoError(t, c.ConsumeCanonicalWith(ctx, siphon.ApplyOptions{UnauthenticatedSchemaChanges: true}, bytes.NewReader(s.done())))
	pooled := ddl("made_by_apply_change")
	pooled.Position = 0x9000
	require.NoError(t, c.ApplyChange(ctx, pooled))

	assert.Equal(t, 2, count(t, admin, "SELECT count(*) FROM pg_tables WHERE tablename IN ('made_by_consume', 'made_by_apply_change')"))
	assert.False(t, isSuperuser(t, admin, role), "the database owner did not become a superuser")
	assert.Equal(t, [][]*string(nil), rawRows(t, admin, `SELECT what, as_role FROM evil.calls GROUP BY 1, 2 ORDER BY 1, 2`),
		"none of her functions ran in siphon's sessions")
}
