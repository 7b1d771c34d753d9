package siphon_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/siphondb/siphon"
	"github.com/siphondb/siphon/canonical"
)

// Issue 24's attacks on the target, end to end: a real source where the
// superuser installed the capture, real DDL run there by mallory (a role
// that owns schema mal and nothing else), and a target database with the
// same starting schema that Replicate applies to as the target's
// superuser, the common deployment. What a user would notice: the apply
// stops with the typed error naming her, and nothing of hers ran on the
// target.

// e2ePair is a source and a target with the same starting schema:
// public.accounts (mallory may only read it), public.payroll and
// public.ledger of the superuser; schema mal of mallory with mal.marks,
// which her function mal.f() writes who ran it into (trying, as whoever
// runs it, to write the file marker too), and mal.t2. The source's
// superuser Conn c installed the capture and made its slot at start.
type e2ePair struct {
	srcDSN, tgtDSN string
	src, tgt       *pgx.Conn // admin sessions
	mallory        string
	her            *pgx.Conn // her session on the source
	marker         string
	c              *siphon.Conn
	slot           string
	start          canonical.Position
	systemID       string
}

func newE2EPair(t *testing.T, srcOpts ...siphon.Option) *e2ePair {
	t.Helper()
	p := &e2ePair{marker: markerPath(t, "pwned")}
	p.srcDSN, p.src = newDatabase(t)
	p.tgtDSN, p.tgt = newDatabase(t)
	p.mallory, p.her = hostileRole(t, p.srcDSN, p.src, false)
	m := p.mallory
	execSQL(t, p.tgt, "CREATE SCHEMA mal AUTHORIZATION "+m)
	// Roles are the cluster's: what is hers in the target goes before she does.
	t.Cleanup(func() { execSQL(t, p.tgt, "DROP OWNED BY "+m) })
	for _, admin := range []*pgx.Conn{p.src, p.tgt} {
		execSQL(t, admin,
			"CREATE TABLE public.accounts (id int PRIMARY KEY, owner text)",
			"INSERT INTO public.accounts VALUES (1, 'ann'), (2, 'ben')",
			"GRANT SELECT ON public.accounts TO "+m, // her GRANT ALL on it is a no-op WARNING then
			"CREATE TABLE public.payroll (id int PRIMARY KEY, salary int)",
			"INSERT INTO public.payroll VALUES (1, 1000)",
			"CREATE TABLE public.ledger (id int PRIMARY KEY)",
			"SET ROLE "+m,
			"CREATE TABLE mal.marks (id int GENERATED ALWAYS AS IDENTITY PRIMARY KEY, who text)",
			"CREATE TABLE mal.t2 (id int PRIMARY KEY)",
			`CREATE FUNCTION mal.f() RETURNS int LANGUAGE plpgsql AS $$BEGIN
			   INSERT INTO mal.marks (who) VALUES (current_user);
			   BEGIN PERFORM pg_catalog.lo_export(pg_catalog.lo_from_bytea(0, 'x'), '`+p.marker+`');
			   EXCEPTION WHEN OTHERS THEN NULL; END;
			   RETURN 1; END$$`,
			"RESET ROLE")
	}
	p.c, p.slot, p.start = captureConnAt(t, p.srcDSN, srcOpts...)
	p.systemID = systemIdentifier(t, p.src)
	forgetAppliedPosition(t, p.tgtDSN, p.systemID, p.slot)
	return p
}

// target connects to the target as its superuser.
func (p *e2ePair) target(t *testing.T, opts ...siphon.Option) *siphon.Conn {
	t.Helper()
	return connect(t, p.tgtDSN, opts...)
}

// replicate runs Replicate from the source into target until the target
// has applied everything committed on the source so far (nil), or until
// Replicate stops by itself (its error).
func (p *e2ePair) replicate(t *testing.T, target *siphon.Conn) error {
	t.Helper()
	mark := sourceMark(t, p.src)
	run := startReplicate(t, p.c, target, siphon.ReplicateOptions{})
	deadline := time.Now().Add(waitDeadline)
	for time.Now().Before(deadline) {
		select {
		case <-run.done:
			require.Error(t, run.err, "Replicate stops by itself only on an error")
			return run.err
		case <-time.After(10 * time.Millisecond):
		}
		applied, err := target.AppliedPositionFor(context.Background(), p.systemID, p.slot)
		require.NoError(t, err)
		if applied >= mark {
			_, err := run.stop()
			require.NoError(t, err)
			return nil
		}
	}
	require.FailNow(t, "Replicate neither reached the source's mark nor stopped")
	return nil
}

// finish detaches the source and checks that nothing was left behind.
func (p *e2ePair) finish(t *testing.T, targets ...*siphon.Conn) {
	t.Helper()
	require.NoError(t, p.c.Detach(context.Background()))
	require.NoError(t, p.c.Close())
	for _, c := range targets {
		require.NoError(t, c.Close())
	}
	assert.Empty(t, captureObjects(t, p.src), "Detach removed the capture")
	assertNoLeaks(t, p.srcDSN)
	assertNoLeaks(t, p.tgtDSN)
}

// targetCatalog describes what the target holds and who may do what with
// it: relations, functions, schemas (owner and privileges), default
// privileges. siphon's own schema is left out.
func targetCatalog(t *testing.T, conn *pgx.Conn) []string {
	t.Helper()
	rows, err := conn.Query(context.Background(), `
		SELECT 'relation ' || c.oid::regclass::text || ' ' || c.relkind::text || ' owner ' || c.relowner::regrole::text || ' acl ' || coalesce(c.relacl::text, '-')
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname NOT IN ('pg_catalog', 'information_schema', 'siphon') AND n.nspname NOT LIKE 'pg\_toast%' AND n.nspname NOT LIKE 'pg\_temp%'
		UNION ALL SELECT 'function ' || p.oid::regprocedure::text || ' owner ' || p.proowner::regrole::text || ' definer ' || p.prosecdef::text || ' acl ' || coalesce(p.proacl::text, '-')
		FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname NOT IN ('pg_catalog', 'information_schema', 'siphon')
		UNION ALL SELECT 'schema ' || nspname || ' owner ' || nspowner::regrole::text || ' acl ' || coalesce(nspacl::text, '-')
		FROM pg_namespace WHERE nspname NOT LIKE 'pg\_%' AND nspname NOT IN ('information_schema', 'siphon')
		UNION ALL SELECT 'default privileges of ' || defaclrole::regrole::text || ' ' || defaclobjtype::text || ' ' || defaclacl::text FROM pg_default_acl
		ORDER BY 1`)
	require.NoError(t, err)
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return names
}

// hasPrivilege reports has_table_privilege(role, table, privilege).
func hasPrivilege(t *testing.T, conn *pgx.Conn, role, table, privilege string) bool {
	t.Helper()
	var ok bool
	require.NoError(t, conn.QueryRow(context.Background(), "SELECT has_table_privilege($1, $2, $3)", role, table, privilege).Scan(&ok))
	return ok
}

// TestSchemaTrustE2EUntrustedRoleChangesNothing runs the issue's "the
// target grants what the source refused" and "the target runs what the
// source never ran" as mallory on a real source, each on a fresh pair:
// Replicate stops with an *UntrustedSchemaChangeError naming her and
// WithTrustedSchemaRoles, and the target's catalog (objects, owners,
// privileges, default privileges) is what it was, her function never ran
// there (no mark, no file).
func TestSchemaTrustE2EUntrustedRoleChangesNothing(t *testing.T) {
	t.Parallel()
	attacks := []struct {
		name  string
		her   func(m string) []string // her queries on the source
		check func(t *testing.T, p *e2ePair)
	}{
		{"grant on a temp table shadowing public.payroll",
			func(m string) []string {
				return []string{"CREATE TEMP TABLE payroll (id int)", "GRANT UPDATE ON payroll TO " + m}
			},
			func(t *testing.T, p *e2ePair) {
				assert.False(t, hasPrivilege(t, p.tgt, p.mallory, "public.payroll", "UPDATE"), "she may not UPDATE the target's payroll")
			}},
		{"grant all on accounts, a no-op warning on the source",
			func(m string) []string { return []string{"GRANT ALL ON public.accounts TO " + m} },
			func(t *testing.T, p *e2ePair) {
				assert.False(t, hasPrivilege(t, p.src, p.mallory, "public.accounts", "DELETE"), "the source refused")
				for _, priv := range []string{"DELETE", "UPDATE", "INSERT", "TRUNCATE"} {
					assert.False(t, hasPrivilege(t, p.tgt, p.mallory, "public.accounts", priv), "she may not %s the target's accounts", priv)
				}
			}},
		{"alter default privileges",
			func(m string) []string {
				return []string{"ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT ALL ON TABLES TO " + m}
			},
			func(t *testing.T, p *e2ePair) {
				assert.Zero(t, count(t, p.tgt, "SELECT count(*) FROM pg_default_acl"))
				execSQL(t, p.tgt, "CREATE TABLE public.later (id int)")
				assert.False(t, hasPrivilege(t, p.tgt, p.mallory, "public.later", "SELECT"), "she gets none of the DBA's later tables")
			}},
		{"drop owned by current_user",
			func(string) []string { return []string{"DROP OWNED BY CURRENT_USER"} },
			func(t *testing.T, p *e2ePair) {
				assert.ElementsMatch(t, []string{"mal.marks", "mal.t2", "accounts", "ledger", "payroll"}, userTables(t, p.tgt), "nothing dropped")
			}},
		{"her function in a CREATE TABLE AS",
			func(string) []string { return []string{"CREATE TABLE mal.t AS SELECT mal.f()"} },
			func(t *testing.T, p *e2ePair) {
				assert.Equal(t, 1, count(t, p.src, "SELECT count(*) FROM mal.marks"), "it ran on the source, as her")
				assert.Zero(t, count(t, p.tgt, "SELECT count(*) FROM pg_class WHERE oid = to_regclass('mal.t')"))
			}},
		{"her security definer function",
			func(string) []string {
				return []string{"CREATE FUNCTION mal.g() RETURNS text LANGUAGE sql SECURITY DEFINER AS $$SELECT current_user::text$$"}
			},
			func(t *testing.T, p *e2ePair) {
				assert.Zero(t, count(t, p.tgt, "SELECT count(*) FROM pg_proc WHERE proname = 'g'"))
			}},
		{`"$user" in her search_path`,
			func(string) []string {
				return []string{`SET search_path = "$user", mal`, "CREATE TABLE unq (id int)", "RESET search_path"}
			},
			func(t *testing.T, p *e2ePair) {
				assert.Zero(t, count(t, p.tgt, "SELECT count(*) FROM pg_class WHERE relname = 'unq'"), "her table went nowhere")
			}},
	}
	for _, a := range attacks {
		t.Run(a.name, func(t *testing.T) {
			t.Parallel()
			p := newE2EPair(t)
			execSQL(t, p.tgt, "CREATE SCHEMA "+p.mallory+" AUTHORIZATION "+p.mallory) // where "$user" would lead on the target
			before := targetCatalog(t, p.tgt)
			for _, q := range a.her(p.mallory) {
				execSQL(t, p.her, q)
			}
			target := p.target(t)
			err := p.replicate(t, target)
			var ute *siphon.UntrustedSchemaChangeError
			require.ErrorAs(t, err, &ute)
			assert.Equal(t, p.mallory, ute.SessionRole)
			assert.Contains(t, err.Error(), fmt.Sprintf("WithTrustedSchemaRoles(%q)", p.mallory))
			assert.Equal(t, before, targetCatalog(t, p.tgt), "the target's objects and privileges are unchanged")
			assert.Zero(t, count(t, p.tgt, "SELECT count(*) FROM mal.marks"), "her function never ran on the target")
			assert.NoFileExists(t, p.marker)
			a.check(t, p)
			p.finish(t, target)
		})
	}
}

// TestSchemaTrustE2ETrustedRoleRunsAsSource trusts mallory
// (WithTrustedSchemaRoles): her changes run on the target as they ran on
// the source. Her unqualified CREATE TABLE under "$user", mal lands in
// mal, where it landed on the source (the search_path is the source's
// effective schemas), not in the schema named like her that only the
// target has; of CREATE TEMP TABLE ledger; DROP TABLE ledger; DROP TABLE
// mal.t2, the target drops mal.t2 and keeps public.ledger. Her GRANT on
// a temporary table shadowing public.payroll, with role-dependent changes
// opted in too, runs as her and fails: she gets no UPDATE on payroll.
func TestSchemaTrustE2ETrustedRoleRunsAsSource(t *testing.T) {
	t.Parallel()
	p := newE2EPair(t)
	m := p.mallory
	execSQL(t, p.tgt, "CREATE SCHEMA "+m+" AUTHORIZATION "+m)
	execSQL(t, p.her, `SET search_path = "$user", mal`, "CREATE TABLE unq (id int)", "RESET search_path")
	execSQL(t, p.her, "CREATE TEMP TABLE ledger (id int); DROP TABLE ledger; DROP TABLE mal.t2")
	target := p.target(t, siphon.WithTrustedSchemaRoles(m))
	require.NoError(t, p.replicate(t, target))

	assert.Equal(t, 1, count(t, p.src, "SELECT count(*) FROM pg_class WHERE oid = to_regclass('mal.unq')"), "on the source it landed in mal")
	assert.Equal(t, []string{"mal.unq"}, relationsNamed(t, p.tgt, "unq"), "on the target too, not in schema "+m)
	var owner string
	require.NoError(t, p.tgt.QueryRow(context.Background(), "SELECT relowner::regrole::text FROM pg_class WHERE oid = 'mal.unq'::regclass").Scan(&owner))
	assert.Equal(t, m, owner, "made as her")
	assert.Empty(t, relationsNamed(t, p.tgt, "t2"), "DROP TABLE mal.t2 ran")
	assert.Equal(t, []string{"public.ledger"}, relationsNamed(t, p.tgt, "ledger"), "DROP TABLE ledger (her temporary one) did not")
	require.NoError(t, target.Close())

	// Her GRANT on a temporary table shadowing public.payroll, trusted and
	// with role-dependent changes opted in: it runs as her on the target,
	// where she may grant nothing on public.payroll.
	execSQL(t, p.her, "CREATE TEMP TABLE payroll (id int)", "GRANT UPDATE ON payroll TO "+m)
	opted := p.target(t, siphon.WithTrustedSchemaRoles(m), siphon.WithRoleDependentSchemaChanges())
	err := p.replicate(t, opted)
	var sce *siphon.SchemaChangeError
	require.ErrorAs(t, err, &sce, "the GRANT fails as her on the target")
	assert.Equal(t, "GRANT", sce.Tag)
	assert.ErrorContains(t, err, "permission denied")
	assert.False(t, hasPrivilege(t, p.tgt, m, "public.payroll", "UPDATE"), "she may not UPDATE the target's payroll")
	p.finish(t, opted)
}

// relationsNamed lists the relations called name, schema-qualified.
func relationsNamed(t *testing.T, conn *pgx.Conn, name string) []string {
	t.Helper()
	rows, err := conn.Query(context.Background(), `SELECT n.nspname || '.' || c.relname FROM pg_class c
		JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.relname = $1 ORDER BY 1`, name)
	require.NoError(t, err)
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return names
}

// schemaOf describes the columns, indexes and constraints of schema
// public, to compare a target with its source.
func schemaOf(t *testing.T, conn *pgx.Conn) []string {
	t.Helper()
	rows, err := conn.Query(context.Background(), `
		SELECT 'column ' || table_name || '.' || column_name || ' ' || data_type || ' ' || is_nullable || ' ' || coalesce(column_default, '')
		FROM information_schema.columns WHERE table_schema = 'public'
		UNION ALL SELECT 'index ' || indexdef FROM pg_indexes WHERE schemaname = 'public'
		UNION ALL SELECT 'constraint ' || conrelid::regclass::text || ' ' || conname || ' ' || pg_get_constraintdef(oid)
		FROM pg_constraint WHERE connamespace = 'public'::regnamespace
		ORDER BY 1`)
	require.NoError(t, err)
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return names
}

// TestSchemaTrustE2ESuperuserMigrations: the superuser's own migrations
// (several DDL statements in one query, a DO block, a transaction with
// rows) replicate, and go through an incremental backup and
// ConsumeCanonical with the same WithStreamKey on both Conns: both targets'
// schemas and rows match the source's.
func TestSchemaTrustE2ESuperuserMigrations(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	key := bytes.Repeat([]byte{0x5e}, 32)
	p := newE2EPair(t, siphon.WithStreamKey(key))
	execSQL(t, p.src,
		"CREATE TABLE public.orders (id int PRIMARY KEY, total numeric NOT NULL); CREATE INDEX orders_total ON public.orders (total); ALTER TABLE public.accounts ADD COLUMN email text",
		`DO $$ BEGIN EXECUTE format('ALTER TABLE %I ADD COLUMN %I text DEFAULT %L', 'orders', 'note', 'none'); END $$`,
		"BEGIN",
		"CREATE TABLE public.items (id int PRIMARY KEY, order_id int NOT NULL REFERENCES public.orders)",
		"INSERT INTO public.orders VALUES (1, 9.5)",
		"INSERT INTO public.items VALUES (1, 1)",
		"UPDATE public.accounts SET email = 'ann@example.com' WHERE id = 1",
		"COMMIT",
		"ALTER TABLE public.payroll DROP COLUMN salary; ALTER TABLE public.payroll ADD CONSTRAINT payroll_id_positive CHECK (id > 0)")
	want := schemaOf(t, p.src)
	require.Contains(t, want, "column orders.note text YES 'none'::text", "the source ran the DO block")

	// Through a keyed incremental backup, into a second target.
	var inc bytes.Buffer
	_, err := p.c.BackupIncremental(ctx, p.start, &inc)
	require.NoError(t, err)
	assert.Contains(t, inc.String(), `"key":"`+canonical.KeyID(key)+`"`, "the incremental is authenticated")
	otherDSN, other := newDatabase(t)
	execSQL(t, other, "CREATE SCHEMA mal",
		"CREATE TABLE public.accounts (id int PRIMARY KEY, owner text)", "INSERT INTO public.accounts VALUES (1, 'ann'), (2, 'ben')",
		"CREATE TABLE public.payroll (id int PRIMARY KEY, salary int)", "INSERT INTO public.payroll VALUES (1, 1000)",
		"CREATE TABLE public.ledger (id int PRIMARY KEY)",
		"CREATE TABLE mal.marks (id int GENERATED ALWAYS AS IDENTITY PRIMARY KEY, who text)", "CREATE TABLE mal.t2 (id int PRIMARY KEY)")
	forgetAppliedPosition(t, otherDSN, p.systemID, p.slot)
	consumer := connect(t, otherDSN, siphon.WithStreamKey(key))
	require.NoError(t, consumer.ConsumeCanonical(ctx, bytes.NewReader(inc.Bytes())))
	assert.Equal(t, want, schemaOf(t, other), "the backup's target has the source's schema")

	target := p.target(t, siphon.WithStreamKey(key))
	require.NoError(t, p.replicate(t, target))
	assert.Equal(t, want, schemaOf(t, p.tgt), "the replica has the source's schema")
	for _, table := range []string{"public.accounts", "public.orders", "public.items", "public.payroll"} {
		assert.Equal(t, digest(t, p.src, table), digest(t, p.tgt, table), "replica: %s", table)
		assert.Equal(t, digest(t, p.src, table), digest(t, other, table), "backup: %s", table)
	}
	require.NoError(t, consumer.Close())
	assertNoLeaks(t, otherDSN)
	p.finish(t, target)
}

// TestSchemaTrustE2ENestedStatementOfData: a superuser's DO block EXECUTEs
// a string of two statements whose first quotes, as data would, an alias
// of a line break and "PL/": in the call stack the text before the alias
// reads as one statement (a DELETE, which deleted nothing on the source),
// the whole text as two. The stream carries a problem for the CREATE
// TABLE's event, and Replicate stops there: the target's accounts keep
// their rows, and the table is not made.
func TestSchemaTrustE2ENestedStatementOfData(t *testing.T) {
	t.Parallel()
	p := newE2EPair(t)
	execSQL(t, p.src, `DO $d$ BEGIN EXECUTE E'DELETE FROM public.accounts"\nPL/" WHERE false; CREATE TABLE public.b (id int)'; END $d$`)
	require.Equal(t, 2, count(t, p.src, "SELECT count(*) FROM public.accounts"), "the source deleted nothing")
	target := p.target(t)
	err := p.replicate(t, target)
	var sce *siphon.SchemaChangeError
	require.ErrorAs(t, err, &sce)
	assert.Equal(t, "CREATE TABLE", sce.Tag)
	assert.Contains(t, sce.Problem, "cannot read with certainty")
	assert.Equal(t, 2, count(t, p.tgt, "SELECT count(*) FROM public.accounts"), "the target deleted nothing")
	assert.Zero(t, count(t, p.tgt, "SELECT count(*) FROM pg_tables WHERE tablename = 'b'"))
	p.finish(t, target)
}

// TestSchemaTrustE2ESecretsStayOut: a user mapping's password, created on
// the source by the superuser, appears nowhere siphon writes: not in any
// Change StreamChanges delivers, not in an incremental backup, not in an
// error or a log line of the source's or the target's Conn; Replicate
// stops at the user mapping, first as a role-dependent change, then, with
// WithRoleDependentSchemaChanges, with a problem that says it may carry a
// secret. A multi-statement query holding the password, and one that
// also switches standard_conforming_strings (whose problem carries the
// whole query for information otherwise), leave it out too.
func TestSchemaTrustE2ESecretsStayOut(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const secret = "sekrit-pw-4711"
	var logs lockedBuffer
	logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	var p *e2ePair
	{
		srcDSN, src := newDatabase(t)
		tgtDSN, tgt := newDatabase(t)
		for _, admin := range []*pgx.Conn{src, tgt} {
			execSQL(t, admin, "CREATE TABLE public.accounts (id int PRIMARY KEY)",
				"CREATE FOREIGN DATA WRAPPER w", "CREATE SERVER s FOREIGN DATA WRAPPER w OPTIONS (host 'h')",
				"CREATE SERVER s2 FOREIGN DATA WRAPPER w", "CREATE SERVER s3 FOREIGN DATA WRAPPER w")
		}
		p = &e2ePair{srcDSN: srcDSN, tgtDSN: tgtDSN, src: src, tgt: tgt}
		p.c, p.slot, p.start = captureConnAt(t, srcDSN, siphon.WithLogger(logger))
		p.systemID = systemIdentifier(t, src)
		forgetAppliedPosition(t, tgtDSN, p.systemID, p.slot)
	}
	// A second slot of the same publication, for the stream and the backup.
	reader, readerSlot, readerStart := streamConnAt(t, p.srcDSN, siphon.WithLogger(logger))
	execSQL(t, p.src,
		"CREATE USER MAPPING FOR postgres SERVER s OPTIONS (password '"+secret+"')",
		"CREATE TABLE public.before_mapping (id int); CREATE USER MAPPING FOR PUBLIC SERVER s2 OPTIONS (password '"+secret+"'); CREATE TABLE public.after_mapping (id int)",
		"SET standard_conforming_strings = off")
	execSQL(t, p.src, "SET standard_conforming_strings = on; CREATE USER MAPPING FOR PUBLIC SERVER s3 OPTIONS (password '"+secret+"')",
		"RESET standard_conforming_strings")
	// A role given a password in the query string of a table, in a session
	// with standard_conforming_strings off: the table's change carries a
	// problem, and the query is not shown with it.
	role := fmt.Sprintf("app_%d_%d", os.Getpid(), roleSeq.Add(1))
	t.Cleanup(func() { execSQL(t, p.src, "DROP ROLE IF EXISTS "+role) })
	execSQL(t, p.src, "SET standard_conforming_strings = off")
	execSQL(t, p.src, "CREATE ROLE "+role+" LOGIN PASSWORD '"+secret+"'; CREATE TABLE public.t_app (id int)")
	execSQL(t, p.src, "RESET standard_conforming_strings")

	check := func(what, text string) {
		t.Helper()
		assert.NotContains(t, text, secret, what)
	}

	var inc bytes.Buffer
	_, err := reader.BackupIncremental(ctx, readerStart, &inc)
	require.NoError(t, err, "an incremental backup of a source where a user mapping was made")
	check("the incremental backup", inc.String())
	assert.Contains(t, inc.String(), "may carry a secret", "the backup carries the mapping as a problem, for the apply to stop there")
	emitMarker(t, p.src, "end")
	changes, _ := streamUntil(t, reader, readerStart, "end")
	ddl := ddlOf(changes)
	require.NotEmpty(t, ddl)
	var mappings int
	for _, ch := range changes {
		check("change "+ch.Op.String(), fmt.Sprintf("%+v %+v", ch, ch.DDL))
		if ch.Op == canonical.OpDDL && strings.Contains(ch.DDL.Tag, "USER MAPPING") {
			mappings++
			assert.Contains(t, ch.DDL.Problem, "secret", "%+v", ch.DDL)
		}
	}
	assert.Equal(t, 3, mappings, "every user mapping is carried, as a problem")
	app := ddl[len(ddl)-1]
	assert.Equal(t, "CREATE TABLE", app.Tag)
	assert.Contains(t, app.Problem, "standard_conforming_strings off")
	assert.Equal(t, "(not shown: it may carry a secret)", app.Statement)
	require.NoError(t, reader.DropSlot(ctx, readerSlot))
	require.NoError(t, reader.Close())

	target := p.target(t, siphon.WithLogger(logger))
	err = p.replicate(t, target)
	var ute *siphon.UntrustedSchemaChangeError
	require.ErrorAs(t, err, &ute, "a user mapping's meaning depends on who runs it")
	check("the role-dependent refusal", err.Error()+fmt.Sprintf("%+v", *ute))
	assert.Empty(t, ute.Statement)
	assert.Contains(t, err.Error(), "(left out: it may carry secrets)")
	require.NoError(t, target.Close())

	opted := p.target(t, siphon.WithLogger(logger), siphon.WithRoleDependentSchemaChanges())
	err = p.replicate(t, opted)
	var sce *siphon.SchemaChangeError
	require.ErrorAs(t, err, &sce)
	assert.Contains(t, sce.Problem, "may carry a secret")
	assert.Equal(t, "CREATE USER MAPPING", sce.Tag)
	check("the problem", err.Error()+fmt.Sprintf("%+v", *sce))
	assert.Zero(t, count(t, p.tgt, "SELECT count(*) FROM pg_user_mappings"), "no user mapping made on the target")
	if inner := errors.Unwrap(err); inner != nil {
		check("the wrapped error", inner.Error())
	}
	require.NotEmpty(t, logs.String())
	check("the logs", logs.String())
	p.finish(t, opted)
}
