package sqltext_test

import (
	"context"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/siphondb/siphon/internal/sqltext"
	"github.com/siphondb/siphon/siphontest"
)

// TestStatementsAgainstServer: the server runs as many statements as
// Statements finds, fires ddl_command_end for those it says fire, and
// gives them the tag it says.
func TestStatementsAgainstServer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, siphontest.Start(t).NewDatabase(t))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	exec := func(sql string) int {
		t.Helper()
		results, err := conn.PgConn().Exec(ctx, sql).ReadAll()
		require.NoError(t, err, sql)
		return len(results)
	}
	exec(`CREATE TABLE public.ddl_log (tag text);
		CREATE FUNCTION public.log_ddl() RETURNS event_trigger LANGUAGE plpgsql
			AS $$ BEGIN INSERT INTO public.ddl_log VALUES (tg_tag); END $$;
		CREATE EVENT TRIGGER log_ddl ON ddl_command_end EXECUTE FUNCTION public.log_ddl();
		CREATE SCHEMA mal; CREATE FUNCTION mal.f() RETURNS int LANGUAGE sql RETURN 1;
		CREATE TABLE public.t (a int); CREATE VIEW public.v AS SELECT 1 AS a;
		CREATE FOREIGN DATA WRAPPER w; CREATE SERVER s FOREIGN DATA WRAPPER w`)

	for _, query := range []string{
		"CREATE TABLE a (id int); CREATE TEMP TABLE ledger (id int); DROP TABLE ledger; DROP TABLE a",
		"CREATE TABLE b AS SELECT 1 AS x; SELECT 1 AS x INTO c; SELECT 1 AS x INTO TEMP d UNION SELECT 2; DROP TABLE b, c, d",
		"CREATE FUNCTION mal.g() RETURNS int LANGUAGE sql BEGIN ATOMIC SELECT 1 AS end; SELECT mal.f(); END; SELECT 2",
		"CREATE FUNCTION mal.h(a int) RETURNS int LANGUAGE sql BEGIN ATOMIC SELECT CASE WHEN a > 0 THEN 1 END; END",
		"ALTER TABLE v RENAME TO v2; ALTER VIEW v2 RENAME TO v; ALTER TABLE t OWNER TO CURRENT_USER",
		"GRANT SELECT ON TABLE t TO PUBLIC; REVOKE SELECT ON t FROM PUBLIC; GRANT CONNECT ON DATABASE postgres TO PUBLIC",
		"COMMENT ON TABLE t IS 'x'; COMMENT ON DATABASE postgres IS NULL; COMMENT ON EVENT TRIGGER log_ddl IS 'x'",
		"ALTER DEFAULT PRIVILEGES IN SCHEMA mal GRANT SELECT ON TABLES TO PUBLIC",
		"CREATE USER MAPPING FOR PUBLIC SERVER s OPTIONS (password 'x'); DROP USER MAPPING FOR PUBLIC SERVER s",
		"CREATE INDEX i ON t (a); DROP INDEX i; CREATE UNIQUE INDEX j ON t (a); TRUNCATE t; DO $$ BEGIN END $$",
		"BEGIN; CREATE TYPE mood AS ENUM ('a'); SAVEPOINT x; ALTER TYPE mood RENAME TO feeling; RELEASE x; COMMIT",
		"SET search_path = mal, pg_catalog; RESET search_path; SELECT E'\\'; DROP TABLE t; --'",
		"CREATE PUBLICATION p FOR TABLE t; ALTER PUBLICATION p SET (publish = 'insert'); DROP PUBLICATION p",
		"CREATE MATERIALIZED VIEW m AS SELECT 1 AS a; REFRESH MATERIALIZED VIEW m; ALTER MATERIALIZED VIEW m RENAME a TO b; DROP MATERIALIZED VIEW m",
		"CREATE SEQUENCE q; ALTER SEQUENCE q RESTART; SELECT nextval('q'); DROP SEQUENCE q",
	} {
		stmts, err := sqltext.Statements(query, true)
		require.NoError(t, err, query)
		if !slices.ContainsFunc(stmts, func(s sqltext.Statement) bool { return s.TransactionControl }) {
			require.Equal(t, len(stmts)+2, exec("BEGIN; "+query+"; ROLLBACK"), "the server runs as many statements: %q", query)
		}
		for _, st := range stmts {
			exec("TRUNCATE public.ddl_log")
			assert.Equal(t, 1, exec(st.Text), "%q is one statement", st.Text)
			rows, err := conn.Query(ctx, "SELECT tag FROM public.ddl_log")
			require.NoError(t, err)
			tags, err := pgx.CollectRows(rows, pgx.RowTo[string])
			require.NoError(t, err)
			if !st.Uncertain {
				assert.Equal(t, st.FiresDDLEvent, len(tags) == 1, "%q fires (%v)", st.Text, tags)
			}
			for _, tag := range tags {
				assert.Equal(t, tag, st.Tag, st.Text)
			}
		}
	}

	// With standard_conforming_strings off, what Statements accepts the
	// server splits the same way.
	exec("SET standard_conforming_strings = off")
	for _, query := range []string{"SELECT 'a''b'; SELECT 2", `SELECT E'\'', $$\$$; SELECT 'x' /* \ */`, "SELECT 'a'\n'b'; SELECT N'c'"} {
		stmts, err := sqltext.Statements(query, false)
		require.NoError(t, err, query)
		assert.Equal(t, len(stmts), exec(query), query)
	}
	_, err = sqltext.Statements(`SELECT '\'; SELECT 1; --'`, false)
	assert.ErrorIs(t, err, sqltext.ErrNonStandardStrings)
	assert.Equal(t, 1, exec(`SELECT '\'; SELECT 1; --'`), "the server reads one statement")
}
