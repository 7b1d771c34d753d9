package sqltext

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

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

	// An EXECUTE of two statements whose first holds a quoted alias of a
	// line break and "PL/": the text before the alias is one statement,
	// the whole text two; both parse, so neither is taken (taking the
	// first replayed a DELETE the source never ran for the second's
	// event).
	_, nested, ok = NestedStatement("SQL statement \"DELETE FROM public.accounts\"\nPL/\" WHERE false; CREATE TABLE public.b (id int)\"\nPL/pgSQL function inline_code_block line 1 at EXECUTE")
	assert.True(t, nested)
	assert.False(t, ok, "a shorter text that parses inside a longer one that parses")
}
