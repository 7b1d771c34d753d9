package siphon_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/siphondb/siphon"
	"github.com/siphondb/siphon/canonical"
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
	fires   int  // statements that fire ddl_command_end (replayed or not)
	opens   bool // opens a transaction block the query must commit at its end
}

// fuzzFragments are the pieces FuzzReplayStatements builds query strings
// from: comments and strings holding semicolons, dollar quotes, E”
// strings, a string that is a DROP under the other setting of
// standard_conforming_strings, BEGIN ATOMIC bodies, temporary objects,
// transaction control.
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
	}},
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
	fired := 0                          // statements so far that fire ddl_command_end
	switched, backslash := false, false // the query sets standard_conforming_strings; holds '\' in an ordinary string
	for i, b := range choice[1:] {
		if i == 6 {
			break
		}
		fr := fuzzFragments[int(b)%len(fuzzFragments)]
		if fr.offOnly && !startOff {
			continue
		}
		parts = append(parts, fr.sql(schema, i))
		open = open && !fr.control || fr.opens
		switched, backslash = switched || fr.setsSCS != 0, backslash || fr.offOnly
		if fr.control && fired > 0 {
			controlled = true
		}
		firesHere := fr.fires
		if fr.replay != nil {
			firesHere++
			for _, stmt := range fr.replay(schema, i) {
				if !scsOn {
					stmt = "PROBLEM"
				}
				want = append(want, stmt)
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
	// switch the setting and reads otherwise under the other one.
	if splitting || switched && backslash {
		for i := range want {
			want[i] = "PROBLEM"
		}
	}
	if open {
		parts = append(parts, "COMMIT") // after the last change: it splits nothing
	}
	return strings.Join(parts, "; "), startOff, want
}

// FuzzReplayStatements runs generated multi-statement query strings on a
// source with the schema capture and compares the statements the replay
// would run with those the server ran: each is exactly the statement of
// the query string that made the change, or a problem where the capture
// cannot be certain (standard_conforming_strings off, transaction control
// among several changes); never another statement. That the server read
// the query as the generator meant is checked too: the table a misread
// string would have dropped is still there.
func FuzzReplayStatements(f *testing.F) {
	for _, seed := range [][]byte{{0, 0}, {0, 1, 2, 8}, {1, 3, 0, 10, 7}, {1, 0, 9}, {0, 5, 0}, {0, 6, 4, 1}, {0, 11, 0, 7}, {1, 10, 3, 0}, {0, 9, 0, 10, 2, 1}, {0, 1, 12, 8}, {0, 12, 0, 11, 0}} {
		f.Add(seed)
	}
	srv := siphontest.Start(f)
	dsn := srv.NewDatabase(f)
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, dsn)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { admin.Close(context.Background()) })
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
		if strings.Join(got, "\n") != strings.Join(want, "\n") {
			t.Fatalf("query:\n%s\nthe replay would run:\n%s\nthe server ran:\n%s", query, strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
		execSQL(t, admin, "DROP SCHEMA "+schema+" CASCADE")
	})
}

// execSQLScan runs a query returning one row into dest.
func execSQLScan(t *testing.T, conn *pgx.Conn, query string, dest ...any) {
	t.Helper()
	if err := conn.QueryRow(context.Background(), query).Scan(dest...); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
}
