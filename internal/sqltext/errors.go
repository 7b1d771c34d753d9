package sqltext

import (
	"errors"
	"fmt"
)

// ErrNonStandardStrings is wrapped by the error of [Statements] for a
// query that ran with standard_conforming_strings off and whose meaning
// would depend on it: a backslash in an ordinary '...' string constant,
// or a U&'...' constant. The parser reads strings only as the standard
// says; to replicate such a query, run it with
// standard_conforming_strings on (and E'...' for backslash escapes).
var ErrNonStandardStrings = errors.New("the query relies on standard_conforming_strings = off")

// SyntaxError is the error of [Statements] for a query PostgreSQL 17's
// grammar does not accept: text that is not SQL, or syntax of a later
// release.
type SyntaxError struct {
	Message  string // the parser's message, as the server words it
	Position int    // 1-based byte position of the error in the query; 0 if unknown
}

// Error returns the parser's message, with the position when known.
func (e *SyntaxError) Error() string {
	if e.Position > 0 {
		return fmt.Sprintf("syntax error at byte %d: %s", e.Position, e.Message)
	}
	return "syntax error: " + e.Message
}
