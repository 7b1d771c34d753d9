package sqltext

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestStatementsBoundaries(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		query string
		want  []string
	}{
		{"one", "ALTER TABLE t ADD c int", []string{"ALTER TABLE t ADD c int"}},
		{"several, empty ones left out", "CREATE TABLE a (id int);\nINSERT INTO a VALUES (1) ;; ALTER TABLE a ADD b text;\n",
			[]string{"CREATE TABLE a (id int)", "INSERT INTO a VALUES (1)", "ALTER TABLE a ADD b text"}},
		{"semicolons in strings", `INSERT INTO t VALUES ('a;b', 'it''s;', E'\';x'); SELECT 2`,
			[]string{`INSERT INTO t VALUES ('a;b', 'it''s;', E'\';x')`, "SELECT 2"}},
		{"a backslash is no escape in a standard string", `SELECT '\'; DROP TABLE public.accounts; --'; DROP TABLE mal.t1`,
			[]string{`SELECT '\'`, "DROP TABLE public.accounts"}},
		{"E strings escape quotes", `SELECT E'\'; DROP TABLE public.accounts; --'; DROP TABLE mal.t1`,
			[]string{`SELECT E'\'; DROP TABLE public.accounts; --'`, "DROP TABLE mal.t1"}},
		{"semicolons in identifiers", `CREATE TABLE "a;b" ("c;""d" int); SELECT 1`, []string{`CREATE TABLE "a;b" ("c;""d" int)`, "SELECT 1"}},
		{"dollar quotes with tags", "CREATE FUNCTION f() RETURNS int LANGUAGE plpgsql AS $body$ BEGIN RETURN 1; END $body$; SELECT $$;$$, $x$ $$; $x$",
			[]string{"CREATE FUNCTION f() RETURNS int LANGUAGE plpgsql AS $body$ BEGIN RETURN 1; END $body$", "SELECT $$;$$, $x$ $$; $x$"}},
		{"comments around statements are left out, inside kept", "-- a; comment\nSELECT 1; /* a /* nested; */ comment; */ SELECT /* ; */ 2 -- x;\n",
			[]string{"SELECT 1", "SELECT /* ; */ 2"}},
		{"begin atomic with end as a column alias", "CREATE FUNCTION mal.g() RETURNS int LANGUAGE sql BEGIN ATOMIC SELECT 1 AS end; SELECT mal.f(); END; SELECT 2",
			[]string{"CREATE FUNCTION mal.g() RETURNS int LANGUAGE sql BEGIN ATOMIC SELECT 1 AS end; SELECT mal.f(); END", "SELECT 2"}},
		{"begin atomic with case", "CREATE OR REPLACE PROCEDURE p(a int) LANGUAGE sql BEGIN ATOMIC SELECT CASE WHEN a > 0 THEN 1 END; SELECT 2; END; DROP TABLE x",
			[]string{"CREATE OR REPLACE PROCEDURE p(a int) LANGUAGE sql BEGIN ATOMIC SELECT CASE WHEN a > 0 THEN 1 END; SELECT 2; END", "DROP TABLE x"}},
		{"string continuation", "SELECT 'a'\n'b'; SELECT 2", []string{"SELECT 'a'\n'b'", "SELECT 2"}},
		{"no-break space is part of an identifier", "SELECT 1 AS a\u00a0", []string{"SELECT 1 AS a\u00a0"}},
		{"empty", " ; \n -- c\n", nil},
	}
	for _, tt := range tests {
		stmts, err := Statements(tt.query, true)
		require.NoError(t, err, tt.name)
		var got []string
		for _, s := range stmts {
			got = append(got, s.Text)
		}
		assert.Equal(t, tt.want, got, tt.name)
	}
}

func TestStatementsNonStandardStrings(t *testing.T) {
	t.Parallel()
	refused := []string{
		`SET standard_conforming_strings = off; SELECT '\'; DROP TABLE public.accounts; --'; DROP TABLE mal.t1`,
		`SELECT 'a\\b'`,
		"SELECT 'a'\n'\\'; DROP TABLE x; --'",
		`SELECT U&'d\0061t\+000061'`,
		`SELECT N'\'; DROP TABLE x; --'`,
		`SELECT '\''; DROP TABLE x; --'`, // does not scan with standard strings
	}
	for _, q := range refused {
		_, err := Statements(q, false)
		assert.ErrorIs(t, err, ErrNonStandardStrings, q)
	}
	same := []string{
		"SELECT 'a''b'; DROP TABLE x",
		`SELECT E'\'', $$\$$, "a\b", B'01' /* \ */; -- \`,
		"CREATE TABLE a (b text DEFAULT 'x')",
	}
	for _, q := range same {
		on, err := Statements(q, true)
		require.NoError(t, err, q)
		off, err := Statements(q, false)
		require.NoError(t, err, q)
		assert.Equal(t, on, off, q)
	}
	_, err := Statements(`SELECT U&'d\0061t'`, true)
	assert.NoError(t, err, "U&'' strings are fine with standard strings")
}

func TestStatementsSyntaxError(t *testing.T) {
	t.Parallel()
	for _, q := range []string{
		"SELECT 1; ALTER TABLE t ADD c int GENERATED ALWAYS AS (a * 2) VIRTUAL", // PostgreSQL 18
		"CREATE TABLE t (a int) WITH SYNTAX OF NO RELEASE",
		"SELECT 'unterminated",
		"not sql at all",
		"BEGIN ATOMIC SELECT 1 AS end; SELECT mal.f(); END",
	} {
		_, err := Statements(q, true)
		var se *SyntaxError
		assert.ErrorAs(t, err, &se, q)
	}
}

func TestStatementsClassify(t *testing.T) {
	t.Parallel()
	type want struct {
		tag                                string
		fires, uncertain, tx, role, secret bool
	}
	tests := []struct {
		stmt string
		want want
	}{
		{"CREATE TABLE t (a int)", want{tag: "CREATE TABLE", fires: true}},
		{"CREATE TEMP TABLE ledger (id int)", want{tag: "CREATE TABLE", fires: true}},
		{"CREATE UNLOGGED TABLE t AS SELECT 1", want{tag: "CREATE TABLE AS", fires: true}},
		{"CREATE MATERIALIZED VIEW v AS SELECT 1", want{tag: "CREATE MATERIALIZED VIEW", fires: true}},
		{"SELECT 1 INTO TEMP t", want{tag: "SELECT INTO", fires: true}},
		{"SELECT 1 INTO t UNION SELECT 2", want{tag: "SELECT INTO", fires: true}},
		{"WITH x AS (SELECT 1) SELECT * FROM x", want{tag: "SELECT"}},
		{"ALTER TABLE t ADD c int", want{tag: "ALTER TABLE", fires: true}},
		{"ALTER VIEW v RENAME TO w", want{tag: "ALTER VIEW", fires: true}},
		{"ALTER TABLE v RENAME COLUMN a TO b", want{tag: "ALTER TABLE", fires: true}},
		{"ALTER MATERIALIZED VIEW m RENAME COLUMN a TO b", want{tag: "ALTER MATERIALIZED VIEW", fires: true}},
		{"ALTER TABLE t OWNER TO CURRENT_USER", want{tag: "ALTER TABLE", fires: true, role: true}},
		{"ALTER TABLE t OWNER TO bob", want{tag: "ALTER TABLE", fires: true}},
		{"CREATE SCHEMA s AUTHORIZATION SESSION_USER", want{tag: "CREATE SCHEMA", fires: true, role: true}},
		{"CREATE POLICY p ON t TO CURRENT_ROLE USING (true)", want{tag: "CREATE POLICY", fires: true, role: true}},
		{"CREATE UNIQUE INDEX CONCURRENTLY i ON t (c)", want{tag: "CREATE INDEX", fires: true}},
		{"DROP INDEX i", want{tag: "DROP INDEX", fires: true}},
		{"COMMENT ON TABLE t IS 'x'", want{tag: "COMMENT", fires: true}},
		{"COMMENT ON DATABASE d IS 'x'", want{tag: "COMMENT"}},
		{"CREATE FUNCTION f() RETURNS int LANGUAGE sql RETURN 1", want{tag: "CREATE FUNCTION", fires: true}},
		{"CREATE PROCEDURE p() LANGUAGE sql BEGIN ATOMIC SELECT 1; END", want{tag: "CREATE PROCEDURE", fires: true}},
		{"CREATE TYPE mood AS ENUM ('a')", want{tag: "CREATE TYPE", fires: true}},
		{"ALTER TYPE mood ADD VALUE 'b'", want{tag: "ALTER TYPE", fires: true}},
		{"CREATE OR REPLACE TRUSTED PROCEDURAL LANGUAGE x HANDLER h", want{tag: "CREATE LANGUAGE", fires: true}},
		{"CREATE TEXT SEARCH CONFIGURATION c (COPY = english)", want{tag: "CREATE TEXT SEARCH CONFIGURATION", fires: true}},
		{"ALTER TEXT SEARCH DICTIONARY d (x = 1)", want{tag: "ALTER TEXT SEARCH DICTIONARY", fires: true}},
		{"GRANT SELECT ON TABLE t TO bob", want{tag: "GRANT", fires: true, role: true}},
		{"REVOKE ALL ON ALL TABLES IN SCHEMA public FROM bob", want{tag: "REVOKE", fires: true, role: true}},
		{"GRANT CONNECT ON DATABASE d TO bob", want{tag: "GRANT", role: true}},
		{"GRANT CREATE ON TABLESPACE ts TO bob", want{tag: "GRANT", role: true}},
		{"GRANT SET ON PARAMETER work_mem TO bob", want{tag: "GRANT", role: true}},
		{"GRANT admins TO bob", want{tag: "GRANT ROLE", role: true}},
		{"REVOKE admins FROM bob", want{tag: "REVOKE ROLE", role: true}},
		{"ALTER DEFAULT PRIVILEGES GRANT SELECT ON TABLES TO mallory", want{tag: "ALTER DEFAULT PRIVILEGES", fires: true, role: true}},
		{"DROP OWNED BY CURRENT_USER", want{tag: "DROP OWNED", fires: true, role: true}},
		{"REASSIGN OWNED BY bob TO alice", want{tag: "REASSIGN OWNED", role: true}},
		{"SECURITY LABEL ON TABLE t IS 'x'", want{tag: "SECURITY LABEL", fires: true, role: true}},
		{"SECURITY LABEL ON ROLE bob IS 'x'", want{tag: "SECURITY LABEL", role: true}},
		{"CREATE USER MAPPING FOR PUBLIC SERVER s OPTIONS (password 'x')", want{tag: "CREATE USER MAPPING", fires: true, role: true, secret: true}},
		{"ALTER USER MAPPING FOR CURRENT_USER SERVER s OPTIONS (SET password 'y')", want{tag: "ALTER USER MAPPING", fires: true, role: true, secret: true}},
		{"DROP USER MAPPING FOR bob SERVER s", want{tag: "DROP USER MAPPING", fires: true, role: true}},
		{"CREATE SERVER s FOREIGN DATA WRAPPER postgres_fdw OPTIONS (host 'h')", want{tag: "CREATE SERVER", fires: true, role: true, secret: true}},
		{"CREATE SERVER s FOREIGN DATA WRAPPER postgres_fdw", want{tag: "CREATE SERVER", fires: true, role: true}},
		{"DROP SERVER s", want{tag: "DROP SERVER", fires: true, role: true}},
		{"ALTER FOREIGN DATA WRAPPER w OPTIONS (ADD x 'y')", want{tag: "ALTER FOREIGN DATA WRAPPER", fires: true, role: true, secret: true}},
		{"CREATE SUBSCRIPTION s CONNECTION 'password=x' PUBLICATION p", want{tag: "CREATE SUBSCRIPTION", fires: true, secret: true}},
		{"ALTER SUBSCRIPTION s CONNECTION 'password=x'", want{tag: "ALTER SUBSCRIPTION", fires: true, secret: true}},
		{"CREATE USER bob PASSWORD 'x'", want{tag: "CREATE ROLE", secret: true}},
		{"ALTER ROLE bob ENCRYPTED PASSWORD 'x'", want{tag: "ALTER ROLE", secret: true}},
		{"ALTER ROLE CURRENT_USER SET work_mem = '1MB'", want{tag: "ALTER ROLE", role: true}},
		{"CREATE ROLE bob", want{tag: "CREATE ROLE"}},
		{"DROP ROLE bob", want{tag: "DROP ROLE"}},
		{"ALTER ROLE bob RENAME TO rob", want{tag: "ALTER ROLE"}},
		{"CREATE DATABASE d", want{tag: "CREATE DATABASE"}},
		{"ALTER DATABASE d OWNER TO bob", want{tag: "ALTER DATABASE"}},
		{"DROP DATABASE d", want{tag: "DROP DATABASE"}},
		{"CREATE TABLESPACE ts LOCATION '/x'", want{tag: "CREATE TABLESPACE"}},
		{"CREATE EVENT TRIGGER e ON ddl_command_end EXECUTE FUNCTION f()", want{tag: "CREATE EVENT TRIGGER"}},
		{"ALTER EVENT TRIGGER e DISABLE", want{tag: "ALTER EVENT TRIGGER"}},
		{"ALTER EVENT TRIGGER e OWNER TO bob", want{tag: "ALTER EVENT TRIGGER"}},
		{"DROP EVENT TRIGGER e", want{tag: "DROP EVENT TRIGGER"}},
		{"CREATE EXTENSION hstore", want{tag: "CREATE EXTENSION", fires: true, uncertain: true}},
		{"ALTER EXTENSION hstore ADD TABLE t", want{tag: "ALTER EXTENSION", fires: true}},
		{"REINDEX TABLE t", want{tag: "REINDEX", fires: true, uncertain: true}},
		{"EXPLAIN ANALYZE CREATE TABLE t AS SELECT 1", want{tag: "EXPLAIN", uncertain: true}},
		{"EXPLAIN SELECT 1", want{tag: "EXPLAIN"}},
		{"SELECT mal.f()", want{tag: "SELECT"}},
		{"INSERT INTO t VALUES (1)", want{tag: "INSERT"}},
		{"SET search_path = mal", want{tag: "SET"}},
		{"RESET ALL", want{tag: "RESET"}},
		{"DO $$ BEGIN END $$", want{tag: "DO"}},
		{"CALL p()", want{tag: "CALL"}},
		{"TRUNCATE t", want{tag: "TRUNCATE TABLE"}},
		{"COPY t FROM STDIN", want{tag: "COPY"}},
		{"LOCK t", want{tag: "LOCK TABLE"}},
		{"DISCARD TEMP", want{tag: "DISCARD TEMP"}},
		{"CLOSE ALL", want{tag: "CLOSE CURSOR ALL"}},
		{"MOVE NEXT IN c", want{tag: "MOVE"}},
		{"DEALLOCATE ALL", want{tag: "DEALLOCATE ALL"}},
		{"BEGIN", want{tag: "BEGIN", tx: true}},
		{"START TRANSACTION ISOLATION LEVEL SERIALIZABLE", want{tag: "START TRANSACTION", tx: true}},
		{"END", want{tag: "COMMIT", tx: true}},
		{"ABORT", want{tag: "ROLLBACK", tx: true}},
		{"SAVEPOINT a", want{tag: "SAVEPOINT", tx: true}},
		{"RELEASE a", want{tag: "RELEASE", tx: true}},
		{"ROLLBACK TO a", want{tag: "ROLLBACK", tx: true}},
		{"PREPARE TRANSACTION 'x'", want{tag: "PREPARE TRANSACTION", tx: true}},
		{"COMMIT PREPARED 'x'", want{tag: "COMMIT PREPARED", tx: true}},
		{"ROLLBACK PREPARED 'x'", want{tag: "ROLLBACK PREPARED", tx: true}},
	}
	for _, tt := range tests {
		stmts, err := Statements(tt.stmt, true)
		require.NoError(t, err, tt.stmt)
		require.Len(t, stmts, 1, tt.stmt)
		s := stmts[0]
		got := want{s.Tag, s.FiresDDLEvent, s.Uncertain, s.TransactionControl, s.RoleDependent, s.Secret}
		assert.Equal(t, tt.want, got, tt.stmt)
	}
}

// FuzzStatements: each statement is a piece of the query, in order, that
// starts and ends with something other than white space; together they
// hold every byte of the query that is neither white space, a comment, nor
// a separating semicolon; nothing panics.
func FuzzStatements(f *testing.F) {
	for _, s := range []string{
		"SELECT 1; SELECT 2", `SELECT E'\';'; SELECT $a$;$a$`, "/* /* */ ; */ SELECT 1 -- x", `SELECT "a""b";`,
		"CREATE FUNCTION f() RETURNS int LANGUAGE sql BEGIN ATOMIC SELECT 1 AS end; SELECT 2; END; SELECT 3",
		"/*/*SELECT*/*/SELECT", // the statement's text inside a comment before it (found by the fuzzer)
		`SET standard_conforming_strings = off; SELECT '\'; DROP TABLE public.accounts; --'; DROP TABLE mal.t1`,
	} {
		f.Add(s, true)
		f.Add(s, false)
	}
	// The parser's first call compiles it (seconds, more under the fuzzer's
	// instrumentation): done here, before the fuzzer times each input.
	if _, err := scan(""); err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, query string, scs bool) {
		stmts, err := Statements(query, scs)
		if err != nil {
			return
		}
		tokens, err := scan(query)
		if err != nil {
			t.Fatalf("the query parses but does not scan: %v", err)
		}
		at := 0
		for _, s := range stmts {
			if s.Text == "" || strings.TrimLeft(s.Text, pgSpace) != s.Text || strings.TrimRight(s.Text, pgSpace) != s.Text {
				t.Fatalf("statement %q is empty or not trimmed", s.Text)
			}
			// The statement starts at the first token after the previous one
			// that is neither a comment nor a semicolon (its text may also
			// stand inside a comment before it: "/*SELECT*/SELECT").
			start := -1
			for _, tok := range tokens {
				if p := int(tok.GetStart()); p >= at && !isComment(tok) && query[p] != ';' {
					start = p
					break
				}
			}
			if start < 0 || !strings.HasPrefix(query[start:], s.Text) {
				t.Fatalf("statement %q does not start at the first token after byte %d of %q", s.Text, at, query)
			}
			at = start + len(s.Text)
		}
		for _, tok := range tokens {
			if p := int(tok.GetStart()); p >= at && !isComment(tok) && query[p] != ';' {
				t.Fatalf("byte %d of %q (%s) is in no statement", p, query, tok.GetToken())
			}
		}
	})
}

// BenchmarkStatements: a parse of a three-statement migration, once the
// parser is compiled.
func BenchmarkStatements(b *testing.B) {
	const q = "CREATE TABLE a (id int PRIMARY KEY, b text); ALTER TABLE a ADD c int; CREATE INDEX ON a (c)"
	if _, err := Statements(q, true); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if _, err := Statements(q, true); err != nil {
			b.Fatal(err)
		}
	}
}
