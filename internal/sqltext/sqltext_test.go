package sqltext

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestSplit(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		query string
		want  []string
	}{
		{"one", "ALTER TABLE t ADD c int", []string{"ALTER TABLE t ADD c int"}},
		{"several", "CREATE TABLE a (id int);\nINSERT INTO a VALUES (1) ;; ALTER TABLE a ADD b text;\n", []string{"CREATE TABLE a (id int)", "INSERT INTO a VALUES (1)", "ALTER TABLE a ADD b text"}},
		{"semicolons in strings", `INSERT INTO t VALUES ('a;b', 'it''s;', E'\';x'); SELECT 2`, []string{`INSERT INTO t VALUES ('a;b', 'it''s;', E'\';x')`, "SELECT 2"}},
		{"semicolons in identifiers", `CREATE TABLE "a;b" ("c;""d" int); SELECT 1`, []string{`CREATE TABLE "a;b" ("c;""d" int)`, "SELECT 1"}},
		{"dollar quotes", "CREATE FUNCTION f() RETURNS int LANGUAGE plpgsql AS $body$ BEGIN RETURN 1; END $body$; SELECT $$;$$, $1",
			[]string{"CREATE FUNCTION f() RETURNS int LANGUAGE plpgsql AS $body$ BEGIN RETURN 1; END $body$", "SELECT $$;$$, $1"}},
		{"identifiers with dollars", "SELECT a$b$c FROM t; SELECT 1", []string{"SELECT a$b$c FROM t", "SELECT 1"}},
		{"comments", "-- a; comment\nSELECT 1; /* a /* nested; */ comment; */ SELECT 2", []string{"-- a; comment\nSELECT 1", "/* a /* nested; */ comment; */ SELECT 2"}},
		{"begin atomic", "CREATE OR REPLACE FUNCTION f(a int) RETURNS int LANGUAGE sql BEGIN ATOMIC SELECT CASE WHEN a > 0 THEN 1 END; SELECT 2; END; DROP TABLE x",
			[]string{"CREATE OR REPLACE FUNCTION f(a int) RETURNS int LANGUAGE sql BEGIN ATOMIC SELECT CASE WHEN a > 0 THEN 1 END; SELECT 2; END", "DROP TABLE x"}},
		{"transaction blocks", "BEGIN; ALTER TABLE t ADD c int; COMMIT;", []string{"BEGIN", "ALTER TABLE t ADD c int", "COMMIT"}},
		{"unterminated string", "SELECT 'a; b", []string{"SELECT 'a; b"}},
		{"empty", " ; \n ", nil},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.want, Split(tt.query), tt.name)
	}
}

func TestMatchesTag(t *testing.T) {
	t.Parallel()
	yes := []struct{ stmt, tag string }{
		{"alter table if exists only t add c int", "ALTER TABLE"},
		{"CREATE UNIQUE INDEX CONCURRENTLY i ON t (c)", "CREATE INDEX"},
		{"create or replace view v as select 1", "CREATE VIEW"},
		{"CREATE TEMP TABLE x (a int)", "CREATE TABLE"},
		{"CREATE TABLE x AS SELECT 1", "CREATE TABLE AS"},
		{"SELECT 1 INTO x", "SELECT INTO"},
		{"CREATE CONSTRAINT TRIGGER t AFTER INSERT ON x FOR EACH ROW EXECUTE FUNCTION f()", "CREATE TRIGGER"},
		{"COMMENT ON TABLE t IS 'x'", "COMMENT"},
		{"ALTER TYPE mood ADD VALUE 'b'", "ALTER TYPE"},
		{"-- why\nDROP TABLE t", "DROP TABLE"},
		{"CREATE TABLE p1 PARTITION OF p FOR VALUES IN (1)", "CREATE TABLE"},
		{"CREATE OR REPLACE TRUSTED PROCEDURAL LANGUAGE x", "CREATE LANGUAGE"},
	}
	for _, c := range yes {
		assert.True(t, MatchesTag(c.stmt, c.tag), "%q is %s", c.stmt, c.tag)
	}
	no := []struct{ stmt, tag string }{
		{"INSERT INTO t VALUES (1)", "ALTER TABLE"},
		{"ALTER TABLE t ADD c int", "CREATE TABLE"},
		{"CREATE INDEX i ON t (c)", "CREATE TABLE"},
		{"DROP INDEX i", "DROP TABLE"},
		{"", "ALTER TABLE"},
		{"CREATE TABLE local (a int)", "CREATE TABLE AS AS"},
	}
	for _, c := range no {
		assert.False(t, MatchesTag(c.stmt, c.tag), "%q is not %s", c.stmt, c.tag)
	}
}

func TestWithoutConcurrently(t *testing.T) {
	t.Parallel()
	assert.Equal(t, "CREATE INDEX i ON t (c)", WithoutConcurrently("CREATE INDEX CONCURRENTLY i ON t (c)", "CREATE INDEX"))
	assert.Equal(t, "drop index if exists i", WithoutConcurrently("drop index concurrently if exists i", "DROP INDEX"))
	assert.Equal(t, "ALTER TABLE p DETACH PARTITION p1 ", WithoutConcurrently("ALTER TABLE p DETACH PARTITION p1 CONCURRENTLY", "ALTER TABLE"))
	assert.Equal(t, `CREATE INDEX "concurrently" ON t (c)`, WithoutConcurrently(`CREATE INDEX "concurrently" ON t (c)`, "CREATE INDEX"), "a quoted name stays")
	assert.Equal(t, "CREATE INDEX i ON t (concurrently(c))", WithoutConcurrently("CREATE INDEX i ON t (concurrently(c))", "CREATE INDEX"), "a function named concurrently stays")
	assert.Equal(t, "REINDEX TABLE /* c */ t", WithoutConcurrently("REINDEX TABLE /* c */ CONCURRENTLY t", "REINDEX"))
	assert.Equal(t, "CREATE INDEX -- x\n i ON t (c)", WithoutConcurrently("CREATE INDEX -- x\n CONCURRENTLY i ON t (c)", "CREATE INDEX"))
	assert.Equal(t, "REFRESH MATERIALIZED VIEW CONCURRENTLY v", WithoutConcurrently("REFRESH MATERIALIZED VIEW CONCURRENTLY v", "REFRESH MATERIALIZED VIEW"), "it runs in a transaction")
}

func TestNestedStatement(t *testing.T) {
	t.Parallel()
	_, nested, ok := NestedStatement("")
	assert.False(t, nested)
	assert.False(t, ok)

	stmt, nested, ok := NestedStatement("SQL statement \"CREATE TYPE mood AS ENUM ('a')\"\nPL/pgSQL function inline_code_block line 1 at SQL statement")
	assert.True(t, nested && ok)
	assert.Equal(t, "CREATE TYPE mood AS ENUM ('a')", stmt)

	multi := "CREATE TABLE \"x\"\"\" (\n  a text DEFAULT '\"\n'\n)"
	stmt, _, ok = NestedStatement("SQL statement \"" + multi + "\"\nPL/pgSQL function mk() line 2 at EXECUTE\nSQL statement \"SELECT mk()\"\nPL/pgSQL function inline_code_block line 1 at PERFORM")
	assert.True(t, ok)
	assert.Equal(t, multi, stmt, "the innermost statement, newlines and quotes in it included")

	stmt, _, ok = NestedStatement("SQL statement \"ALTER TABLE t ADD c int\"")
	assert.True(t, ok)
	assert.Equal(t, "ALTER TABLE t ADD c int", stmt)

	_, nested, ok = NestedStatement("SQL function \"f\" statement 1")
	assert.True(t, nested)
	assert.False(t, ok, "an SQL function's statement text is not in the stack")

	// A statement whose text holds a quote, a line break and a frame-like
	// line: two ends parse as one statement, so neither is taken.
	shifted := "SQL statement \"SELECT 1 --\"\nfunction FROM t\"\nPL/pgSQL function inline_code_block line 1 at SQL statement"
	_, nested, ok = NestedStatement(shifted)
	assert.True(t, nested)
	assert.False(t, ok, "two candidate ends parse")

	// Only one end parses: the other leaves a comment open.
	stmt, _, ok = NestedStatement("SQL statement \"DROP TABLE mal.t /*\"\nPL/pgSQL function f() line 1 at SQL statement\n*/\"\nPL/pgSQL function inline_code_block line 1 at SQL statement")
	assert.True(t, ok)
	assert.Equal(t, "DROP TABLE mal.t /*\"\nPL/pgSQL function f() line 1 at SQL statement\n*/", stmt)

	_, _, ok = NestedStatement("SQL statement \"SELECT 1; SELECT 2\"\nPL/pgSQL function f() line 1 at EXECUTE")
	assert.False(t, ok, "the text is not one statement")
}
