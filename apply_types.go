package siphon

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/siphondb/siphon/internal/sqltext"
	"github.com/siphondb/siphon/pgdump"
)

// Type names from a stream reach SQL only after two checks: isTypeName,
// with PostgreSQL's own grammar on the text alone, and the target's own
// catalog (targetTypeName).

// maxTypeName bounds a type name's length: format_type never prints one
// near it.
const maxTypeName = 1024

// isTypeName reports whether s is exactly a type name as format_type
// prints it (sqltext.IsTypeName: it parses as the type of a cast of NULL
// and as nothing else). It does not tell that s names a type: the target
// does (targetTypeName).
func isTypeName(s string) bool {
	return s != "" && len(s) <= maxTypeName && strings.TrimSpace(s) == s && sqltext.IsTypeName(s)
}

// targetTypeName asks the target whether typ, which isTypeName accepted,
// names a type, passing it as a parameter: to_regtype parses it with the
// server's own grammar as exactly one type name. It returns the text to
// put in a column definition: from PostgreSQL 17 on, format_type's
// printing of the type and its modifier (to_regtypemod); before, typ
// itself. ok is false when the target knows no such type or cannot parse
// typ as one.
func targetTypeName(ctx context.Context, pg *pgconn.PgConn, typ string) (name string, ok bool, err error) {
	query := `SELECT CASE WHEN pg_catalog.to_regtype($1) IS NOT NULL THEN $1 END`
	if v, _ := pgdump.ParseVersion(pg.ParameterStatus("server_version")); v.Major >= 17 {
		query = `SELECT pg_catalog.format_type(pg_catalog.to_regtype($1), pg_catalog.to_regtypemod($1))`
	}
	res := pg.ExecParams(ctx, query, [][]byte{[]byte(typ)}, nil, nil, nil).Read()
	var pgErr *pgconn.PgError
	switch {
	case res.Err != nil && errors.As(res.Err, &pgErr):
		return "", false, nil // a syntax error: not a type name
	case res.Err != nil:
		return "", false, fmt.Errorf("check type %q on the target: %w", typ, res.Err)
	case len(res.Rows) != 1 || res.Rows[0][0] == nil:
		return "", false, nil
	}
	name = string(res.Rows[0][0])
	return name, isTypeName(name), nil
}

// shorten cuts s to at most n bytes (at a character boundary), marking the
// cut, for messages.
func shorten(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}
