package siphon

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"strings"

	"github.com/siphondb/siphon/canonical"
	"github.com/siphondb/siphon/internal/sqltext"
)

// capturedChange is a row the capture writes to siphon.schema_changes
// (see schema_capture_sql.go).
type capturedChange struct {
	Tag string `json:"tag"`
	// Query is the query string the event was for (current_query()); it
	// is left out when it may carry a secret (Redacted).
	Query    string `json:"query"`
	Redacted bool   `json:"redacted"`
	Stack    string `json:"stack"`
	// Caller is what siphon.capture_caller read as the caller: nil when
	// it could not.
	Caller *struct {
		Role                      string   `json:"role"`
		Schemas                   []string `json:"schemas"`
		StandardConformingStrings string   `json:"standard_conforming_strings"`
	} `json:"caller"`
	SessionRole string `json:"session_role"`
	Superuser   bool   `json:"superuser"`
	Installer   string `json:"installer"`
	// Backend and Started (statement_timestamp()) tell the executions of a
	// query string apart: its events are counted per execution.
	Backend int    `json:"backend"`
	Started string `json:"started"`
	// Skip says why the target has nothing to replay for this event (its
	// objects are temporary, an extension's or siphon's, it dropped
	// nothing, it is a publication's): it is counted, not replayed.
	Skip    string `json:"skip"`
	Objects []struct {
		Type     string    `json:"type"`
		Identity string    `json:"identity"`
		Table    [2]string `json:"table"`
		Dropped  bool      `json:"dropped"`
	} `json:"objects"`
	Publication []struct {
		Publication string    `json:"publication"`
		Table       [2]string `json:"table"`
		Action      string    `json:"action"`
	} `json:"publication"`
	// Statements are the ones the capture ran itself (REPLICA IDENTITY
	// FULL for KeylessFull), replayed after the statement.
	Statements       []string `json:"statements"`
	PublicationError string   `json:"publication_error"`
	// Error is set when the capture failed.
	Error string `json:"error"`
}

// captureFrame starts the call stack line of the capture's own trigger
// function, the first of every stack it records.
const captureFrame = "PL/pgSQL function siphon.capture_event() "

// schemaChanges turns the rows the capture inserts into OpDDL changes,
// for one stream.
type schemaChanges struct {
	// ignore leaves every row of the capture's table out
	// (WithoutSchemaCapture).
	ignore bool
	// tables, when WithTables names some, keeps the schema changes that
	// touch them; nil keeps every one.
	tables []canonical.TableName
	log    *slog.Logger
	// events counts, per execution of a query string in the open
	// transaction (backend, statement start, query), the top-level events
	// read so far: the k-th event of an execution is its k-th statement
	// that fires one.
	events map[string]int
}

func newSchemaChanges(ignore bool, tables []canonical.TableName, log *slog.Logger) *schemaChanges {
	return &schemaChanges{ignore: ignore, tables: tables, log: log, events: map[string]int{}}
}

// begin starts a transaction.
func (s *schemaChanges) begin() { clear(s.events) }

// changes returns the OpDDL changes an insert into the capture's table
// describes, at its place: none for an event with nothing to replay, or
// one that concerns no table of a WithTables stream. A row of a relation
// that only looks like the capture's table is one change with a problem
// and no statement: a forgery is never run, nor passed off as data.
func (s *schemaChanges) changes(ins *canonical.Change) ([]canonical.Change, error) {
	switch {
	case s.ignore:
		return nil, nil
	case ins.Table == forgedCaptureName:
		return []canonical.Change{ddlChange(ins, &canonical.DDL{Tag: "UNKNOWN", Problem: "a row written to a table named " + captureTable +
			" that is not the one the schema capture installed (another role made it, or the capture was removed since): nothing vouches for it, so siphon carries no statement of it; " +
			"find who created schema siphon on the source"})}, nil
	}
	v, ok := ins.Value("change")
	text, present := v.Text()
	if !ok || !present {
		return nil, fmt.Errorf("a row of %s without its change", captureTable)
	}
	var row capturedChange
	if err := json.Unmarshal([]byte(text), &row); err != nil {
		return nil, fmt.Errorf("a row of %s: %w", captureTable, err)
	}
	s.logPublication(&row)
	stmt, problem := s.statement(&row) // counts the event, skipped or not
	if row.Skip != "" && row.Error == "" || !s.concerns(&row) {
		return nil, nil
	}
	d := &canonical.DDL{Tag: row.Tag, Statement: stmt, Problem: problem,
		SessionRole: row.SessionRole, Superuser: row.Superuser, Installer: row.Installer}
	if row.Caller != nil {
		d.Role, d.SearchPath = row.Caller.Role, quotedSchemas(row.Caller.Schemas)
	}
	for _, o := range row.Objects {
		if o.Identity != "" {
			d.Objects = append(d.Objects, canonical.DDLObject{Type: o.Type, Identity: o.Identity, Dropped: o.Dropped})
		}
	}
	out := []canonical.Change{ddlChange(ins, d)}
	if problem != "" {
		return out, nil
	}
	for _, stmt := range row.Statements {
		own := *d
		own.Tag, own.Statement, own.Objects = "ALTER TABLE", stmt, nil
		out = append(out, ddlChange(ins, &own))
	}
	return out, nil
}

// quotedSchemas writes schemas as a search_path.
func quotedSchemas(schemas []string) string {
	quoted := make([]string, len(schemas))
	for i, s := range schemas {
		quoted[i] = sqltext.Ident(s)
	}
	return strings.Join(quoted, ", ")
}

// ddlChange is an OpDDL change in the transaction of ins.
func ddlChange(ins *canonical.Change, d *canonical.DDL) canonical.Change {
	return canonical.Change{Op: canonical.OpDDL, Position: ins.Position, XID: ins.XID, CommitTime: ins.CommitTime, DDL: d}
}

// statement finds the statement the target runs for row, with
// PostgreSQL's own parser: the one that ran inside a function or DO block,
// as its call stack shows, or the statement of the query string whose
// turn it is (the k-th event of an execution comes from its k-th
// statement that fires one). problem says why there is none: siphon never
// guesses. stmt is then the query for information, or empty when it may
// carry a secret.
func (s *schemaChanges) statement(row *capturedChange) (stmt, problem string) {
	stack, ok := strings.CutPrefix(row.Stack, captureFrame)
	_, inner, _ := strings.Cut(stack, "\n")
	nested, isNested, found := sqltext.NestedStatement(inner)
	if ok && !isNested && row.Error == "" {
		defer func() { s.events[s.executionKey(row)]++ }()
	}
	switch {
	case row.Error != "":
		return "", "the schema capture failed on the source: " + row.Error
	case row.Skip != "":
		return "", ""
	case row.Redacted:
		return "", fmt.Sprintf("the query that ran the %s may carry a secret (the OPTIONS of a user mapping or server, a subscription's connection string), so siphon did not carry it", row.Tag)
	case !ok:
		return secretFree(row.Query, row), "the schema capture recorded a call stack siphon does not know"
	case row.Caller == nil:
		return secretFree(row.Query, row), "the schema capture could not record who ran the statement and under which search_path"
	case row.Caller.StandardConformingStrings != "on":
		return secretFree(row.Query, row), "the statement ran with standard_conforming_strings off, where siphon cannot be sure of its boundaries; set it on for migrations"
	case isNested && !found:
		return secretFree(row.Query, row), fmt.Sprintf("the %s ran inside a function whose statement siphon cannot read with certainty from the call stack (an SQL-language function, or a statement text that could end in two places)", row.Tag)
	case isNested:
		return s.single(nested, row)
	}
	stmts, err := sqltext.Statements(row.Query, true)
	if err != nil {
		return secretFree(row.Query, row), fmt.Sprintf("PostgreSQL's parser (as siphon embeds it) could not read the query of the %s: %v", row.Tag, err)
	}
	if len(stmts) > 1 && mayChangeStrings(row.Query, stmts) {
		// The server read the whole query string under the setting it had
		// when the query arrived, which a statement of it may have changed
		// before this event: only a reading that does not depend on it is
		// certain.
		if _, err := sqltext.Statements(row.Query, false); err != nil {
			return secretFree(row.Query, row), fmt.Sprintf("the query of the %s may change standard_conforming_strings and reads otherwise under each setting, where siphon cannot be sure of its boundaries; run such migrations one statement per query, or without backslashes in ordinary strings", row.Tag)
		}
	}
	if len(stmts) == 1 {
		return s.single(stmts[0].Text, row)
	}
	var firing []sqltext.Statement
	splitting := false // transaction control that ends or undoes a transaction before a later schema change
	for _, st := range stmts {
		switch {
		case st.Uncertain:
			return secretFree(row.Query, row), fmt.Sprintf("siphon cannot tell which statement of the query is the %s: it does not know whether %q fires event triggers", row.Tag, st.Tag)
		case st.TransactionControl && st.Tag != "BEGIN" && st.Tag != "START TRANSACTION" && len(firing) > 0:
			splitting = true
		case st.FiresDDLEvent:
			if splitting {
				return secretFree(row.Query, row), fmt.Sprintf("the %s ran in a query string that commits, rolls back or uses savepoints between its schema changes: siphon cannot tell them apart with certainty; run such migrations one transaction per query", row.Tag)
			}
			firing = append(firing, st)
		}
	}
	k := s.events[s.executionKey(row)]
	if k >= len(firing) || firing[k].Tag != row.Tag {
		return secretFree(row.Query, row), fmt.Sprintf("siphon cannot tell which statement of the query is the %s (event %d of the query string)", row.Tag, k+1)
	}
	return s.single(firing[k].Text, row)
}

// single checks that text is one statement (as the server's parser
// reads it) that may travel, and returns it as the target runs it.
func (s *schemaChanges) single(text string, row *capturedChange) (stmt, problem string) {
	stmts, err := sqltext.Statements(text, true)
	switch {
	case err != nil:
		return secretFree(text, row), fmt.Sprintf("PostgreSQL's parser (as siphon embeds it) could not read the %s: %v", row.Tag, err)
	case len(stmts) != 1:
		return secretFree(text, row), fmt.Sprintf("the text siphon read for the %s holds %d statements", row.Tag, len(stmts))
	case stmts[0].Secret:
		return "", fmt.Sprintf("the %s may carry a secret (OPTIONS of a user mapping or server, a password, a connection string), so siphon did not carry it", row.Tag)
	case stmts[0].Tag != row.Tag:
		// The event names the statement that fired it: text read as
		// another statement is not the one that ran.
		return secretFree(text, row), fmt.Sprintf("the text siphon read for the %s is a %s", row.Tag, stmts[0].Tag)
	}
	return sqltext.WithoutConcurrently(stmts[0].Text, row.Tag), ""
}

// mayChangeStrings reports whether a statement of query may change
// standard_conforming_strings for the statements after it: one that names
// it, resets every setting, or runs code (DO, CALL).
func mayChangeStrings(query string, stmts []sqltext.Statement) bool {
	q := strings.ToLower(query)
	if strings.Contains(q, "standard_conforming_strings") || strings.Contains(q, "reset all") || strings.Contains(q, "set_config") {
		return true
	}
	return slices.ContainsFunc(stmts, func(st sqltext.Statement) bool { return st.Tag == "DO" || st.Tag == "CALL" })
}

// executionKey names one execution of row's query string.
func (s *schemaChanges) executionKey(row *capturedChange) string {
	return fmt.Sprintf("%d\x00%s\x00%s", row.Backend, row.Started, row.Query)
}

// secretFree returns text, of row's query, to show with a problem, or a
// placeholder when its statements may carry a secret, or cannot be read
// with certainty under the setting of standard_conforming_strings the
// query ran with (under both, when the capture could not record it).
func secretFree(text string, row *capturedChange) string {
	settings := []bool{true, false}
	if row.Caller != nil {
		settings = []bool{row.Caller.StandardConformingStrings == "on"}
	}
	for _, standard := range settings {
		stmts, err := sqltext.Statements(text, standard)
		if err != nil {
			return "(not shown: siphon could not check it for secrets)"
		}
		for _, st := range stmts {
			if st.Secret {
				return "(not shown: it may carry a secret)"
			}
		}
	}
	return text
}

// concerns reports whether a stream keeps row: every stream does, but a
// WithTables stream keeps only the changes of its tables.
func (s *schemaChanges) concerns(row *capturedChange) bool {
	if len(s.tables) == 0 {
		return true
	}
	for _, o := range row.Objects {
		if o.Table[1] != "" && slices.Contains(s.tables, canonical.TableName{Schema: o.Table[0], Name: o.Table[1]}) {
			return true
		}
		if o.Dropped && o.Type == "table" && slices.ContainsFunc(s.tables, func(t canonical.TableName) bool { return o.Identity == objectIdentity(t) }) {
			return true
		}
	}
	return false
}

// logPublication says what the capture did to the publications.
func (s *schemaChanges) logPublication(row *capturedChange) {
	for _, p := range row.Publication {
		table := canonical.TableName{Schema: p.Table[0], Name: p.Table[1]}
		switch p.Action {
		case "added":
			s.log.Info("a table created on the source joined the publication", "publication", p.Publication, "table", table)
		case "removed":
			s.log.Warn("a published table lost its usable replica identity and left the publication (WithKeylessTables): its changes are no longer captured; give it a primary key, then run SyncPublication",
				"publication", p.Publication, "table", table)
		case "held":
			s.log.Warn("a table the publication holds by its definition (FOR ALL TABLES or TABLES IN SCHEMA) has no usable replica identity: "+
				"its UPDATE and DELETE fail on the source until it has one (a primary key, or REPLICA IDENTITY FULL)",
				"publication", p.Publication, "table", table)
		default:
			s.log.Warn("a table without a usable replica identity is captured for its inserts only (WithKeylessTables)", "publication", p.Publication, "table", table)
		}
	}
	if row.PublicationError != "" {
		s.log.Warn("the schema capture could not keep the publications in line; Preflight and the next stream start report what differs",
			"tag", row.Tag, "err", row.PublicationError)
	}
}

// objectIdentity is a table's identity as PostgreSQL prints it in event
// trigger functions: each name quoted only when it must be.
func objectIdentity(t canonical.TableName) string {
	return identityPart(t.Schema) + "." + identityPart(t.Name)
}

func identityPart(name string) string {
	plain := name != "" && (name[0] < '0' || name[0] > '9')
	for _, r := range name {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '_') {
			plain = false
		}
	}
	if plain {
		return name
	}
	return sqltext.Ident(name)
}
