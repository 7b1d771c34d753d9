package pgerr

import (
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5/pgconn"
)

func TestMatching(t *testing.T) {
	wrapped := fmt.Errorf("create slot: %w", &pgconn.PgError{Code: pgerrcode.ObjectInUse, Message: "in use"})
	cases := []struct {
		name          string
		err           error
		code          string
		in, interrupt bool
	}{
		{"wrapped", wrapped, pgerrcode.ObjectInUse, true, false},
		{"joined", errors.Join(io.EOF, wrapped), pgerrcode.ObjectInUse, true, false},
		{"not a server error", io.EOF, "", false, false},
		{"nil", nil, "", false, false},
		{"terminated", &pgconn.PgError{Code: pgerrcode.AdminShutdown}, pgerrcode.AdminShutdown, false, true},
		{"connection", &pgconn.PgError{Code: pgerrcode.ConnectionFailure}, pgerrcode.ConnectionFailure, false, true},
		{"too many", &pgconn.PgError{Code: pgerrcode.TooManyConnections}, pgerrcode.TooManyConnections, false, true},
	}
	for _, c := range cases {
		if got := Code(c.err); got != c.code {
			t.Errorf("%s: Code = %q, want %q", c.name, got, c.code)
		}
		if got := Is(c.err, pgerrcode.UniqueViolation, pgerrcode.ObjectInUse); got != c.in {
			t.Errorf("%s: Is = %v, want %v", c.name, got, c.in)
		}
		if got := IsInterruption(c.err); got != c.interrupt {
			t.Errorf("%s: IsInterruption = %v, want %v", c.name, got, c.interrupt)
		}
	}
	if got := Message(wrapped); got != "in use" {
		t.Errorf("Message = %q", got)
	}
}
