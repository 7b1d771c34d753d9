package siphon_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/siphondb/siphon"
	"github.com/siphondb/siphon/canonical"
)

// The attacks of a role the source does not trust on the schema capture
// (see SECURITY.md). Each runs on a source where a superuser installed the
// capture, as a role that owns only schema mal (or has only CONNECT and
// TEMP), and checks that it has no effect.

// hostileRole makes a login role that owns schema mal in the database of
// admin (or, with onlyTemp, has nothing but CONNECT and TEMP), dropped
// when the test ends, and returns its name and a session as it.
func hostileRole(t *testing.T, dsn string, admin *pgx.Conn, onlyTemp bool) (string, *pgx.Conn) {
	t.Helper()
	role := fmt.Sprintf("mallory_%d_%d", os.Getpid(), roleSeq.Add(1))
	db := pgx.Identifier{dbName(t, admin)}.Sanitize()
	execSQL(t, admin, "CREATE ROLE "+role+" LOGIN PASSWORD 'mallory-pw-1234'",
		"REVOKE ALL ON DATABASE "+db+" FROM PUBLIC",
		"GRANT CONNECT, TEMP ON DATABASE "+db+" TO "+role)
	if !onlyTemp {
		execSQL(t, admin, "CREATE SCHEMA mal AUTHORIZATION "+role)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		_, err := admin.Exec(ctx, "DROP OWNED BY "+role)
		assert.NoError(t, err)
		// Her other sessions end with the test; a role with sessions cannot be dropped.
		_, err = admin.Exec(ctx, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1", role)
		assert.NoError(t, err)
		_, err = admin.Exec(ctx, "DROP ROLE IF EXISTS "+role)
		assert.NoError(t, err)
	})
	return role, connectOrFail(t, strings.Replace(dsn, "postgres@", role+":mallory-pw-1234@", 1))
}

// isSuperuser reports whether role is a superuser.
func isSuperuser(t *testing.T, admin *pgx.Conn, role string) bool {
	t.Helper()
	var super bool
	require.NoError(t, admin.QueryRow(context.Background(), "SELECT rolsuper FROM pg_roles WHERE rolname = $1", role).Scan(&super))
	return super
}

// TestCaptureCannotBeHijackedThroughTypes: the capture's functions run as
// the installing superuser; a type the caller's search_path puts before
// pg_catalog (a domain in her schema, or in pg_temp, with a CHECK that
// calls her function) must not run her code as the superuser.
func TestCaptureCannotBeHijackedThroughTypes(t *testing.T) {
	t.Parallel()
	dsn, admin := newDatabase(t)
	c, slot, _ := captureConnAt(t, dsn)

	role, mallory := hostileRole(t, dsn, admin, false)
	execSQL(t, mallory,
		"CREATE FUNCTION mal.evil(v text) RETURNS bool LANGUAGE plpgsql AS $$ BEGIN EXECUTE 'ALTER ROLE "+role+" SUPERUSER'; RETURN true; EXCEPTION WHEN OTHERS THEN RETURN true; END $$",
		"CREATE DOMAIN mal.text AS pg_catalog.text CHECK (mal.evil(VALUE))",
		"CREATE DOMAIN mal.jsonb AS pg_catalog.jsonb CHECK (mal.evil(VALUE::pg_catalog.text))",
		"SET search_path = mal, pg_catalog",
		"CREATE TABLE mal.x ()",
		"ALTER TABLE mal.x ADD COLUMN a int",
		"DROP TABLE mal.x")
	assert.False(t, isSuperuser(t, admin, role), "her domain's CHECK did not run as the superuser")

	// With nothing but CONNECT and TEMP: the same through pg_temp, where
	// her function would write a file as the server.
	file := filepath.Join(t.TempDir(), "stolen")
	require.NoError(t, os.Chmod(filepath.Dir(file), 0o777))
	tempRole, temp := hostileRole(t, dsn, admin, true)
	execSQL(t, temp,
		"CREATE FUNCTION pg_temp.evil(v text) RETURNS bool LANGUAGE sql AS $$ SELECT pg_catalog.lo_export(pg_catalog.lo_from_bytea(0, 'x'), '"+file+"') IS NOT NULL $$",
		"CREATE DOMAIN pg_temp.text AS pg_catalog.text CHECK (pg_temp.evil(VALUE))",
		"CREATE TEMP TABLE t (id int)",
		"ALTER TABLE t ADD COLUMN a int")
	assert.NoFileExists(t, file, "her pg_temp function did not run as the superuser")
	assert.False(t, isSuperuser(t, admin, tempRole))

	require.NoError(t, c.Detach(context.Background()))
	require.NoError(t, c.Close())
	assertNoLeaks(t, dsn, slot)
}

// TestCaptureRefusesObjectsOfOtherRoles: a database owner who plants
// schema siphon, its table and capture_event() before a superuser attaches
// keeps nothing: InstallSchemaCapture refuses with the objects and their
// owner, Preflight fails the check, and her function is never made an
// event trigger's.
func TestCaptureRefusesObjectsOfOtherRoles(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn, admin := newDatabase(t)
	role, owner := hostileRole(t, dsn, admin, true)
	db := pgx.Identifier{dbName(t, admin)}.Sanitize()
	execSQL(t, admin, "ALTER DATABASE "+db+" OWNER TO "+role)
	t.Cleanup(func() { execSQL(t, admin, "ALTER DATABASE "+db+" OWNER TO postgres") })
	execSQL(t, owner,
		"CREATE SCHEMA siphon",
		"CREATE TABLE siphon.schema_changes (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, change jsonb NOT NULL)",
		"CREATE FUNCTION siphon.capture_event() RETURNS event_trigger LANGUAGE plpgsql AS $$ BEGIN RAISE NOTICE 'hers'; END $$")
	c, _ := streamConn(t, dsn)

	err := c.InstallSchemaCapture(ctx)
	var foreign *siphon.SchemaCaptureForeignError
	require.ErrorAs(t, err, &foreign)
	assert.Contains(t, err.Error(), "schema siphon (owned by "+role+")")
	assert.Contains(t, err.Error(), "function siphon.capture_event() (owned by "+role+")")
	var triggers int
	require.NoError(t, admin.QueryRow(ctx, "SELECT count(*) FROM pg_event_trigger").Scan(&triggers))
	assert.Zero(t, triggers, "no event trigger runs her function")

	report, err := c.Preflight(ctx)
	require.NoError(t, err)
	check, ok := report.Check(siphon.CheckSchemaCapture)
	require.True(t, ok)
	assert.Equal(t, siphon.CheckWarning, check.Status, "not installed: schema changes are not captured")
	assert.Contains(t, check.Found, "it would refuse")
}

// TestCaptureIgnoresSettingsOfOtherRoles: the settings a session may set
// for itself (siphon.capturing, siphon.dropped, siphon.created and
// siphon.caller, which earlier versions read or which the capture hands
// from one function to the next) switch nothing off, forge nothing and
// make no failure out of a malformed value: her DDL still reaches the
// stream, as hers, with no problem.
func TestCaptureIgnoresSettingsOfOtherRoles(t *testing.T) {
	t.Parallel()
	dsn, admin := newDatabase(t)
	c, slot, start := captureConnAt(t, dsn)
	role, mallory := hostileRole(t, dsn, admin, false)
	execSQL(t, mallory, "CREATE TABLE mal.t (id int, v int)", "CREATE TABLE mal.gone (id int)")
	execSQL(t, mallory,
		"SET siphon.capturing = on",
		`SET siphon.dropped = '{not json'`,
		`SET siphon.created = 'not an array'`,
		`SET siphon.caller = '{"role": "postgres", "schemas": ["public"], "standard_conforming_strings": "on"}'`,
		"ALTER TABLE mal.t ADD CONSTRAINT t_v CHECK (v > 0)",
		"CREATE INDEX t_v_idx ON mal.t (v)",
		"DROP TABLE mal.gone")
	emitMarker(t, admin, "end")
	changes, _ := streamUntil(t, c, start, "end")
	var ddl []*canonical.DDL
	for _, d := range ddlOf(changes) {
		if d.SessionRole == role {
			ddl = append(ddl, d)
		}
	}
	require.Equal(t, []string{
		"CREATE TABLE mal.t (id int, v int)", "CREATE TABLE mal.gone (id int)",
		"ALTER TABLE mal.t ADD CONSTRAINT t_v CHECK (v > 0)", "CREATE INDEX t_v_idx ON mal.t (v)", "DROP TABLE mal.gone",
	}, statementsOf(ddl))
	for _, d := range ddl {
		assert.Empty(t, d.Problem, d.Statement)
		assert.Equal(t, role, d.Role, "the role that ran it, not the one she wrote in siphon.caller")
		assert.Equal(t, role, d.SessionRole)
		assert.False(t, d.Superuser)
		assert.Equal(t, "postgres", d.Installer)
	}
	require.NoError(t, c.Detach(context.Background()))
	require.NoError(t, c.Close())
	assertNoLeaks(t, dsn, slot)
}

// TestCaptureInstallLockTimesOut: any role may hold the install's
// advisory lock; the install waits a bounded time and says who to look
// for, instead of hanging.
func TestCaptureInstallLockTimesOut(t *testing.T) {
	t.Parallel()
	dsn, admin := newDatabase(t)
	_, mallory := hostileRole(t, dsn, admin, true)
	execSQL(t, mallory, "SELECT pg_advisory_lock(hashtext('siphon schema capture'))")
	c, _ := streamConn(t, dsn)
	err := c.InstallSchemaCapture(context.Background())
	require.Error(t, err)
	assert.Contains(t, err.Error(), "install lock")
	assert.Empty(t, captureObjects(t, admin), "nothing installed")
}

// TestStatementBoundariesFromTheServersGrammar: the statement the target
// runs is the one PostgreSQL ran, as its own grammar splits the query
// string, or none (a problem) where that is not certain.
func TestStatementBoundariesFromTheServersGrammar(t *testing.T) {
	t.Parallel()
	dsn, admin := newDatabase(t)
	c, slot, _ := captureConnAt(t, dsn)
	execSQL(t, admin, "CREATE TABLE public.accounts (id int)", "CREATE TABLE public.ledger (id int)",
		"CREATE TABLE t1 (id int)", "CREATE TABLE t1b (id int)", "CREATE TABLE t2 (id int)", "CREATE TABLE t3 (id int)",
		"CREATE FUNCTION f() RETURNS int LANGUAGE sql RETURN 1")
	from := insertPosition(t, admin)
	// With standard_conforming_strings off a backslash escapes the quote:
	// the SELECT's string holds "DROP TABLE public.accounts".
	// (psql sends each statement as a query of its own: the server reads a
	// query string whole under the setting it had when it arrived.)
	execSQL(t, admin, "SET standard_conforming_strings = off")
	execSQL(t, admin, `SELECT '\'; DROP TABLE public.accounts; --'; DROP TABLE t1`)
	execSQL(t, admin, "RESET standard_conforming_strings")
	// A query that switches the setting between its statements: the
	// server reads it under off, its DROP runs under on.
	execSQL(t, admin, "SET standard_conforming_strings = off")
	execSQL(t, admin, `SET standard_conforming_strings = on; SELECT '\'; DROP TABLE public.accounts; --'; DROP TABLE t1b`)
	execSQL(t, admin, "RESET standard_conforming_strings")
	// Temporary objects fire events too: the third event is DROP TABLE t2.
	execSQL(t, admin, "CREATE TEMP TABLE ledger (id int); DROP TABLE ledger; DROP TABLE t2")
	// END as a column label inside BEGIN ATOMIC does not end the body.
	execSQL(t, admin, "CREATE FUNCTION g() RETURNS int LANGUAGE sql BEGIN ATOMIC SELECT 1 AS end; SELECT f(); END; DROP TABLE t3")
	// Comments, dollar quotes and E'' strings.
	execSQL(t, admin, "CREATE TABLE t4 (v text DEFAULT $x$;$x$); -- ;\nSELECT E'\\'; DROP TABLE public.ledger; --'; CREATE TABLE t5 (id int)")
	var accounts bool
	require.NoError(t, admin.QueryRow(context.Background(), "SELECT to_regclass('public.accounts') IS NOT NULL").Scan(&accounts))
	require.True(t, accounts, "the source read the queries as the test means")
	emitMarker(t, admin, "end")
	changes, _ := streamUntil(t, c, from, "end")
	var got []string
	for _, d := range ddlOf(changes) {
		got = append(got, d.Statement+" | "+d.Problem)
	}
	require.Len(t, got, 7, strings.Join(got, "\n"))
	assert.Contains(t, got[0], "standard_conforming_strings off", "refused, not guessed")
	assert.Contains(t, got[1], "may change standard_conforming_strings", "refused, not guessed")
	assert.NotContains(t, got[1], "public.accounts |", "the whole query for information, never the DROP alone")
	assert.Equal(t, []string{
		"DROP TABLE t2 | ",
		"CREATE FUNCTION g() RETURNS int LANGUAGE sql BEGIN ATOMIC SELECT 1 AS end; SELECT f(); END | ",
		"DROP TABLE t3 | ",
		"CREATE TABLE t4 (v text DEFAULT $x$;$x$) | ",
		"CREATE TABLE t5 (id int) | ",
	}, got[2:])
	require.NoError(t, c.Detach(context.Background()))
	require.NoError(t, c.Close())
	assertNoLeaks(t, dsn, slot)
}

// TestForgedCaptureTableIsNeverRun: a database owner (CREATE on the
// database, nothing else) makes a schema siphon and a table
// siphon.schema_changes before any capture is installed, writes a row that
// claims a superuser's COPY ... TO PROGRAM into it, and drops both again:
// in a publication of all tables the row is decoded under the capture's
// name. The stream carries it as a schema change with a problem and no
// statement, never a superuser's; Replicate stops there with nothing
// written on the target; a Conn WithoutSchemaCapture leaves it out.
func TestForgedCaptureTableIsNeverRun(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srcDSN, src := newDatabase(t)
	tgtDSN, tgt := newDatabase(t)
	role, owner := hostileRole(t, srcDSN, src, true)
	db := pgx.Identifier{dbName(t, src)}.Sanitize()
	execSQL(t, src, "ALTER DATABASE "+db+" OWNER TO "+role)
	t.Cleanup(func() { execSQL(t, src, "ALTER DATABASE "+db+" OWNER TO postgres") })
	for _, admin := range []*pgx.Conn{src, tgt} {
		execSQL(t, admin, "CREATE TABLE public.accounts (id int PRIMARY KEY)", "INSERT INTO public.accounts VALUES (1), (2)")
	}
	pub := fmt.Sprintf("all_%d", streamSlotSeq.Add(1))
	execSQL(t, src, "CREATE PUBLICATION "+pub+" FOR ALL TABLES")
	c, slot, _ := streamConnAt(t, srcDSN, siphon.WithPublication(pub))
	reader, readerSlot, start := streamConnAt(t, srcDSN, siphon.WithPublication(pub))
	ignoring, ignoringSlot, ignoringStart := streamConnAt(t, srcDSN, siphon.WithPublication(pub), siphon.WithoutSchemaCapture())
	forgetAppliedPosition(t, tgtDSN, systemIdentifier(t, src), slot)

	marker := markerPath(t, "forged")
	forged, err := json.Marshal(map[string]any{
		"tag": "CREATE TABLE", "query": copyToProgram(marker),
		"stack":        "PL/pgSQL function siphon.capture_event() line 5 at GET DIAGNOSTICS",
		"caller":       map[string]any{"role": "postgres", "schemas": []string{"public"}, "standard_conforming_strings": "on"},
		"session_role": "postgres", "superuser": true, "installer": "postgres", "backend": 1, "started": "2026-01-01",
	})
	require.NoError(t, err)
	execSQL(t, owner,
		"CREATE SCHEMA siphon",
		"CREATE TABLE siphon.schema_changes (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, change jsonb NOT NULL)",
		"INSERT INTO siphon.schema_changes (change) VALUES ('"+strings.ReplaceAll(string(forged), "'", "''")+"')",
		"DROP SCHEMA siphon CASCADE")
	emitMarker(t, src, "end")

	changes, _ := streamUntil(t, reader, start, "end")
	ddl := ddlOf(changes)
	require.Len(t, ddl, 1, "the forged row is carried once")
	assert.False(t, ddl[0].Superuser)
	assert.Empty(t, ddl[0].Statement, "no statement of hers travels")
	assert.Contains(t, ddl[0].Problem, "not the one the schema capture installed")
	for _, ch := range changes {
		assert.NotEqual(t, "siphon", ch.Schema, "her table's rows are not delivered as data either")
	}
	require.NoError(t, reader.DropSlot(ctx, readerSlot))

	changes, _ = streamUntil(t, ignoring, ignoringStart, "end")
	assert.Empty(t, ddlOf(changes), "WithoutSchemaCapture leaves it out")
	for _, ch := range changes {
		assert.NotEqual(t, "siphon", ch.Schema)
	}
	require.NoError(t, ignoring.DropSlot(ctx, ignoringSlot))

	target := connect(t, tgtDSN)
	run := startReplicate(t, c, target, siphon.ReplicateOptions{})
	var runErr error
	select {
	case <-run.done:
		runErr = run.err
	case <-time.After(waitDeadline):
		t.Fatal("Replicate did not stop at the forged row")
	}
	var sce *siphon.SchemaChangeError
	require.ErrorAs(t, runErr, &sce)
	assert.Contains(t, sce.Problem, "not the one the schema capture installed")
	assert.NoFileExists(t, marker, "nothing ran on the target")
	assert.Equal(t, 2, count(t, tgt, "SELECT count(*) FROM public.accounts"))
	require.NoError(t, c.DropSlot(ctx, slot))
}

// TestCaptureCannotBeHijackedThroughOperators: the capture's SQL names its
// types and functions with their schema, but not its operators (=, LIKE,
// ~*, ||): those resolve in pg_catalog only because its functions pin
// search_path. Her = and ~~ on text, and || on jsonb, in her schema put
// first in her search_path, must not run as the superuser.
func TestCaptureCannotBeHijackedThroughOperators(t *testing.T) {
	t.Parallel()
	dsn, admin := newDatabase(t)
	c, slot, _ := captureConnAt(t, dsn)

	role, mallory := hostileRole(t, dsn, admin, false)
	grab := "BEGIN EXECUTE 'ALTER ROLE " + role + " SUPERUSER'; EXCEPTION WHEN OTHERS THEN NULL; END;"
	execSQL(t, mallory,
		"CREATE FUNCTION mal.eq(a text, b text) RETURNS bool LANGUAGE plpgsql AS $$ BEGIN "+grab+" RETURN pg_catalog.texteq(a, b); END $$",
		"CREATE FUNCTION mal.like(a text, b text) RETURNS bool LANGUAGE plpgsql AS $$ BEGIN "+grab+" RETURN pg_catalog.textlike(a, b); END $$",
		"CREATE FUNCTION mal.cat(a jsonb, b jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$ BEGIN "+grab+" RETURN pg_catalog.jsonb_concat(a, b); END $$",
		"CREATE OPERATOR mal.= (LEFTARG = text, RIGHTARG = text, FUNCTION = mal.eq)",
		"CREATE OPERATOR mal.~~ (LEFTARG = text, RIGHTARG = text, FUNCTION = mal.like)",
		"CREATE OPERATOR mal.|| (LEFTARG = jsonb, RIGHTARG = jsonb, FUNCTION = mal.cat)",
		"SET search_path = mal, pg_catalog",
		"CREATE TABLE mal.x (id int)",
		"ALTER TABLE mal.x ADD COLUMN a int",
		"DROP TABLE mal.x")
	assert.False(t, isSuperuser(t, admin, role), "her operators did not run as the superuser")

	require.NoError(t, c.Detach(context.Background()))
	require.NoError(t, c.Close())
	assertNoLeaks(t, dsn, slot)
}
