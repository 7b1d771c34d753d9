//go:build cgo

package sqltext

import (
	"errors"

	pg "github.com/pganalyze/pg_query_go/v6"
	pgparser "github.com/pganalyze/pg_query_go/v6/parser"
)

// With cgo, the parser is libpg_query compiled natively (pg_query_go),
// which the parse tree's types come with anyway: it starts in
// milliseconds and needs no WebAssembly runtime. Without cgo,
// parse_nocgo.go runs the same parser as WebAssembly.

// parse returns the raw parse tree of query, as PostgreSQL 17's
// raw_parser builds it with standard_conforming_strings on.
func parse(query string) (*pg.ParseResult, error) { return pg.Parse(query) }

// scan returns the tokens of query, as PostgreSQL 17's lexer reads them
// with standard_conforming_strings on, comments included.
func scan(query string) ([]*pg.ScanToken, error) {
	res, err := pg.Scan(query)
	if err != nil {
		return nil, err
	}
	return res.GetTokens(), nil
}

// parseError reads the message and position of an error of the parser.
func parseError(err error) (message string, position int, ok bool) {
	var perr *pgparser.Error
	if errors.As(err, &perr) {
		return perr.Message, perr.Cursorpos, true
	}
	return "", 0, false
}
