package sqltext

import (
	"strings"

	"github.com/jackc/pgx/v5"
)

// Ident quotes a SQL identifier, always (so that a name that is a keyword,
// or has capitals, stays itself).
func Ident(name string) string { return pgx.Identifier{name}.Sanitize() }

// Name quotes a qualified name, each part as an identifier: Name("public",
// "order") is "public"."order".
func Name(parts ...string) string { return pgx.Identifier(parts).Sanitize() }

// Literal quotes s as a SQL string literal. One holding a backslash is
// written as an escape string (E'...'), which means the same whatever
// standard_conforming_strings is.
func Literal(s string) string {
	quoted := strings.ReplaceAll(s, "'", "''")
	if !strings.Contains(s, `\`) {
		return "'" + quoted + "'"
	}
	return "E'" + strings.ReplaceAll(quoted, `\`, `\\`) + "'"
}
