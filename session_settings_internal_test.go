package siphon

import (
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
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
			"the target's own code (PL/pgSQL function public.audit() line 2 at SQL statement) names it without its schema"},
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
