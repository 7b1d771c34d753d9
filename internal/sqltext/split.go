// Package sqltext reads PostgreSQL statement text with PostgreSQL's own
// parser (PostgreSQL 17's, compiled to WebAssembly: no cgo): it splits a
// query string into its statements and tells what each does
// ([Statements]), reads a statement out of a PL/pgSQL call stack
// ([NestedStatement]), checks type names ([IsTypeName]) and quotes names
// and literals. Split and MatchesTag, on a hand lexer, remain for the
// callers that have not moved to Statements.
package sqltext

import "strings"

// Split returns the statements of a query string, as the server runs them
// one after another: split at the semicolons outside string constants,
// quoted identifiers, dollar-quoted strings, comments and the BEGIN ATOMIC
// bodies of CREATE FUNCTION and CREATE PROCEDURE. Each statement is
// trimmed of white space and of its semicolon; empty ones are left out.
func Split(query string) []string {
	var (
		out   []string
		start int
		lx    = lexer{src: query}
		words []string // the statement's first few keywords, upper case
		depth int      // BEGIN ... END nesting inside a routine body
	)
	for {
		tok, ok := lx.next()
		if !ok {
			break
		}
		switch tok.kind {
		case tokWord:
			w := strings.ToUpper(tok.text)
			if len(words) < 4 {
				words = append(words, w)
			}
			if definesRoutine(words) {
				switch {
				case w == "BEGIN":
					depth++
				case w == "CASE" && depth > 0:
					depth++
				case w == "END" && depth > 0:
					depth--
				}
			}
		case tokSemicolon:
			if depth > 0 {
				continue
			}
			if s := strings.TrimSpace(query[start:tok.start]); s != "" {
				out = append(out, s)
			}
			start, words = tok.start+1, words[:0]
		}
	}
	if s := strings.TrimSpace(query[start:]); s != "" {
		out = append(out, s)
	}
	return out
}

// definesRoutine reports whether a statement starting with words is a
// CREATE [OR REPLACE] FUNCTION or PROCEDURE, whose SQL-standard body
// (BEGIN ATOMIC ... END) holds semicolons of its own.
func definesRoutine(words []string) bool {
	if len(words) < 2 || words[0] != "CREATE" {
		return false
	}
	kind := words[1]
	if kind == "OR" && len(words) >= 4 && words[2] == "REPLACE" {
		kind = words[3]
	}
	return kind == "FUNCTION" || kind == "PROCEDURE"
}
