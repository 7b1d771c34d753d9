package sqltext

import (
	"fmt"
	"strings"

	pg "github.com/pganalyze/pg_query_go/v6"
)

// Statement is one statement of a query string, as the server's parser
// split it, with what siphon needs to know to replay it.
type Statement struct {
	// Text is exactly the bytes of the query string for the statement, from
	// its first token to its last: without the white space and comments
	// around it, nor its semicolon. Comments inside it stay.
	Text string
	// Tag is the command tag PostgreSQL gives it ("CREATE TABLE", "ALTER
	// VIEW", "SELECT INTO", "GRANT"...), as CreateCommandTag does; "???"
	// where the parse tree does not tell.
	Tag string
	// FiresDDLEvent: the server fires ddl_command_end for it (the event
	// trigger firing matrix). Not for commands that are not DDL, commands on
	// shared objects (databases, roles, tablespaces, and GRANT on them), nor
	// event trigger commands.
	FiresDDLEvent bool
	// Uncertain: whether it fires ddl_command_end, or how many times, cannot
	// be told for sure from its text (a command this package does not know,
	// one whose events depend on the server's release, CREATE EXTENSION and
	// the scripts it runs...).
	Uncertain bool
	// TransactionControl: BEGIN, START TRANSACTION, COMMIT, END, ROLLBACK,
	// SAVEPOINT, RELEASE, ROLLBACK TO, PREPARE TRANSACTION, COMMIT PREPARED,
	// ROLLBACK PREPARED.
	TransactionControl bool
	// RoleDependent: its meaning depends on the role that runs it: GRANT and
	// REVOKE, ALTER DEFAULT PRIVILEGES, DROP OWNED, REASSIGN OWNED, user
	// mappings, servers, foreign data wrappers, SECURITY LABEL, and any
	// CURRENT_USER, SESSION_USER or CURRENT_ROLE role specification.
	RoleDependent bool
	// Secret: it may carry secrets: user mappings, servers and foreign data
	// wrappers with options, subscriptions, roles given a password.
	Secret bool
}

// Statements splits query into its statements with PostgreSQL's own
// parser (PostgreSQL 17's grammar), and classifies each. Empty statements
// are left out.
//
// standardConformingStrings is the session's setting when the query ran.
// The parser reads strings with it on only, so with it off a query is
// refused with an error wrapping [ErrNonStandardStrings] unless the
// setting cannot change its meaning (no backslash in an ordinary string
// constant, no U&'...' constant). A query the grammar does not accept (not
// SQL, or syntax of a later release) returns a *[SyntaxError].
func Statements(query string, standardConformingStrings bool) ([]Statement, error) {
	tokens, err := scan(query)
	if err != nil {
		if !standardConformingStrings && strings.Contains(query, `\`) {
			return nil, fmt.Errorf("scan: %w (%w)", ErrNonStandardStrings, syntaxError(err))
		}
		return nil, fmt.Errorf("scan: %w", syntaxError(err))
	}
	if !standardConformingStrings {
		if err := standardStringsSuffice(query, tokens); err != nil {
			return nil, err
		}
	}
	tree, err := parse(query)
	if err != nil {
		return nil, fmt.Errorf("parse: %w", syntaxError(err))
	}
	var out []Statement
	for _, raw := range tree.GetStmts() {
		text, err := statementText(query, tokens, raw)
		if err != nil {
			return nil, err
		}
		st := classify(raw.GetStmt())
		st.Text = text
		out = append(out, st)
	}
	return out, nil
}

// syntaxError turns an error of the parser into a *SyntaxError.
func syntaxError(err error) error {
	if message, position, ok := parseError(err); ok {
		return &SyntaxError{Message: message, Position: position}
	}
	return &SyntaxError{Message: err.Error()}
}

// statementText returns the text of raw in query: from the first token
// that is not a comment at or after its location to the end of its last
// such token before its end (its semicolon, or the end of the query).
func statementText(query string, tokens []*pg.ScanToken, raw *pg.RawStmt) (string, error) {
	start, end := int(raw.GetStmtLocation()), int(raw.GetStmtLen())
	if end == 0 {
		end = len(query)
	} else {
		end += start
	}
	if start < 0 || end > len(query) || start > end {
		return "", fmt.Errorf("parse: statement at bytes %d-%d of a %d byte query", start, end, len(query))
	}
	first, last := -1, -1
	for i, tok := range tokens {
		at := int(tok.GetStart())
		if at < start || at >= end || isComment(tok) {
			continue
		}
		if first < 0 {
			first = i
		}
		last = i
	}
	if first < 0 {
		return "", fmt.Errorf("parse: no token in the statement at bytes %d-%d", start, end)
	}
	// Only white space lies between the last token and what follows it
	// (a comment, the semicolon, or the end): trimming it finds the token's end.
	stop := end
	if last+1 < len(tokens) && int(tokens[last+1].GetStart()) < stop {
		stop = int(tokens[last+1].GetStart())
	}
	return strings.TrimRight(query[tokens[first].GetStart():stop], pgSpace), nil
}

// pgSpace holds the bytes PostgreSQL's lexer reads as white space.
const pgSpace = " \t\n\r\f\v"

// isComment reports whether tok is a -- or /* */ comment.
func isComment(tok *pg.ScanToken) bool {
	return tok.GetToken() == pg.Token_SQL_COMMENT || tok.GetToken() == pg.Token_C_COMMENT
}

// standardStringsSuffice returns an error wrapping ErrNonStandardStrings
// unless query means the same with standard_conforming_strings off as on.
// Off, an ordinary '...' constant is read as E'...' is: the two readings
// differ only from a backslash inside one, and U&'...' is an error. The
// lexer reads the same tokens either way up to the first such constant, so
// a query whose ordinary constants (as read with it on) hold no backslash
// is read the same with it off.
func standardStringsSuffice(query string, tokens []*pg.ScanToken) error {
	for i, tok := range tokens {
		switch {
		case tok.GetToken() == pg.Token_USCONST:
			return fmt.Errorf("U&'' string constant at byte %d: %w", tok.GetStart()+1, ErrNonStandardStrings)
		case tok.GetToken() != pg.Token_SCONST || query[tok.GetStart()] != '\'':
			continue
		}
		// The constant and the white space after it, up to the next token:
		// it does not depend on where the lexer says the constant ends.
		stop := len(query)
		if i+1 < len(tokens) {
			stop = int(tokens[i+1].GetStart())
		}
		if strings.Contains(query[tok.GetStart():stop], `\`) {
			return fmt.Errorf("backslash in the string constant at byte %d: %w", tok.GetStart()+1, ErrNonStandardStrings)
		}
	}
	return nil
}
