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
// (see schema_capture.go).
type capturedChange struct {
	Tag        string `json:"tag"`
	Query      string `json:"query"`
	Stack      string `json:"stack"`
	SearchPath string `json:"search_path"`
	Role       string `json:"role"`
	Objects    []struct {
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
	// tables, when WithTables names some, keeps the schema changes that
	// touch them; nil keeps every one.
	tables []canonical.TableName
	log    *slog.Logger
	// next holds, per query string of the open transaction, the index of
	// the statement after the last one a change was read from: a query
	// that runs several statements fires one event for each DDL among
	// them, in order.
	next map[string]int
}

func newSchemaChanges(tables []canonical.TableName, log *slog.Logger) *schemaChanges {
	return &schemaChanges{tables: tables, log: log, next: map[string]int{}}
}

// begin starts a transaction.
func (s *schemaChanges) begin() { clear(s.next) }

// changes returns the OpDDL changes an insert into the capture's table
// describes, at its place: none when it concerns no table of a WithTables
// stream.
func (s *schemaChanges) changes(ins *canonical.Change) ([]canonical.Change, error) {
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
	if !s.concerns(&row) {
		return nil, nil
	}
	d := &canonical.DDL{Tag: row.Tag, SearchPath: row.SearchPath, Role: row.Role}
	d.Statement, d.Problem = s.statement(&row)
	for _, o := range row.Objects {
		if o.Identity != "" {
			d.Objects = append(d.Objects, canonical.DDLObject{Type: o.Type, Identity: o.Identity, Dropped: o.Dropped})
		}
	}
	out := []canonical.Change{ddlChange(ins, d)}
	for _, stmt := range row.Statements {
		out = append(out, ddlChange(ins, &canonical.DDL{Tag: "ALTER TABLE", Statement: stmt, SearchPath: row.SearchPath, Role: row.Role}))
	}
	return out, nil
}

// ddlChange is an OpDDL change in the transaction of ins.
func ddlChange(ins *canonical.Change, d *canonical.DDL) canonical.Change {
	return canonical.Change{Op: canonical.OpDDL, Position: ins.Position, XID: ins.XID, CommitTime: ins.CommitTime, DDL: d}
}

// statement finds the statement the target runs for row: the one that ran
// inside a function or DO block, as its call stack shows, or the one of
// the query string the event was for. problem says why there is none.
func (s *schemaChanges) statement(row *capturedChange) (stmt, problem string) {
	if row.Error != "" {
		return row.Query, "the schema capture failed on the source: " + row.Error
	}
	stack, ok := strings.CutPrefix(row.Stack, captureFrame)
	if !ok {
		return row.Query, "the schema capture recorded a call stack siphon does not know: " + row.Stack
	}
	_, inner, _ := strings.Cut(stack, "\n")
	nested, isNested, found := sqltext.NestedStatement(inner)
	switch {
	case isNested && !found:
		return row.Query, fmt.Sprintf("the %s ran inside a function whose statements the server does not report (an SQL-language function?)", row.Tag)
	case isNested:
		return sqltext.WithoutConcurrently(nested, row.Tag), ""
	}
	stmts := sqltext.Split(row.Query)
	from := s.next[row.Query]
	for i := range stmts {
		j := (from + i) % len(stmts)
		if sqltext.MatchesTag(stmts[j], row.Tag) {
			s.next[row.Query] = j + 1
			return sqltext.WithoutConcurrently(stmts[j], row.Tag), ""
		}
	}
	if len(stmts) == 1 {
		return sqltext.WithoutConcurrently(stmts[0], row.Tag), ""
	}
	return row.Query, fmt.Sprintf("siphon cannot tell which statement of the query is the %s", row.Tag)
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
