package siphon

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/siphondb/siphon/siphontest"
)

// TestExplainSearchPath: a name the target's own function did not find
// gets the advice, naming the function and nothing more of the context; a
// context that is no function's (a COPY's, which quotes the row) or another
// error is returned as it was.
func TestExplainSearchPath(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		code, where string
		advice      string // "" for none
	}{
		{pgerrcode.UndefinedTable, "PL/pgSQL function public.audit() line 2 at SQL statement\nCOPY orders, line 1: \"7\tsecret\"",
			"the target's own code (PL/pgSQL function public.audit() line 2 at SQL statement) did not find it"},
		{pgerrcode.UndefinedFunction, "SQL function \"check_amount\" statement 1", "the target's own code (SQL function \"check_amount\" statement 1)"},
		{pgerrcode.UndefinedFunction, "COPY orders, line 1, column note: \"secret\"", ""},
		{pgerrcode.UndefinedTable, "", ""},
		{pgerrcode.UniqueViolation, "PL/pgSQL function public.audit() line 2 at SQL statement", ""},
	} {
		cause := fmt.Errorf("copy rows into public.orders: %w", &pgconn.PgError{Code: c.code, Message: "relation \"audit_log\" does not exist", Where: c.where})
		got := explainSearchPath(cause)
		var pgErr *pgconn.PgError
		assert.True(t, errors.As(got, &pgErr), "the server's error stays in the chain")
		assert.NotContains(t, got.Error(), "secret", "no row of a COPY's context")
		if c.advice == "" {
			assert.Equal(t, cause, got, c.where)
			continue
		}
		assert.Contains(t, got.Error(), c.advice)
		assert.Contains(t, got.Error(), "search_path = pg_catalog, pg_temp")
	}
}

// TestSessionSearchPath: siphon's sessions, replication sessions included,
// run with search_path = pg_catalog, pg_temp, whatever the database sets,
// unless the DSN gives one (as a parameter in any case, or in its
// options), and with siphon's DateStyle whatever the DSN says.
func TestSessionSearchPath(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := siphontest.Start(t).NewDatabase(t)
	admin, err := Connect(ctx, dsn)
	require.NoError(t, err)
	defer admin.Close()
	_, err = admin.pool.Exec(ctx, "ALTER DATABASE "+quotedDatabase(t, admin)+" SET search_path = public, pg_catalog")
	require.NoError(t, err)
	for extra, want := range map[string]string{
		"":                                   "pg_catalog, pg_temp",
		"&search_path=public":                "public",
		"&options=-c%20search_path%3Dpublic": "public",
		"&options=--search_path%3Dpublic":    "public",
		"&SEARCH_PATH=public":                "public",
		"&DATESTYLE=German":                  "pg_catalog, pg_temp",
	} {
		c, err := Connect(ctx, dsn+extra)
		require.NoError(t, err)
		var got, dateStyle string
		require.NoError(t, c.pool.QueryRow(ctx, "SHOW search_path").Scan(&got))
		assert.Equal(t, want, got, "a session of %q", extra)
		require.NoError(t, c.pool.QueryRow(ctx, "SHOW DateStyle").Scan(&dateStyle))
		assert.Equal(t, "ISO, MDY", dateStyle, "a session of %q: siphon's DateStyle, in any spelling of the DSN's", extra)
		repl, err := c.newReplicationSession(ctx, nil)
		require.NoError(t, err)
		res, err := repl.Exec(ctx, "SHOW search_path").ReadAll()
		require.NoError(t, err)
		assert.Equal(t, want, string(res[0].Rows[0][0]), "a replication session of %q", extra)
		assert.NoError(t, closeSession(repl))
		c.Close()
	}
}

// quotedDatabase returns the quoted name of c's database.
func quotedDatabase(t *testing.T, c *Conn) string {
	t.Helper()
	var name string
	require.NoError(t, c.pool.QueryRow(context.Background(), "SELECT pg_catalog.quote_ident(pg_catalog.current_database())").Scan(&name))
	return name
}
