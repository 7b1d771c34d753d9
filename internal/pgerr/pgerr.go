// Package pgerr tells PostgreSQL errors apart by their SQLSTATE (the codes
// are github.com/jackc/pgerrcode's constants).
package pgerr

import (
	"errors"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5/pgconn"
)

// Code returns the SQLSTATE err carries, anywhere in its chain, or "" when
// it carries none.
func Code(err error) string {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return ""
	}
	return pgErr.Code
}

// Is reports whether err carries one of codes.
func Is(err error, codes ...string) bool {
	code := Code(err)
	if code == "" {
		return false
	}
	for _, c := range codes {
		if code == c {
			return true
		}
	}
	return false
}

// Message returns the server's message of the error err carries, or ""
// when it carries none.
func Message(err error) string {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return ""
	}
	return pgErr.Message
}

// IsInterruption reports whether err's SQLSTATE says the session was
// interrupted rather than the statement refused: operator intervention
// (a shutdown, a terminated backend), a connection exception, or too many
// connections. A new session may succeed.
func IsInterruption(err error) bool {
	code := Code(err)
	return code != "" && (pgerrcode.IsOperatorIntervention(code) || pgerrcode.IsConnectionException(code) ||
		code == pgerrcode.TooManyConnections)
}
