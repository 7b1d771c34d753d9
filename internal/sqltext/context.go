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
// place; whoever chose the text (the data a function quotes into an
// EXECUTE, say) chose where. The statement that ran parses (the server
// ran it), so its end is a candidate whose text parses: the text is
// returned only when exactly one candidate end gives text that parses at
// all (standard_conforming_strings on), and that text is one statement. A
// shorter text that parses, inside a longer one that parses too (one
// statement, or several), is ambiguous.
//
// nested is false for an empty stack: the statement ran at top level.
// ok is false when it is nested but its text cannot be told for sure: it
// is not in the stack (it ran in an SQL-language function, or through a
// procedural language that does not report it), more than one or no
// candidate end parses, or the text is not one statement.
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
	parsing, statements := 0, 0
	for _, end := range candidateEnds(text) {
		if stmts, err := Statements(text[:end], true); err == nil {
			stmt, parsing, statements = text[:end], parsing+1, len(stmts)
		}
	}
	if parsing != 1 || statements != 1 {
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
