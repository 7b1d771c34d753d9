package sqltext

import "strings"

// NestedStatement reads the statement that ran inside a function or DO
// block out of a PL/pgSQL call stack (GET DIAGNOSTICS ... = PG_CONTEXT),
// given without the frame of the function that read it. The innermost
// frame comes first: `SQL statement "<text>"` for a statement PL/pgSQL
// ran (static SQL or EXECUTE), followed by the frame that ran it.
//
// nested is false for an empty stack: the statement ran at top level.
// ok is false when it is nested but its text is not in the stack (it ran
// in an SQL-language function, or through a procedural language that
// does not report it).
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
	// The statement ends at the quote that ends its line and is followed by
	// the frame that ran it, or by nothing.
	for i := 0; ; {
		j := strings.Index(text[i:], "\"\n")
		if j < 0 {
			break
		}
		end := i + j
		if frameStart(text[end+2:]) {
			return text[:end], true, true
		}
		i = end + 1
	}
	if strings.HasSuffix(text, `"`) {
		return text[:len(text)-1], true, true
	}
	return "", true, false
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
