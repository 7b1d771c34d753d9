package sqltext

import "strings"

// NestedStatement reads the statement that ran inside a function or DO
// block out of a PL/pgSQL call stack (GET DIAGNOSTICS ... = PG_CONTEXT),
// given without the frame of the function that read it. The innermost
// frame comes first: `SQL statement "<text>"` for a statement PL/pgSQL
// ran (static SQL or EXECUTE), followed by the frame that ran it.
//
// The server prints the text as it is, so a statement holding `"`, a line
// break and a line that looks like a frame could end in more than one
// place. The text returned ends where exactly one candidate end gives
// text that parses (standard_conforming_strings on) as exactly one
// statement.
//
// nested is false for an empty stack: the statement ran at top level.
// ok is false when it is nested but its text cannot be told for sure: it
// is not in the stack (it ran in an SQL-language function, or through a
// procedural language that does not report it), or no candidate, or more
// than one, parses as one statement.
func NestedStatement(stack string) (stmt string, nested, ok bool) {
	stack = strings.TrimLeft(stack, "\n")
	if stack == "" {
		return "", false, false
	}
	const open = `SQL statement "`
	if !strings.HasPrefix(stack, open) {
		return "", true, false
	}
	text := stack[len(open):]
	found := 0
	for _, end := range candidateEnds(text) {
		if isOneStatement(text[:end]) {
			stmt, found = text[:end], found+1
		}
	}
	if found != 1 {
		return "", true, false
	}
	return stmt, true, true
}

// candidateEnds returns the offsets in text where the statement may end:
// each quote that ends a line followed by a call stack frame, and a quote
// that ends text.
func candidateEnds(text string) []int {
	var ends []int
	for i := 0; ; {
		j := strings.Index(text[i:], "\"\n")
		if j < 0 {
			break
		}
		end := i + j
		if frameStart(text[end+2:]) {
			ends = append(ends, end)
		}
		i = end + 1
	}
	if strings.HasSuffix(text, `"`) {
		ends = append(ends, len(text)-1)
	}
	return ends
}

// isOneStatement reports whether text parses as exactly one statement.
func isOneStatement(text string) bool {
	stmts, err := Statements(text, true)
	return err == nil && len(stmts) == 1
}

// frameStart reports whether s starts with a call stack frame as the
// server prints them.
func frameStart(s string) bool {
	for _, p := range []string{"PL/", "SQL function ", "SQL statement \"", "function ", "extension script "} {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}
