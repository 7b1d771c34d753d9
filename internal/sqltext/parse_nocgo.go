//go:build !cgo

package sqltext

import (
	"errors"
	"sync"

	pg "github.com/pganalyze/pg_query_go/v6"
	pgquery "github.com/wasilibs/go-pgquery"
	pgparser "github.com/wasilibs/go-pgquery/parser"
)

// Without cgo, the parser is PostgreSQL's compiled to WebAssembly
// (go-pgquery, run by wazero): no C toolchain needed, at the cost of a
// few seconds and some 250 MB to compile the module on first use. With
// cgo, parse_cgo.go uses the same parser compiled natively.

// parserMu serialises the calls into the parser. go-pgquery compiles a
// fresh WebAssembly instance (seconds of CPU and tens of megabytes) for
// every call that finds its pool empty; one at a time, there is only ever
// one, and a parse takes well under a millisecond.
var parserMu sync.Mutex

// parse returns the raw parse tree of query, as PostgreSQL 17's
// raw_parser builds it with standard_conforming_strings on.
func parse(query string) (*pg.ParseResult, error) {
	parserMu.Lock()
	defer parserMu.Unlock()
	return pgquery.Parse(query)
}

// scan returns the tokens of query, as PostgreSQL 17's lexer reads them
// with standard_conforming_strings on, comments included.
func scan(query string) ([]*pg.ScanToken, error) {
	parserMu.Lock()
	defer parserMu.Unlock()
	res, err := pgquery.Scan(query)
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
