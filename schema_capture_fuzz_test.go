package siphon_test

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/siphondb/siphon"
	"github.com/siphondb/siphon/canonical"
	"github.com/siphondb/siphon/internal/sqltext"
	"github.com/siphondb/siphon/siphontest"
)

// A fragment of a generated query string: its SQL, and the statement the
// target must run for it ("" for none). Fragments that read differently
// under standard_conforming_strings off are marked.
type fuzzFragment struct {
	sql     func(s string, n int) string
	replay  func(s string, n int) []string
	setsSCS int  // 1: turns it on, -1: off
	offOnly bool // valid SQL only with standard_conforming_strings off
	control bool // transaction control that commits or uses savepoints
	fires   int  // statements that fire ddl_command_end and are not replayed
	opens   bool // opens a transaction block the query must commit at its end
	unicode bool // holds a U&'' string, an error with standard_conforming_strings off
	code    bool // runs code (DO), which may change standard_conforming_strings
}

// fuzzFragments are the pieces FuzzReplayStatements builds query strings
// from: comments and strings holding semicolons, dollar quotes, E”
// and U&” strings, a string that is a DROP under the other setting of
// standard_conforming_strings, BEGIN ATOMIC bodies, temporary objects,
// statements run by DO blocks (one of them made ambiguous by its data),
// grants, transaction control.
var fuzzFragments = []fuzzFragment{
	{sql: func(s string, n int) string { return fmt.Sprintf("CREATE TABLE %s.t%d (id int)", s, n) },
		replay: func(s string, n int) []string { return []string{fmt.Sprintf("CREATE TABLE %s.t%d (id int)", s, n)} }},
	{sql: func(s string, n int) string {
		return fmt.Sprintf("/* ; */ CREATE TABLE %s.d%d (v text DEFAULT $q$;$q$) /* ; */", s, n)
	},
		replay: func(s string, n int) []string {
			return []string{fmt.Sprintf("CREATE TABLE %s.d%d (v text DEFAULT $q$;$q$)", s, n)}
		}},
	{sql: func(s string, n int) string { return fmt.Sprintf("SELECT E'\\'; DROP TABLE %s.victim; --'", s) }},
	{sql: func(s string, n int) string { return fmt.Sprintf("SELECT '\\'; DROP TABLE %s.victim; --'", s) }, offOnly: true},
	{sql: func(s string, n int) string { return "SELECT 'a;b' AS \"c;d\"" }},
	{sql: func(s string, n int) string {
		return fmt.Sprintf("CREATE TEMP TABLE tmp%d (id int); DROP TABLE tmp%d", n, n)
	}, fires: 2},
	{sql: func(s string, n int) string {
		return fmt.Sprintf("DO $d$BEGIN EXECUTE 'CREATE TABLE %s.x%d (id int)'; END$d$", s, n)
	}, replay: func(s string, n int) []string { return []string{fmt.Sprintf("CREATE TABLE %s.x%d (id int)", s, n)} }, code: true},
	// Data quoted into an EXECUTE that makes the text before it read as
	// a statement of its own in the call stack: refused, never guessed.
	{sql: func(s string, n int) string {
		return fmt.Sprintf(`DO $d$BEGIN EXECUTE E'DELETE FROM %s.victim "\nPL/" WHERE false; CREATE TABLE %s.e%d (id int)'; END$d$`, s, s, n)
	}, replay: func(s string, n int) []string { return []string{"PROBLEM"} }, code: true},
	{sql: func(s string, n int) string {
		return fmt.Sprintf(`CREATE TABLE %s.u%d (v text DEFAULT U&'\0041;')`, s, n)
	}, replay: func(s string, n int) []string {
		return []string{fmt.Sprintf(`CREATE TABLE %s.u%d (v text DEFAULT U&'\0041;')`, s, n)}
	}, unicode: true},
	{sql: func(s string, n int) string { return fmt.Sprintf("GRANT SELECT ON %s.victim TO PUBLIC", s) },
		replay: func(s string, n int) []string { return []string{fmt.Sprintf("GRANT SELECT ON %s.victim TO PUBLIC", s)} }},
	{sql: func(s string, n int) string {
		return fmt.Sprintf("CREATE FUNCTION %s.f%d() RETURNS int LANGUAGE sql BEGIN ATOMIC SELECT 1 AS end; SELECT CASE WHEN true THEN 2 END; END", s, n)
	}, replay: func(s string, n int) []string {
		return []string{fmt.Sprintf("CREATE FUNCTION %s.f%d() RETURNS int LANGUAGE sql BEGIN ATOMIC SELECT 1 AS end; SELECT CASE WHEN true THEN 2 END; END", s, n)}
	}},
	{sql: func(s string, n int) string {
		return fmt.Sprintf("-- c;\nALTER TABLE %s.victim ADD COLUMN c%d int", s, n)
	},
		replay: func(s string, n int) []string {
			return []string{fmt.Sprintf("ALTER TABLE %s.victim ADD COLUMN c%d int", s, n)}
		}},
	{sql: func(s string, n int) string {
		return fmt.Sprintf("COMMENT ON TABLE %s.victim IS 'x; DROP TABLE %s.victim'", s, s)
	},
		replay: func(s string, n int) []string {
			return []string{fmt.Sprintf("COMMENT ON TABLE %s.victim IS 'x; DROP TABLE %s.victim'", s, s)}
		}},
	{sql: func(s string, n int) string { return "SET standard_conforming_strings = off" }, setsSCS: -1},
	{sql: func(s string, n int) string { return "SET standard_conforming_strings = on" }, setsSCS: 1},
	{sql: func(s string, n int) string { return "BEGIN; SAVEPOINT sp; RELEASE sp; COMMIT" }, control: true},
	{sql: func(s string, n int) string { return "BEGIN" }, opens: true},
}

// generatedQuery builds a query string from choice, to run in a session
// whose standard_conforming_strings is off when the first byte is odd (the
// server reads the whole string under that setting; a SET inside it
// changes only what runs after), and returns the statements the target
// must run for it in order, "PROBLEM" where siphon must refuse rather
// than guess.
func generatedQuery(choice []byte, schema string) (query string, startOff bool, want []string) {
	if len(choice) == 0 {
		return "", false, nil
	}
	startOff = choice[0]&1 == 1
	var parts []string
	scsOn, controlled, splitting, open := !startOff, false, false, false
	fired := 0                          // top-level statements so far that fire ddl_command_end
	switched, backslash := false, false // the query sets standard_conforming_strings; holds '\' in an ordinary string
	var nested []bool                   // want[i] ran inside a DO block: read from its call stack, not the query
	for i, b := range choice[1:] {
		if i == 6 {
			break
		}
		fr := fuzzFragments[int(b)%len(fuzzFragments)]
		if fr.offOnly && !startOff || fr.unicode && !scsOn {
			continue
		}
		parts = append(parts, fr.sql(schema, i))
		open = open && !fr.control || fr.opens
		switched, backslash = switched || fr.setsSCS != 0 || fr.code, backslash || fr.offOnly || fr.unicode
		if fr.control && fired > 0 {
			controlled = true
		}
		firesHere := fr.fires
		if fr.replay != nil {
			if !fr.code {
				firesHere++
			}
			for _, stmt := range fr.replay(schema, i) {
				if !scsOn {
					stmt = "PROBLEM"
				}
				want, nested = append(want, stmt), append(nested, fr.code)
			}
		}
		if controlled && firesHere > 0 {
			splitting = true
		}
		fired += firesHere
		switch fr.setsSCS {
		case 1:
			scsOn = true
		case -1:
			scsOn = false
		}
	}
	// A query whose schema changes transaction control splits (a commit
	// or savepoint between them) is refused whole, and so is one that may
	// switch the setting and reads otherwise under the other one; the
	// statements DO blocks ran are read from their call stacks, under the
	// setting they ran with.
	if splitting || switched && backslash {
		for i := range want {
			if !nested[i] {
				want[i] = "PROBLEM"
			}
		}
	}
	if open {
		parts = append(parts, "COMMIT") // after the last change: it splits nothing
	}
	return strings.Join(parts, "; "), startOff, want
}

// FuzzReplayStatements runs generated multi-statement query strings on a
// source with the schema capture and checks the statements the replay
// would run against two oracles. The server's own record of what it
// parsed and ran (pg_stat_statements, every statement as the server split
// it, nested ones included): each statement the replay would run is one
// of them, exactly. And the generator's: each is the statement of the
// query string that made the change, or a problem where the capture
// cannot be certain (standard_conforming_strings off, transaction control
// among several changes, a statement text a DO block's data makes
// ambiguous); never another statement. That the server read the query as
// the generator meant is checked too: the table a misread string would
// have dropped is still there.
func FuzzReplayStatements(f *testing.F) {
	for _, seed := range [][]byte{{0, 0}, {0, 1, 2, 8}, {1, 3, 0, 10, 7}, {1, 0, 9}, {0, 5, 0}, {0, 6, 4, 1}, {0, 11, 0, 7}, {1, 10, 3, 0}, {0, 9, 0, 10, 2, 1}, {0, 1, 12, 8}, {0, 12, 0, 11, 0}, {0, 6, 7, 8, 9}, {1, 6, 3, 0}, {0, 5, 15, 0}, {0, 7, 0}, {0, 16, 6, 0}} {
		f.Add(seed)
	}
	srv := siphontest.Start(f, siphontest.WithPrivateServer(),
		siphontest.WithSetting("shared_preload_libraries", "pg_stat_statements"), siphontest.WithSetting("pg_stat_statements.track", "all"))
	dsn := srv.NewDatabase(f)
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, dsn)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { admin.Close(context.Background()) })
	if _, err := admin.Exec(ctx, "CREATE EXTENSION pg_stat_statements"); err != nil {
		f.Fatal(err)
	}
	slot := fmt.Sprintf("fuzz_replay_%d", streamSlotSeq.Add(1))
	c, err := siphon.Connect(ctx, dsn, siphon.WithSlot(slot))
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() {
		c.Detach(context.Background())
		c.Close()
	})
	if err := c.InstallSchemaCapture(ctx); err != nil {
		f.Fatal(err)
	}
	pos, err := c.CurrentPosition(ctx)
	if err != nil {
		f.Fatal(err)
	}
	var inputs atomic.Int64
	f.Fuzz(func(t *testing.T, choice []byte) {
		schema := fmt.Sprintf("fz%d", inputs.Add(1))
		execSQL(t, admin, "CREATE SCHEMA "+schema, "CREATE TABLE "+schema+".victim (id int)")
		from := insertPosition(t, admin)
		query, startOff, want := generatedQuery(choice, schema)
		if query == "" {
			return
		}
		execSQL(t, admin, "SELECT pg_stat_statements_reset()")
		if startOff {
			execSQL(t, admin, "SET standard_conforming_strings = off")
		}
		if _, err := admin.Exec(ctx, query); err != nil {
			t.Fatalf("the generated query failed on the server: %v\n%s", err, query)
		}
		if status := admin.PgConn().TxStatus(); status != 'I' {
			t.Fatalf("the generated query left the session in a transaction (%c):\n%s", status, query)
		}
		execSQL(t, admin, "RESET standard_conforming_strings")
		var victim bool
		execSQLScan(t, admin, "SELECT to_regclass('"+schema+".victim') IS NOT NULL", &victim)
		if !victim {
			t.Fatalf("the server read the query otherwise than the generator meant:\n%s", query)
		}
		emitMarker(t, admin, schema)
		changes, end := streamUntil(t, c, max(pos, from), schema)
		pos = end
		var got []string
		for _, ch := range changes {
			if ch.Op != canonical.OpDDL || ch.Position < from {
				continue
			}
			if ch.DDL.Problem != "" {
				got = append(got, "PROBLEM")
			} else {
				got = append(got, ch.DDL.Statement)
			}
		}
		ran := serverStatements(t, admin)
		for _, stmt := range got {
			if stmt != "PROBLEM" && !ran[stmt] {
				t.Fatalf("query:\n%s\nthe replay would run a statement the server did not run:\n%s\nthe server ran:\n%s", query, stmt, strings.Join(slices.Sorted(maps.Keys(ran)), "\n"))
			}
		}
		if strings.Join(got, "\n") != strings.Join(want, "\n") {
			t.Fatalf("query:\n%s\nthe replay would run:\n%s\nthe generator expects:\n%s", query, strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
		execSQL(t, admin, "DROP SCHEMA "+schema+" CASCADE")
	})
}

// serverStatements returns the statements the server recorded as run in
// conn's database since pg_stat_statements was last reset, each as
// PostgreSQL's grammar reads it (without the comments around it, which
// releases record differently).
func serverStatements(t *testing.T, conn *pgx.Conn) map[string]bool {
	t.Helper()
	rows, err := conn.Query(context.Background(), `SELECT query FROM pg_stat_statements
		WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())`)
	if err != nil {
		t.Fatal(err)
	}
	texts, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	ran := map[string]bool{}
	for _, text := range texts {
		if stmts, err := sqltext.Statements(text, true); err == nil && len(stmts) == 1 {
			ran[stmts[0].Text] = true
		}
	}
	return ran
}

// execSQLScan runs a query returning one row into dest.
func execSQLScan(t *testing.T, conn *pgx.Conn, query string, dest ...any) {
	t.Helper()
	if err := conn.QueryRow(context.Background(), query).Scan(dest...); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
}
