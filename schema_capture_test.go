package siphon_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/siphondb/siphon"
	"github.com/siphondb/siphon/canonical"
)

// ddlOf returns the schema changes among changes.
func ddlOf(changes []canonical.Change) []*canonical.DDL {
	var out []*canonical.DDL
	for _, ch := range changes {
		if ch.Op == canonical.OpDDL {
			out = append(out, ch.DDL)
		}
	}
	return out
}

// statementsOf returns the statements of ddl.
func statementsOf(ddl []*canonical.DDL) []string {
	out := make([]string, len(ddl))
	for i, d := range ddl {
		out[i] = d.Statement
	}
	return out
}

// captureObjects lists the event triggers and the objects of schema siphon.
func captureObjects(t *testing.T, conn *pgx.Conn) []string {
	t.Helper()
	rows, err := conn.Query(context.Background(), `
		SELECT 'event trigger ' || evtname FROM pg_event_trigger
		UNION ALL SELECT 'relation ' || c.oid::regclass::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'siphon'
		UNION ALL SELECT 'function ' || p.oid::regprocedure::text FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'siphon'
		UNION ALL SELECT 'schema siphon' FROM pg_namespace WHERE nspname = 'siphon'
		ORDER BY 1`)
	require.NoError(t, err)
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return names
}

// TestSchemaCaptureLifecycle attaches as a superuser: the capture is
// installed with the publication, and the stream carries every schema
// change at its place, as the statement the target runs: one statement of
// a multi-statement query at a time, the statement a DO block or a
// function ran, CONCURRENTLY left out, and under session_replication_role
// replica too; a table created in a transaction joins the publication
// before its first row; temporary tables are not carried. Application DDL never fails, even with the capture broken by
// hand. A second publication shares the capture; Detach of the last one
// removes everything.
func TestSchemaCaptureLifecycle(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn, admin := newDatabase(t)
	execSQL(t, admin, `CREATE TABLE accounts (id int PRIMARY KEY, owner text)`)
	c, slot, start := streamConnAt(t, dsn)
	assert.Empty(t, captureObjects(t, admin), "nothing is installed unless asked for")
	report, err := c.Preflight(ctx)
	require.NoError(t, err)
	check, ok := report.Check(siphon.CheckSchemaCapture)
	require.True(t, ok)
	assert.Equal(t, siphon.CheckWarning, check.Status, check.String())
	assert.Contains(t, check.Found, "InstallSchemaCapture would install schema siphon", "Preflight says what the install would install")
	require.NoError(t, c.InstallSchemaCapture(ctx))
	assert.Equal(t, []string{
		"event trigger siphon_capture_caller", "event trigger siphon_capture_ddl", "event trigger siphon_capture_drop",
		"function siphon.capture_caller()", "function siphon.capture_ddl(text,text,text)", "function siphon.capture_event()",
		"function siphon.capture_failed(text,text)", "function siphon.capture_pending_row()",
		"relation siphon.capture_pending", "relation siphon.capture_pending_pkey",
		"relation siphon.capture_publications", "relation siphon.capture_publications_pkey",
		"relation siphon.schema_changes", "relation siphon.schema_changes_id_seq", "relation siphon.schema_changes_pkey",
		"schema siphon",
	}, captureObjects(t, admin))
	report, err = c.Preflight(ctx)
	require.NoError(t, err)
	check, ok = report.Check(siphon.CheckSchemaCapture)
	require.True(t, ok)
	assert.Equal(t, siphon.CheckOK, check.Status, check.String())

	execSQL(t, admin,
		`BEGIN; CREATE TABLE later (id int PRIMARY KEY, v text); INSERT INTO later VALUES (1, 'first row'); ALTER TABLE later ADD COLUMN n int; COMMIT;`,
		`CREATE TEMP TABLE scratch (x int); DROP TABLE scratch`,
		`CREATE INDEX CONCURRENTLY accounts_owner ON accounts (owner)`,
		`DO $$ BEGIN EXECUTE format('ALTER TABLE %I ADD COLUMN %I text', 'accounts', 'email'); END $$`,
		`CREATE FUNCTION migrate() RETURNS void LANGUAGE plpgsql AS $$ BEGIN
			CREATE TABLE made_by_function (id int PRIMARY KEY);
			INSERT INTO made_by_function VALUES (7);
		 END $$`,
		`SELECT migrate()`,
		`SET search_path = pg_catalog; CREATE TABLE public.qualified (id int PRIMARY KEY); RESET search_path`,
		`SET session_replication_role = replica; CREATE INDEX under_replica_role ON accounts (id); RESET session_replication_role`,
	)
	emitMarker(t, admin, "end")
	changes, _ := streamUntil(t, c, start, "end")
	ddl := ddlOf(changes)
	assert.Equal(t, []string{
		"CREATE TABLE later (id int PRIMARY KEY, v text)",
		"ALTER TABLE later ADD COLUMN n int",
		"CREATE INDEX accounts_owner ON accounts (owner)",
		"ALTER TABLE accounts ADD COLUMN email text",
		`CREATE FUNCTION migrate() RETURNS void LANGUAGE plpgsql AS $$ BEGIN
			CREATE TABLE made_by_function (id int PRIMARY KEY);
			INSERT INTO made_by_function VALUES (7);
		 END $$`,
		"CREATE TABLE made_by_function (id int PRIMARY KEY)",
		"CREATE TABLE public.qualified (id int PRIMARY KEY)",
		"CREATE INDEX under_replica_role ON accounts (id)",
	}, statementsOf(ddl))
	assert.Equal(t, `"pg_catalog"`, ddl[len(ddl)-2].SearchPath, "the schemas the statement ran under")
	assert.Equal(t, `"public"`, ddl[0].SearchPath, `"$user" expanded on the source: there is no schema postgres`)
	assert.Equal(t, []canonical.DDLObject{{Type: "table", Identity: "public.later"}, {Type: "index", Identity: "public.later_pkey"}}, ddl[0].Objects)
	var rows []string
	for _, ch := range changes {
		if ch.Op == canonical.OpInsert {
			rows = append(rows, ch.Table)
		}
	}
	assert.Equal(t, []string{"later", "made_by_function"}, rows, "rows of tables created in their transaction are captured")
	assert.Equal(t, []string{"public.accounts", "public.later", "public.made_by_function", "public.qualified"}, publishedTables(t, admin, "siphon"))

	// A second publication shares the capture.
	other, _ := backupConn(t, dsn)
	require.NoError(t, other.InstallSchemaCapture(ctx))
	_, err = other.CurrentPosition(ctx)
	require.NoError(t, err)

	// The application's DDL never fails: with the slot gone, and with the
	// capture's table dropped by hand.
	require.NoError(t, c.DropSlot(ctx, slot))
	execSQL(t, admin, `CREATE TABLE after_the_slot (id int)`, `DROP TABLE siphon.schema_changes`, `CREATE TABLE with_a_broken_capture (id int)`)
	require.NoError(t, c.InstallSchemaCapture(ctx), "installing again repairs it")
	assert.Contains(t, captureObjects(t, admin), "relation siphon.schema_changes")
	_, err = c.CurrentPosition(ctx) // c streams on, from a new slot
	require.NoError(t, err)

	require.NoError(t, other.Detach(ctx))
	assert.Contains(t, captureObjects(t, admin), "event trigger siphon_capture_ddl", "the capture stays for c's publication")
	require.NoError(t, c.Detach(ctx))
	assert.Empty(t, captureObjects(t, admin), "Detach of the last publication removes the capture")
	execSQL(t, admin, `CREATE TABLE after_detach (id int)`)
}

// sourceRole makes a role that owns a database of its own and may
// replicate, but is not a superuser, and returns its DSN and an admin
// session on that database.
func sourceRole(t *testing.T) (string, *pgx.Conn) {
	t.Helper()
	return sourceRoleWith(t, "REPLICATION")
}

// sourceRoleWith is sourceRole for a role with the attribute given
// (REPLICATION or NOREPLICATION).
func sourceRoleWith(t *testing.T, replication string) (string, *pgx.Conn) {
	t.Helper()
	dsn, admin := newDatabase(t)
	role := fmt.Sprintf("source_plain_%d_%d", os.Getpid(), roleSeq.Add(1))
	execSQL(t, admin, "CREATE ROLE "+role+" LOGIN "+replication+" PASSWORD 'plain-pw-1234'",
		"GRANT CREATE ON DATABASE "+pgx.Identifier{dbName(t, admin)}.Sanitize()+" TO "+role,
		"GRANT CREATE ON SCHEMA public TO "+role)
	t.Cleanup(func() {
		_, err := admin.Exec(context.Background(), "DROP OWNED BY "+role)
		assert.NoError(t, err)
		_, err = admin.Exec(context.Background(), "DROP ROLE "+role)
		assert.NoError(t, err)
	})
	return strings.Replace(dsn, "postgres@", role+":plain-pw-1234@", 1), admin
}

// TestSchemaChangesWithoutCapture attaches as a role that may not install
// the capture: Preflight says so with the fix, InstallSchemaCapture
// refuses with ErrCaptureNeedsSuperuser, and apply follows what the stream
// shows exactly (a nullable column added without a default, a column
// dropped, beside a generated column the stream never carries), and stops at a column added with a default, which existing
// rows hold and the stream does not carry, with a *SchemaIncompatibleError
// and nothing of it applied; once the target has the column, it goes on.
func TestSchemaChangesWithoutCapture(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	roleDSN, _ := sourceRole(t)
	src := connectOrFail(t, roleDSN)
	defer src.Close(ctx)
	ddl := `CREATE TABLE notes (id int PRIMARY KEY, body text, legacy int, size int GENERATED ALWAYS AS (length(body)) STORED)`
	execSQL(t, src, ddl, `INSERT INTO notes SELECT g, 'n' || g, g FROM generate_series(1, 20) g`)
	c, slot := backupConn(t, roleDSN)
	start, err := c.CurrentPosition(ctx)
	require.NoError(t, err)
	report, err := c.Preflight(ctx)
	require.NoError(t, err)
	check, _ := report.Check(siphon.CheckSchemaCapture)
	assert.Equal(t, siphon.CheckWarning, check.Status)
	assert.Contains(t, check.Fix, "InstallSchemaCapture")
	require.ErrorIs(t, c.InstallSchemaCapture(ctx), siphon.ErrCaptureNeedsSuperuser)

	targetDSN, target := newDatabase(t)
	execSQL(t, target, ddl)
	apply, err := siphon.Connect(ctx, targetDSN)
	require.NoError(t, err)
	defer apply.Close()
	forgetAppliedPosition(t, targetDSN, systemIdentifier(t, src), slot)
	var snap bytes.Buffer
	_, err = c.EmitCanonical(ctx, nil, &snap)
	require.NoError(t, err)
	require.NoError(t, apply.ConsumeCanonical(ctx, &snap))

	execSQL(t, src,
		`ALTER TABLE notes ADD COLUMN tag text`,
		`INSERT INTO notes (id, body, legacy, tag) VALUES (21, 'tagged', 0, 'red')`,
		`ALTER TABLE notes DROP COLUMN legacy`,
		`UPDATE notes SET tag = 'blue' WHERE id % 2 = 0`)
	var inc bytes.Buffer
	link, err := c.BackupIncremental(ctx, start, &inc)
	require.NoError(t, err)
	require.NoError(t, apply.ConsumeCanonical(ctx, &inc))
	assertSameAsSource(t, src, target, "a column added, then one dropped")

	execSQL(t, src,
		`ALTER TABLE notes ADD COLUMN done bool NOT NULL DEFAULT false`,
		`INSERT INTO notes (id, body, done) VALUES (22, 'done', true)`)
	inc.Reset()
	_, err = c.BackupIncremental(ctx, link, &inc)
	require.NoError(t, err)
	stream := bytes.Clone(inc.Bytes())
	var schemaErr *siphon.SchemaIncompatibleError
	require.ErrorAs(t, apply.ConsumeCanonical(ctx, bytes.NewReader(stream)), &schemaErr)
	assert.Equal(t, "done", schemaErr.Column)
	assert.Contains(t, schemaErr.Error(), "InstallSchemaCapture")
	assert.Zero(t, count(t, target, `SELECT count(*) FROM notes WHERE id = 22`), "nothing of it applied")
	execSQL(t, target, `ALTER TABLE notes ADD COLUMN done bool NOT NULL DEFAULT false`)
	require.NoError(t, apply.ConsumeCanonical(ctx, bytes.NewReader(stream)))
	assertSameAsSource(t, src, target, "once the target has the column")
}

// TestSchemaChangeRefusals applies schema changes the target cannot make:
// a statement the target refuses, and one that ran in an SQL-language
// function, whose text the server does not report. Each stops the apply
// with a *SchemaChangeError naming the statement and the transaction, with
// nothing of that transaction applied and every one before it; once the
// target is put right by hand, ApplyOptions.SkipSchemaChanges goes on past
// it, for the call that names it.
func TestSchemaChangeRefusals(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srcDSN, src := newDatabase(t)
	ddl := `CREATE TABLE items (id int PRIMARY KEY, v text)`
	execSQL(t, src, ddl)
	// The incremental is written and read with a key: its schema changes run.
	c, slot := backupConn(t, srcDSN, siphon.WithStreamKey(authKey))
	require.NoError(t, c.InstallSchemaCapture(ctx))
	start, err := c.CurrentPosition(ctx)
	require.NoError(t, err)
	execSQL(t, src,
		`INSERT INTO items VALUES (1, 'before')`,
		`BEGIN; INSERT INTO items VALUES (2, 'with the index'); CREATE INDEX items_v ON items (v); COMMIT;`,
		`CREATE FUNCTION add_column() RETURNS void LANGUAGE sql AS 'ALTER TABLE items ADD COLUMN w int'`,
		`BEGIN; SELECT add_column(); INSERT INTO items VALUES (3, 'after', 3); COMMIT;`)
	var inc bytes.Buffer
	_, err = c.BackupIncremental(ctx, start, &inc)
	require.NoError(t, err)

	targetDSN, target := newDatabase(t)
	execSQL(t, target, ddl, `CREATE TABLE other (v text)`, `CREATE INDEX items_v ON other (v)`) // the name is taken
	forgetAppliedPosition(t, targetDSN, systemIdentifier(t, src), slot)
	apply, err := siphon.Connect(ctx, targetDSN, siphon.WithStreamKey(authKey))
	require.NoError(t, err)
	defer apply.Close()
	var failed *siphon.SchemaChangeError
	require.ErrorAs(t, apply.ConsumeCanonical(ctx, bytes.NewReader(inc.Bytes())), &failed)
	assert.Equal(t, "CREATE INDEX items_v ON items (v)", failed.Statement)
	assert.Contains(t, failed.Error(), `relation "items_v" already exists`)
	assert.Contains(t, failed.Error(), fmt.Sprintf("SkipSchemaChanges: []canonical.Position{%v}", failed.Position))
	assert.Equal(t, []string{"1"}, column(t, target, `SELECT id::text FROM items ORDER BY id`), "the transaction before it, and nothing of its own")

	// Put right by hand: the index under the source's name.
	execSQL(t, target, `DROP INDEX items_v`, `CREATE INDEX items_v ON items (v)`)
	skip := siphon.ApplyOptions{SkipSchemaChanges: []canonical.Position{failed.Position}}
	var unreplayable *siphon.SchemaChangeError
	require.ErrorAs(t, apply.ConsumeCanonicalWith(ctx, skip, bytes.NewReader(inc.Bytes())), &unreplayable)
	assert.Contains(t, unreplayable.Problem, "SQL-language function")
	assert.Equal(t, []string{"1", "2"}, column(t, target, `SELECT id::text FROM items ORDER BY id`))

	execSQL(t, target, `ALTER TABLE items ADD COLUMN w int`)
	var again *siphon.SchemaChangeError
	require.ErrorAs(t, apply.ConsumeCanonical(ctx, bytes.NewReader(inc.Bytes())), &again, "the skip held for that call only")
	assert.Equal(t, unreplayable.Position, again.Position)
	skip.SkipSchemaChanges = append(skip.SkipSchemaChanges, unreplayable.Position)
	require.NoError(t, apply.ConsumeCanonicalWith(ctx, skip, bytes.NewReader(inc.Bytes())))
	assertSameAsSource(t, src, target, "once put right by hand")
}

// column returns the first column of a query's rows, as text.
func column(t *testing.T, conn *pgx.Conn, query string) []string {
	t.Helper()
	rows, err := conn.Query(context.Background(), query)
	require.NoError(t, err)
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return out
}

// TestCaptureThroughAUsersPublication gives siphon a publication its user
// made, one that publishes the capture's table without naming it: FOR ALL
// TABLES, or FOR TABLES IN SCHEMA naming siphon's schema. The capture sees
// its table published (no warning that schema changes are not captured),
// and the stream carries schema changes and the rows of a table created
// later. The publication holds a new table by its definition, so the
// capture names none in it (ALTER PUBLICATION … ADD TABLE fails on FOR ALL
// TABLES, and failed the capture's whole publication step), reports a new
// keyless table it cannot move out, and neither the stream start nor
// SyncPublication tries to drop that table by name.
func TestCaptureThroughAUsersPublication(t *testing.T) {
	t.Parallel()
	for name, create := range map[string]string{
		"for all tables":           "CREATE PUBLICATION %s FOR ALL TABLES",
		"for tables in the schema": "CREATE PUBLICATION %s FOR TABLES IN SCHEMA public, siphon",
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			dsn, admin := newDatabase(t)
			execSQL(t, admin, `CREATE TABLE items (id int PRIMARY KEY, name text)`, `CREATE SCHEMA siphon`)
			pub := streamSlot(t) + "_users"
			execSQL(t, admin, fmt.Sprintf(create, pgx.Identifier{pub}.Sanitize()))
			logs := &logRecorder{}
			c, _, start := captureConnAt(t, dsn, siphon.WithPublication(pub), siphon.WithLogger(logs.logger()))
			execSQL(t, admin, `ALTER TABLE items ADD COLUMN note text`, `INSERT INTO items VALUES (1, 'a', 'b')`,
				`CREATE TABLE later (id int PRIMARY KEY)`, `INSERT INTO later VALUES (1)`,
				`CREATE TABLE notes (body text)`, `CREATE PUBLICATION `+pgx.Identifier{pub + "_other"}.Sanitize())
			changes, _ := streamUntilMarker(t, admin, c, start, "end")
			assert.Equal(t, []string{"ALTER TABLE items ADD COLUMN note text", "CREATE TABLE later (id int PRIMARY KEY)", "CREATE TABLE notes (body text)"},
				statementsOf(ddlOf(changes)))
			inserts := map[string]int{}
			for _, ch := range changes {
				if ch.Op == canonical.OpInsert {
					inserts[ch.Table]++
				}
			}
			assert.Equal(t, map[string]int{"items": 1, "later": 1}, inserts, "the rows after the changes, of a table created later too")
			logs.mu.Lock()
			var held []string
			for _, l := range logs.lines {
				assert.False(t, strings.HasPrefix(l.msg, "schema changes are not captured"), "the capture holds its table: %s", l.text)
				assert.False(t, strings.HasPrefix(l.msg, "the schema capture could not keep the publications in line"), "nothing to keep in line: %s", l.text)
				if strings.HasPrefix(l.msg, "a table the publication holds by its definition") {
					held = append(held, l.text)
				}
			}
			logs.mu.Unlock()
			if assert.Len(t, held, 1, "the keyless table created in the publication is reported") {
				assert.Contains(t, held[0], "notes")
			}
			// The publication holds the new table through its definition: the
			// capture names no table in it.
			assert.Equal(t, [][]*string(nil), rawRows(t, admin, fmt.Sprintf(`SELECT r.prrelid::regclass::text FROM pg_publication_rel r
				JOIN pg_publication p ON p.oid = r.prpubid WHERE p.pubname = '%s'`, pub)), "no table named in the publication")
			added, err := c.SyncPublication(context.Background())
			require.NoError(t, err, "nothing to sync: the publication holds every table by its definition")
			assert.Empty(t, added)
			report, err := c.Preflight(context.Background())
			require.NoError(t, err)
			for _, ch := range report.Checks {
				if ch.Name == siphon.CheckReplicaIdentity {
					assert.Equal(t, siphon.CheckFailed, ch.Status, "the keyless table stays published: its UPDATE and DELETE fail")
					assert.Contains(t, ch.Found, "notes")
					assert.Contains(t, ch.Found, "the application's UPDATE and DELETE on them fail")
				}
			}
			require.NoError(t, c.Detach(context.Background()))
			require.NoError(t, c.Close())
		})
	}
}
