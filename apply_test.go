package siphon_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/siphondb/siphon"
	"github.com/siphondb/siphon/canonical"
)

// applyTarget returns a fresh target database: its DSN, an admin session
// and a siphon.Conn on it.
func applyTarget(t *testing.T, ddl ...string) (string, *pgx.Conn, *siphon.Conn) {
	t.Helper()
	dsn, admin := newDatabase(t)
	execSQL(t, admin, ddl...)
	c, err := siphon.Connect(context.Background(), dsn)
	require.NoError(t, err)
	t.Cleanup(func() {
		c.Close()
		assertNoLeaks(t, dsn)
	})
	return dsn, admin, c
}

// canonicalRow turns raw text values into a canonical.Row.
func canonicalRow(raw []*string) canonical.Row {
	row := make(canonical.Row, len(raw))
	for i, s := range raw {
		if s != nil {
			row[i] = canonical.Text(*s)
		}
	}
	return row
}

// streamBuilder writes a canonical stream by hand, with made-up but
// well-ordered positions.
type streamBuilder struct {
	t    *testing.T
	buf  bytes.Buffer
	enc  *canonical.Encoder
	pos  canonical.Position
	xid  uint32
	ends []canonical.Position // the end of each transaction written
}

const testSystemID = "7300000000000000001"

func newStream(t *testing.T, kind canonical.Kind, start canonical.Position, slot string, tables ...canonical.Table) *streamBuilder {
	t.Helper()
	return newStreamFrom(t, testSystemID, kind, start, slot, tables...)
}

// newStreamFrom starts a stream from the source with the given system
// identifier.
func newStreamFrom(t *testing.T, systemID string, kind canonical.Kind, start canonical.Position, slot string, tables ...canonical.Table) *streamBuilder {
	t.Helper()
	s := &streamBuilder{t: t, pos: start, xid: 700}
	s.enc = canonical.NewEncoder(&s.buf)
	require.NoError(t, s.enc.WriteHeader(canonical.Header{
		Kind: kind, Engine: canonical.EnginePostgres, Start: start, SystemID: systemID, Slot: slot,
		Created: time.Date(2026, 11, 30, 5, 0, 0, 0, time.UTC),
	}))
	for i := range tables {
		require.NoError(t, s.enc.WriteTable(&tables[i]))
	}
	return s
}

// tx writes one transaction holding changes (Position, XID and commit time
// filled in) and returns its end Position.
func (s *streamBuilder) tx(changes ...canonical.Change) canonical.Position {
	s.t.Helper()
	s.xid++
	commit, at := s.pos+0x100, time.Date(2026, 11, 30, 5, 0, int(s.xid%60), 0, time.UTC)
	end := commit + 0x38
	write := func(ch canonical.Change) {
		ch.Position, ch.XID, ch.CommitTime = commit, s.xid, at
		require.NoError(s.t, s.enc.WriteChange(&ch))
	}
	write(canonical.Change{Op: canonical.OpBegin})
	for _, ch := range changes {
		write(ch)
	}
	ch := canonical.Change{Op: canonical.OpCommit, Position: end, XID: s.xid, CommitTime: at}
	require.NoError(s.t, s.enc.WriteChange(&ch))
	s.pos = end
	s.ends = append(s.ends, end)
	return end
}

// row writes a snapshot row.
func (s *streamBuilder) row(table canonical.TableName, values ...canonical.Value) {
	s.t.Helper()
	require.NoError(s.t, s.enc.WriteRow(table, values))
}

// bytes writes the end record and returns the stream.
func (s *streamBuilder) bytes(end canonical.Position) []byte {
	s.t.Helper()
	require.NoError(s.t, s.enc.WriteEnd(end))
	return s.buf.Bytes()
}

func (s *streamBuilder) done() []byte { return s.bytes(s.pos) }

// Shorthands for values and changes.
func tv(s string) canonical.Value { return canonical.Text(s) }

var (
	null  = canonical.Null()
	unchg = canonical.Unchanged()
)

// keyRow returns an old row of n columns holding only the key values
// given by column index, as the source sends under the default identity.
func keyRow(n int, key map[int]string) canonical.Row {
	row := make(canonical.Row, n)
	for i, v := range key {
		row[i] = tv(v)
	}
	return row
}

func ins(table canonical.TableName, values ...canonical.Value) canonical.Change {
	return canonical.Change{Op: canonical.OpInsert, Schema: table.Schema, Table: table.Name, New: values}
}

func upd(table canonical.TableName, old canonical.Row, values ...canonical.Value) canonical.Change {
	return canonical.Change{Op: canonical.OpUpdate, Schema: table.Schema, Table: table.Name, New: values, Old: old}
}

func del(table canonical.TableName, old ...canonical.Value) canonical.Change {
	return canonical.Change{Op: canonical.OpDelete, Schema: table.Schema, Table: table.Name, Old: old}
}

func truncate(restart bool, tables ...canonical.TableName) canonical.Change {
	return canonical.Change{Op: canonical.OpTruncate, Truncated: tables, RestartIdentity: restart}
}

// inspect describes the database's tables as the source would.
func inspect(t *testing.T, c *siphon.Conn) *canonical.Schema {
	t.Helper()
	schema, err := c.InspectSchema(context.Background())
	require.NoError(t, err)
	return schema
}

func tableOf(t *testing.T, schema *canonical.Schema, name canonical.TableName) canonical.Table {
	t.Helper()
	tb := schema.Table(name.Schema, name.Name)
	require.NotNil(t, tb, name.String())
	return *tb
}

func consume(t *testing.T, c *siphon.Conn, stream []byte) error {
	t.Helper()
	return c.ConsumeCanonical(context.Background(), bytes.NewReader(stream))
}

func appliedPosition(t *testing.T, c *siphon.Conn) canonical.Position {
	t.Helper()
	pos, err := c.AppliedPosition(context.Background())
	require.NoError(t, err)
	return pos
}

// everyTypeDDL is a table with a column of each type class of DESIGN.md,
// in a schema and with names that need quoting.
var everyTypeDDL = []string{
	`CREATE SCHEMA "Odd ""Schema"" ü"`,
	`CREATE TYPE "Odd ""Schema"" ü"."Mood ☺" AS ENUM ('sad', 'ok', 'happy')`,
	`CREATE DOMAIN "Odd ""Schema"" ü".posint AS int CHECK (VALUE > 0)`,
	`CREATE TYPE "Odd ""Schema"" ü".pair AS (a int, b text)`,
	`CREATE TABLE "Odd ""Schema"" ü"."Every Type ""T""" (
		"Id" bigint PRIMARY KEY, "num val" numeric, i8 int8, f8 float8, f4 real,
		ts timestamptz, tsn timestamp, d date, tm time, iv interval, ba bytea, u uuid,
		j json, jb jsonb, arr int[], tarr text[], r int4range, tr tstzrange,
		m "Odd ""Schema"" ü"."Mood ☺", dom "Odd ""Schema"" ü".posint, comp "Odd ""Schema"" ü".pair,
		ip inet, net cidr, mac macaddr, cash money, b bit(4), vb varbit, tsv tsvector, pt point,
		x xml, "select" text, "Ünï ""q""" text)`,
}

var everyTypeName = canonical.TableName{Schema: `Odd "Schema" ü`, Name: `Every Type "T"`}

// everyTypeRows inserts rows of every type (odd values included) into the
// reference database and returns them as canonical rows.
func everyTypeRows(t *testing.T, ref *pgx.Conn) []canonical.Row {
	t.Helper()
	execSQL(t, ref, `INSERT INTO "Odd ""Schema"" ü"."Every Type ""T""" VALUES
		(1, 'NaN', 9007199254740993, 'NaN', '-0', '2026-11-30 05:00:00.123456+02', 'infinity', '-infinity', '24:00:00',
		 '1 year 2 mons -3 days 04:05:06.789', '\x00ff5c0a', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11',
		 '{"b": 1,  "a": [1.0, 2.50]}', '{"b": 1, "a": [1.0, 2.50]}', '{{1,NULL},{3,4}}', '{"a\tb","c\\d","","NULL",NULL}',
		 '[1,10)', '[2026-01-01 00:00:00+00,infinity)', 'happy', 7, ROW(1, 'x "y"'), '10.1.2.3/8', '10.0.0.0/8',
		 '08:00:2b:01:02:03', '-12.34', '1010', '10101', 'a:1 fat:2 cat:3', '(1.5,-2)', '<a>b</a>',
		 E'tab\there\nnew line\\back\rcr', ''),
		(2, '123456789012345678901234567890.000000001', -9223372036854775808, 'Infinity', '1.17549435e-38',
		 'infinity', '2026-02-28 23:59:59.999999', '4713-01-01 BC', '00:00:00', '-178000000 years', '\x',
		 '00000000-0000-0000-0000-000000000000', '[]', '{}', '{}', '{}', 'empty', '(,)', 'sad', 1, ROW(NULL, NULL),
		 '::1', '::/0', 'ff:ff:ff:ff:ff:ff', '92233720368547758.07', '0000', '', '', '(0,0)', '', 'select', 'ünï'),
		(3, '-Infinity', 0, '-Infinity', 'Infinity', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 'null', NULL,
		 NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)`)
	var rows []canonical.Row
	for _, raw := range rawRows(t, ref, `SELECT * FROM "Odd ""Schema"" ü"."Every Type ""T""" ORDER BY "Id"`) {
		rows = append(rows, canonicalRow(raw))
	}
	return rows
}

// TestConsumeCanonicalEveryTypeAndOp applies a hand-built stream with every
// op and a column of every type class to a fresh target and checks the
// result against a reference database where the same changes were made
// with SQL: values round-trip exactly, identifiers of any shape work.
func TestConsumeCanonicalEveryTypeAndOp(t *testing.T) {
	t.Parallel()
	refDSN, _ := newDatabase(t)
	ref := siphonSession(t, refDSN)
	execSQL(t, ref, everyTypeDDL...)
	rows := everyTypeRows(t, ref)
	_, target, c := applyTarget(t, everyTypeDDL...)
	tb := tableOf(t, inspect(t, c), everyTypeName)

	// The reference takes the same changes: an update with a column left
	// unchanged, a delete, a key that moves.
	execSQL(t, ref, `UPDATE "Odd ""Schema"" ü"."Every Type ""T""" SET "select" = 'updated' WHERE "Id" = 2`,
		`DELETE FROM "Odd ""Schema"" ü"."Every Type ""T""" WHERE "Id" = 3`,
		`UPDATE "Odd ""Schema"" ü"."Every Type ""T""" SET "Id" = 10 WHERE "Id" = 1`)
	updated := append(canonical.Row(nil), rows[1]...)
	updated[30] = tv("updated")
	for i := range updated {
		if i != 0 && i != 30 {
			updated[i] = unchg
		}
	}
	moved := append(canonical.Row(nil), rows[0]...)
	moved[0] = tv("10")

	s := newStream(t, canonical.KindIncremental, 0x1000000, "every_type", tb)
	s.tx(ins(everyTypeName, rows[0]...), ins(everyTypeName, rows[1]...), ins(everyTypeName, rows[2]...))
	s.tx(upd(everyTypeName, nil, updated...), del(everyTypeName, keyRow(len(tb.Columns), map[int]string{0: "3"})...))
	s.tx(upd(everyTypeName, keyRow(len(tb.Columns), map[int]string{0: "1"}), moved...))
	last := s.tx(ins(everyTypeName, rows[1]...)) // insert of an existing key: an upsert, a no-op here
	execSQL(t, ref, `UPDATE "Odd ""Schema"" ü"."Every Type ""T""" SET "select" = 'select' WHERE "Id" = 2`)
	require.NoError(t, consume(t, c, s.done()))

	table := `"Odd ""Schema"" ü"."Every Type ""T"""`
	assert.Equal(t, digest(t, ref, table), digest(t, target, table))
	assert.Equal(t, last, appliedPosition(t, c))
}

// ledgerDDL is the schema of the ledger streams: a keyed table, a keyless
// one (REPLICA IDENTITY FULL, duplicates allowed) and a one-row table that
// says which transaction was applied last.
var ledgerDDL = []string{
	`CREATE TABLE items (id int PRIMARY KEY, tx int NOT NULL, note text)`,
	`CREATE TABLE events (tx int, payload json, at point)`,
	`ALTER TABLE events REPLICA IDENTITY FULL`,
	`CREATE TABLE last (one bool PRIMARY KEY, tx int)`,
}

var (
	itemsName  = canonical.TableName{Schema: "public", Name: "items"}
	eventsName = canonical.TableName{Schema: "public", Name: "events"}
	lastName   = canonical.TableName{Schema: "public", Name: "last"}
)

// ledgerStream builds a stream of n transactions. Transaction k sets
// last.tx to k, inserts items (100 of them in every fifth transaction, so
// that runs are copied), inserts two identical events, updates one of the
// previous transaction's events (so duplicates must stay duplicates) and
// deletes an item of an earlier transaction.
func ledgerStream(t *testing.T, c *siphon.Conn, start canonical.Position, n int) *streamBuilder {
	t.Helper()
	schema := inspect(t, c)
	s := newStream(t, canonical.KindIncremental, start, "ledger",
		tableOf(t, schema, itemsName), tableOf(t, schema, eventsName), tableOf(t, schema, lastName))
	id := 0
	for k := 1; k <= n; k++ {
		var changes []canonical.Change
		if k == 1 {
			changes = append(changes, ins(lastName, tv("t"), tv("1")))
		} else {
			changes = append(changes, upd(lastName, nil, tv("t"), tv(fmt.Sprint(k))))
		}
		items := 3
		if k%5 == 0 {
			items = 100
		}
		for range items {
			id++
			changes = append(changes, ins(itemsName, tv(fmt.Sprint(id)), tv(fmt.Sprint(k)), tv(fmt.Sprintf("item\t%d\n\\", id))))
		}
		ev := canonical.Row{tv(fmt.Sprint(k)), tv(`{"k": ` + fmt.Sprint(k) + `,  "x": 1.50}`), tv("(1.5,-0)")}
		changes = append(changes, ins(eventsName, ev...), ins(eventsName, ev...))
		if k > 1 {
			old := canonical.Row{tv(fmt.Sprint(k - 1)), tv(`{"k": ` + fmt.Sprint(k-1) + `,  "x": 1.50}`), tv("(1.5,-0)")}
			changes = append(changes, upd(eventsName, old, tv(fmt.Sprint(-(k-1))), old[1], old[2]))
			changes = append(changes, del(itemsName, tv(fmt.Sprint(id-items-1)), null, null))
		}
		s.tx(changes...)
	}
	return s
}

// ledgerState checks the ledger invariant in the target: the data is
// exactly that of transactions 1..k, where k is last.tx, and the applied
// Position is the end of transaction k. It returns k.
func ledgerState(t *testing.T, conn *pgx.Conn, c *siphon.Conn, ends []canonical.Position) int {
	t.Helper()
	var k int
	err := conn.QueryRow(context.Background(), "SELECT coalesce((SELECT tx FROM last), 0)").Scan(&k)
	require.NoError(t, err)
	want := canonical.Position(0)
	if k > 0 {
		want = ends[k-1]
	}
	require.Equal(t, want, appliedPosition(t, c), "the applied position is that of the last transaction applied")
	var maxTx, events, updated int
	require.NoError(t, conn.QueryRow(context.Background(), `SELECT coalesce(max(tx), 0) FROM items`).Scan(&maxTx))
	require.NoError(t, conn.QueryRow(context.Background(), `SELECT count(*), count(*) FILTER (WHERE tx < 0) FROM events`).Scan(&events, &updated))
	assert.Equal(t, k, maxTx, "items of transactions 1..k only")
	assert.Equal(t, 2*k, events, "two events per transaction")
	assert.Equal(t, max(k-1, 0), updated, "one event of each pair updated, the other left")
	return k
}

func TestConsumeCanonicalTwiceGivesTheSameTarget(t *testing.T) {
	t.Parallel()
	_, target, c := applyTarget(t, ledgerDDL...)
	s := ledgerStream(t, c, 0x2000000, 40)
	stream := s.done()

	require.NoError(t, consume(t, c, stream))
	assert.Equal(t, 40, ledgerState(t, target, c, s.ends))
	before := digest(t, target, "items") + digest(t, target, "events")

	require.NoError(t, consume(t, c, stream), "the same stream again")
	assert.Equal(t, 40, ledgerState(t, target, c, s.ends))
	assert.Equal(t, before, digest(t, target, "items")+digest(t, target, "events"), "nothing applied twice")
}

// TestConsumeCanonicalCutStream consumes ever longer prefixes of a stream,
// cut anywhere (mid-line, mid-transaction, inside a run of copied
// inserts): each leaves the target at its last complete transaction with
// that Position; the whole stream then completes it, identical to a target
// that took the stream in one go.
func TestConsumeCanonicalCutStream(t *testing.T) {
	t.Parallel()
	_, whole, wholeConn := applyTarget(t, ledgerDDL...)
	_, target, c := applyTarget(t, ledgerDDL...)
	s := ledgerStream(t, c, 0x2000000, 40)
	stream := s.done()
	require.NoError(t, consume(t, wholeConn, stream))

	// The first cut falls inside the run of 100 inserts of transaction 5,
	// after the first 64: while its COPY streams.
	insideCopy := bytes.Index(stream, []byte(`"new":["100","5"`)) + 10
	require.Greater(t, insideCopy, 10)
	applied := 0
	for _, cut := range []int{insideCopy, len(stream) / 7, len(stream)/3 + 17, len(stream) / 2, len(stream) - 10} {
		err := consume(t, c, stream[:cut])
		require.ErrorIs(t, err, canonical.ErrTruncated)
		k := ledgerState(t, target, c, s.ends)
		assert.GreaterOrEqual(t, k, applied, "progress is kept")
		applied = k
	}
	assert.Greater(t, applied, 30)
	require.NoError(t, consume(t, c, stream))
	assert.Equal(t, 40, ledgerState(t, target, c, s.ends))
	for _, table := range []string{"items", "events", "last"} {
		assert.Equal(t, digest(t, whole, table), digest(t, target, table), table)
	}
}

// cancelAfter is a reader that cancels a context once n bytes were read.
type cancelAfter struct {
	r      io.Reader
	n      int
	cancel context.CancelFunc
}

func (c *cancelAfter) Read(p []byte) (int, error) {
	if len(p) > 512 {
		p = p[:512]
	}
	n, err := c.r.Read(p)
	if c.n -= n; c.n <= 0 {
		c.cancel()
	}
	return n, err
}

func TestConsumeCanonicalCancelled(t *testing.T) {
	t.Parallel()
	_, target, c := applyTarget(t, ledgerDDL...)
	s := ledgerStream(t, c, 0x2000000, 30)
	stream := s.done()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	err := c.ConsumeCanonical(ctx, &cancelAfter{r: bytes.NewReader(stream), n: len(stream) / 2, cancel: cancel})
	require.ErrorIs(t, err, context.Canceled)
	k := ledgerState(t, target, c, s.ends)
	assert.Less(t, k, 30)

	require.NoError(t, consume(t, c, stream))
	assert.Equal(t, 30, ledgerState(t, target, c, s.ends))
}

func TestConsumeCanonicalSnapshot(t *testing.T) {
	t.Parallel()
	refDSN, _ := newDatabase(t)
	ref := siphonSession(t, refDSN)
	execSQL(t, ref, everyTypeDDL...)
	execSQL(t, ref, ledgerDDL...)
	rows := everyTypeRows(t, ref)
	execSQL(t, ref, `INSERT INTO events VALUES (1, '{"a":  1}', '(1,2)'), (1, '{"a":  1}', '(1,2)'), (NULL, NULL, NULL)`)
	_, target, c := applyTarget(t, append(append([]string{}, everyTypeDDL...), ledgerDDL...)...)
	schema := inspect(t, c)

	const at = canonical.Position(0x3000000)
	s := newStream(t, canonical.KindSnapshot, at, "snap", tableOf(t, schema, everyTypeName), tableOf(t, schema, eventsName))
	for _, row := range rows {
		s.row(everyTypeName, row...)
	}
	for _, raw := range rawRows(t, ref, "SELECT * FROM events") {
		s.row(eventsName, canonicalRow(raw)...)
	}
	snapshot := s.bytes(at)

	// A snapshot cut short loads nothing.
	require.ErrorIs(t, consume(t, c, snapshot[:len(snapshot)-40]), canonical.ErrTruncated)
	assert.Equal(t, "empty", digest(t, target, "events"))
	assert.Zero(t, appliedPosition(t, c))

	require.NoError(t, consume(t, c, snapshot))
	table := `"Odd ""Schema"" ü"."Every Type ""T"""`
	assert.Equal(t, digest(t, ref, table), digest(t, target, table))
	assert.Equal(t, digest(t, ref, "events"), digest(t, target, "events"))
	assert.Equal(t, at, appliedPosition(t, c))

	require.NoError(t, consume(t, c, snapshot), "applied already: skipped, no duplicate key")
	assert.Equal(t, digest(t, ref, "events"), digest(t, target, "events"))

	// Changes continue from the snapshot's Position; a stream that starts
	// past it would leave a gap.
	next := newStream(t, canonical.KindIncremental, at, "snap", tableOf(t, schema, eventsName))
	end := next.tx(del(eventsName, tv("1"), tv(`{"a":  1}`), tv("(1,2)")))
	require.NoError(t, consume(t, c, next.done()))
	assert.Equal(t, end, appliedPosition(t, c))
	assert.Equal(t, "2 rows", digest(t, target, "events")[:6], "one of the two duplicates deleted")

	gap := newStream(t, canonical.KindIncremental, end+0x1000, "snap", tableOf(t, schema, eventsName))
	gap.tx(del(eventsName, tv("1"), tv(`{"a":  1}`), tv("(1,2)")))
	var gapErr *siphon.ApplyGapError
	require.ErrorAs(t, consume(t, c, gap.done()), &gapErr)
	assert.Equal(t, end, gapErr.Applied)
	assert.Equal(t, end+0x1000, gapErr.Start)
	assert.Equal(t, "2 rows", digest(t, target, "events")[:6], "nothing applied")
}

// TestConsumeCanonicalSchemaMismatch gives a target whose tables differ
// from the source's: a typed error naming the table and column, and a
// target left as it was.
func TestConsumeCanonicalSchemaMismatch(t *testing.T) {
	t.Parallel()
	_, _, sourceConn := applyTarget(t, ledgerDDL...)
	s := ledgerStream(t, sourceConn, 0x2000000, 3)
	stream := s.done()

	cases := []struct {
		name   string
		ddl    []string
		table  string
		column string
	}{
		{"missing table", []string{ledgerDDL[0], ledgerDDL[1], ledgerDDL[2]}, "last", ""},
		{"renamed column", []string{`CREATE TABLE items (id int PRIMARY KEY, tx int NOT NULL, memo text)`, ledgerDDL[1], ledgerDDL[2], ledgerDDL[3]}, "items", "note"},
		{"other type", []string{`CREATE TABLE items (id int PRIMARY KEY, tx bigint NOT NULL, note text)`, ledgerDDL[1], ledgerDDL[2], ledgerDDL[3]}, "items", "tx"},
		{"required column", []string{`CREATE TABLE items (id int PRIMARY KEY, tx int NOT NULL, note text, extra int NOT NULL)`, ledgerDDL[1], ledgerDDL[2], ledgerDDL[3]}, "items", "extra"},
		{"other key", []string{`CREATE TABLE items (id int, tx int NOT NULL, note text, PRIMARY KEY (tx, id))`, ledgerDDL[1], ledgerDDL[2], ledgerDDL[3]}, "items", "tx"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, target, c := applyTarget(t, tc.ddl...)
			execSQL(t, target, `INSERT INTO events VALUES (0, '{}', '(0,0)')`)
			before := digest(t, target, "events")

			err := consume(t, c, stream)
			var schemaErr *siphon.SchemaIncompatibleError
			require.ErrorAs(t, err, &schemaErr)
			assert.Equal(t, canonical.TableName{Schema: "public", Name: tc.table}, schemaErr.Table)
			assert.Equal(t, tc.column, schemaErr.Column)
			assert.NotEmpty(t, schemaErr.Problem)
			assert.Equal(t, before, digest(t, target, "events"), "the target is unchanged")
			assert.Zero(t, appliedPosition(t, c))
		})
	}
}

// TestConsumeCanonicalMismatchMidStream meets a table the target lacks in
// the third transaction of a stream: the two before it are applied and
// recorded, the third rolled back; once the target has the table,
// consuming the stream again completes it.
func TestConsumeCanonicalMismatchMidStream(t *testing.T) {
	t.Parallel()
	_, target, c := applyTarget(t, ledgerDDL[0], `CREATE TABLE "later ""one""" (id int PRIMARY KEY)`)
	schema := inspect(t, c)
	later := canonical.TableName{Schema: "public", Name: `later "one"`}
	s := newStream(t, canonical.KindIncremental, 0x4000000, "mid", tableOf(t, schema, itemsName), tableOf(t, schema, later))
	s.tx(ins(itemsName, tv("1"), tv("1"), null))
	second := s.tx(ins(itemsName, tv("2"), tv("2"), null))
	s.tx(ins(itemsName, tv("3"), tv("3"), null), ins(later, tv("1")))
	last := s.tx(ins(itemsName, tv("4"), tv("4"), null))
	stream := s.done()
	execSQL(t, target, `DROP TABLE "later ""one"""`)

	var schemaErr *siphon.SchemaIncompatibleError
	require.ErrorAs(t, consume(t, c, stream), &schemaErr)
	assert.Equal(t, later, schemaErr.Table)
	assert.Equal(t, second, appliedPosition(t, c))
	assert.Equal(t, [][]*string{{ptr("1")}, {ptr("2")}}, rawRows(t, target, "SELECT id FROM items ORDER BY id"))

	execSQL(t, target, `CREATE TABLE "later ""one""" (id int PRIMARY KEY)`)
	require.NoError(t, consume(t, c, stream))
	assert.Equal(t, last, appliedPosition(t, c))
	assert.Len(t, rawRows(t, target, "SELECT id FROM items"), 4)
}

func ptr(s string) *string { return &s }

// TestApplyChange applies changes one at a time: inserts are upserts
// (idempotent), unchanged TOAST columns keep their values, a keyless table
// is matched on all old values one row at a time, truncate empties.
func TestApplyChange(t *testing.T) {
	t.Parallel()
	_, target, c := applyTarget(t, ledgerDDL...)
	ctx := context.Background()
	schema := inspect(t, c)
	items, events := tableOf(t, schema, itemsName), tableOf(t, schema, eventsName)
	apply := func(table canonical.Table, ch canonical.Change) {
		t.Helper()
		ch.Columns = table.Columns
		require.NoError(t, c.ApplyChange(ctx, ch))
	}
	big := strings.Repeat("large TOASTed value ", 1000)

	for range 2 {
		apply(items, ins(itemsName, tv("1"), tv("1"), tv(big)))
	}
	apply(items, ins(itemsName, tv("2"), tv("1"), tv("x")))
	apply(items, upd(itemsName, nil, tv("1"), tv("5"), unchg))
	apply(items, upd(itemsName, keyRow(3, map[int]string{0: "2"}), tv("3"), tv("6"), tv("")))
	apply(items, del(itemsName, tv("9"), null, null)) // no such row: no error
	assert.Equal(t, [][]*string{{ptr("1"), ptr("5"), ptr(big)}, {ptr("3"), ptr("6"), ptr("")}},
		rawRows(t, target, "SELECT * FROM items ORDER BY id"))

	ev := canonical.Row{tv("1"), tv(`{"a":  1}`), tv("(1,-0)")}
	for range 3 {
		apply(events, ins(eventsName, ev...))
	}
	apply(events, upd(eventsName, ev, tv("2"), unchg, ev[2]))
	apply(events, del(eventsName, ev...))
	apply(events, del(eventsName, tv("1"), tv(`{"a": 1}`), tv("(1,-0)"))) // json differs in its text: no match
	assert.Equal(t, [][]*string{{ptr("1"), ptr(`{"a":  1}`), ptr("(1,-0)")}, {ptr("2"), ptr(`{"a":  1}`), ptr("(1,-0)")}},
		rawRows(t, target, "SELECT * FROM events ORDER BY tx"))

	require.NoError(t, c.ApplyChange(ctx, truncate(false, itemsName, eventsName)))
	assert.Equal(t, "empty", digest(t, target, "items"))
	assert.Equal(t, "empty", digest(t, target, "events"))
	for _, op := range []canonical.Op{canonical.OpBegin, canonical.OpCommit, canonical.OpMessage} {
		assert.NoError(t, c.ApplyChange(ctx, canonical.Change{Op: op}))
	}
}

func TestApplyChangeSchemaErrors(t *testing.T) {
	t.Parallel()
	_, target, c := applyTarget(t, ledgerDDL...)
	ctx := context.Background()
	items := tableOf(t, inspect(t, c), itemsName)
	cols := func(extra ...canonical.Column) []canonical.Column {
		return append(append([]canonical.Column(nil), items.Columns...), extra...)
	}
	cases := []struct {
		name   string
		ch     canonical.Change
		table  string
		column string
	}{
		{"missing table", canonical.Change{Op: canonical.OpInsert, Schema: "public", Table: "nope", Columns: items.Columns, New: canonical.Row{tv("1"), tv("1"), null}}, "nope", ""},
		{"missing column", canonical.Change{Op: canonical.OpInsert, Schema: "public", Table: "items",
			Columns: cols(canonical.Column{Name: `New "Col"`, Type: "text"}), New: canonical.Row{tv("1"), tv("1"), null, tv("x")}}, "items", `New "Col"`},
		{"key not sent", canonical.Change{Op: canonical.OpDelete, Schema: "public", Table: "items", Columns: items.Columns,
			Old: canonical.Row{null, tv("1"), null}}, "items", "id"},
		{"truncate of a missing table", truncate(false, itemsName, canonical.TableName{Schema: "public", Name: "nope"}), "nope", ""},
	}
	for _, tc := range cases {
		err := c.ApplyChange(ctx, tc.ch)
		var schemaErr *siphon.SchemaIncompatibleError
		require.ErrorAs(t, err, &schemaErr, tc.name)
		assert.Equal(t, tc.table, schemaErr.Table.Name, tc.name)
		assert.Equal(t, tc.column, schemaErr.Column, tc.name)
	}

	// A table created after its first use is found.
	execSQL(t, target, `CREATE TABLE nope (id int PRIMARY KEY, tx int NOT NULL, note text)`)
	require.NoError(t, c.ApplyChange(ctx, cases[0].ch))
}

// roleSeq numbers every role (and database) name the tests make: roles
// belong to the cluster, which the tests of a binary share.
var roleSeq atomic.Int64

// plainRole creates a login role (cluster-wide, so uniquely named) with a
// password, allowed to write the database's tables and to create schemas
// in it, but not to use replication origins; it returns a DSN for it.
func plainRole(t *testing.T, dsn string, admin *pgx.Conn) string {
	t.Helper()
	role := fmt.Sprintf("apply_plain_%d_%d", os.Getpid(), roleSeq.Add(1))
	execSQL(t, admin, "CREATE ROLE "+role+" LOGIN PASSWORD 'plain-pw-1234'",
		"GRANT CREATE ON DATABASE "+pgx.Identifier{dbName(t, admin)}.Sanitize()+" TO "+role,
		"GRANT ALL ON ALL TABLES IN SCHEMA public TO "+role, "GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO "+role)
	t.Cleanup(func() {
		_, err := admin.Exec(context.Background(), "DROP OWNED BY "+role)
		assert.NoError(t, err)
		_, err = admin.Exec(context.Background(), "DROP ROLE "+role)
		assert.NoError(t, err)
	})
	return strings.Replace(dsn, "postgres@", role+":plain-pw-1234@", 1)
}

func dbName(t *testing.T, conn *pgx.Conn) string {
	t.Helper()
	var name string
	require.NoError(t, conn.QueryRow(context.Background(), "SELECT current_database()").Scan(&name))
	return name
}

func originsOf(t *testing.T, conn *pgx.Conn) []string {
	t.Helper()
	rows, err := conn.Query(context.Background(), `SELECT roname FROM pg_replication_origin
		WHERE starts_with(roname, 'siphon_' || (SELECT oid FROM pg_database WHERE datname = current_database()) || '_')`)
	require.NoError(t, err)
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return names
}

// assertApplyInProgress starts consuming stream through a pipe, holds it
// after its first transaction, and checks that a second consumer of the
// same source is turned away meanwhile.
func assertApplyInProgress(t *testing.T, c *siphon.Conn, stream []byte, first canonical.Position) {
	t.Helper()
	commit := bytes.Index(stream, []byte(`{"t":"commit"`))
	require.Positive(t, commit)
	cut := commit + bytes.IndexByte(stream[commit:], '\n') + 1
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() { done <- c.ConsumeCanonical(context.Background(), pr) }()
	_, err := pw.Write(stream[:cut])
	require.NoError(t, err)
	waitFor(t, "the first transaction is applied", func() bool {
		pos, err := c.AppliedPosition(context.Background())
		require.NoError(t, err)
		return pos == first
	})

	err = c.ConsumeCanonical(context.Background(), bytes.NewReader(stream))
	require.ErrorIs(t, err, siphon.ErrApplyInProgress)

	_, err = pw.Write(stream[cut:])
	require.NoError(t, err)
	require.NoError(t, pw.Close())
	require.NoError(t, <-done)
}

// TestConsumeCanonicalWithoutOrigins applies as a role that may not use
// replication origins: the applied Position goes to the bookkeeping table,
// with the same guarantees.
func TestConsumeCanonicalWithoutOrigins(t *testing.T) {
	t.Parallel()
	dsn, admin, superConn := applyTarget(t, ledgerDDL...)
	s := ledgerStream(t, superConn, 0x2000000, 20)
	stream := s.done()
	c, err := siphon.Connect(context.Background(), plainRole(t, dsn, admin))
	require.NoError(t, err)
	defer c.Close()

	assertApplyInProgress(t, c, stream, s.ends[0])
	assert.Equal(t, 20, ledgerState(t, admin, c, s.ends))
	assert.Empty(t, originsOf(t, admin), "no replication origin")
	assert.Equal(t, [][]*string{{ptr("siphon_" + testSystemID + "_ledger"), ptr(s.ends[19].String())}},
		rawRows(t, admin, "SELECT origin, position FROM siphon.applied_position"))

	before := digest(t, admin, "events")
	require.NoError(t, consume(t, c, stream))
	assert.Equal(t, before, digest(t, admin, "events"), "nothing applied twice")

	require.NoError(t, c.ResetAppliedPosition(context.Background(), testSystemID, "ledger"))
	assert.Zero(t, appliedPosition(t, c))
}

func TestConsumeCanonicalOriginInUse(t *testing.T) {
	t.Parallel()
	_, admin, c := applyTarget(t, ledgerDDL...)
	s := ledgerStream(t, c, 0x2000000, 5)
	assertApplyInProgress(t, c, s.done(), s.ends[0])
	assert.Equal(t, 5, ledgerState(t, admin, c, s.ends))
	assert.Equal(t, []string{fmt.Sprintf("siphon_%s_%s_ledger", dbOID(t, admin), testSystemID)}, originsOf(t, admin))
}

// TestSweepOrphanOrigins drops the origins of a target database that was
// dropped, and nothing else: not the origin of a target that exists, not an
// origin siphon did not name.
func TestSweepOrphanOrigins(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn, admin, c := applyTarget(t, ledgerDDL...)
	s := ledgerStream(t, c, 0x2000000, 3)
	stream := s.done()
	require.NoError(t, consume(t, c, stream))
	kept := originsOf(t, admin)
	require.Len(t, kept, 1)

	name := fmt.Sprintf("sweep_target_%d_%d", os.Getpid(), roleSeq.Add(1))
	execSQL(t, admin, "CREATE DATABASE "+name)
	goneDSN := strings.Replace(dsn, "/"+dbName(t, admin)+"?", "/"+name+"?", 1)
	setup := connectOrFail(t, goneDSN)
	execSQL(t, setup, ledgerDDL...)
	require.NoError(t, setup.Close(ctx))
	gone, err := siphon.Connect(ctx, goneDSN)
	require.NoError(t, err)
	require.NoError(t, gone.ConsumeCanonical(ctx, bytes.NewReader(stream)))
	require.NoError(t, gone.Close())
	var goneOID string
	require.NoError(t, admin.QueryRow(ctx, "SELECT oid::text FROM pg_database WHERE datname = $1", name).Scan(&goneOID))
	execSQL(t, admin, "DROP DATABASE "+name+" WITH (FORCE)",
		"SELECT pg_replication_origin_create('siphonic_"+goneOID+"_not_ours')")
	t.Cleanup(func() { execSQL(t, admin, "SELECT pg_replication_origin_drop('siphonic_"+goneOID+"_not_ours')") })

	dropped, err := c.SweepOrphanOrigins(ctx)
	require.NoError(t, err)
	assert.GreaterOrEqual(t, dropped, 1, "the dropped target's origin (and maybe others of databases dropped meanwhile)")
	var left []string
	rows, err := admin.Query(ctx, "SELECT roname FROM pg_replication_origin WHERE roname LIKE '%\\_'||$1||'\\_%' ORDER BY roname", goneOID)
	require.NoError(t, err)
	left, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	assert.Equal(t, []string{"siphonic_" + goneOID + "_not_ours"}, left, "the dropped target's origin is gone, the foreign one stays")
	assert.Equal(t, kept, originsOf(t, admin), "an existing target keeps its origin")
	assert.Equal(t, s.ends[2], appliedPosition(t, c))
}

// TestAppliedPositionSources applies two sources into one target, and one
// source into two targets of the same cluster: each keeps its own Position.
// The second source's first change stream is refused until the target is
// told it holds that source (MarkAppliedPosition).
func TestAppliedPositionSources(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, _, c := applyTarget(t, ledgerDDL...)
	_, _, other := applyTarget(t, ledgerDDL...)
	items := tableOf(t, inspect(t, c), itemsName)

	a := newStreamFrom(t, "1001", canonical.KindIncremental, 0x100, "same_slot", items)
	endA := a.tx(ins(itemsName, tv("1"), tv("1"), null))
	b := newStreamFrom(t, "1002", canonical.KindIncremental, 0x9000, "same_slot", items)
	endB := b.tx(ins(itemsName, tv("2"), tv("1"), null))
	streamA, streamB := a.done(), b.done()
	require.NoError(t, consume(t, c, streamA))
	assert.Equal(t, endA, appliedPosition(t, c), "one source: no need to name it")
	var gap *siphon.ApplyGapError
	require.ErrorAs(t, consume(t, c, streamB), &gap, "a change stream of a source the target holds nothing of, while it holds another")
	assert.Equal(t, map[string]canonical.Position{"1001_same_slot": endA}, gap.Holds)
	require.NoError(t, c.MarkAppliedPosition(ctx, "1002", "same_slot", 0x9000), "the target holds source 1002 up to its start")
	require.NoError(t, consume(t, c, streamB))
	require.NoError(t, consume(t, other, streamA))

	_, err := c.AppliedPosition(ctx)
	require.ErrorIs(t, err, siphon.ErrAmbiguousSource)
	assert.Contains(t, err.Error(), `system id 1001 slot "same_slot" up to `+endA.String())
	for sys, want := range map[string]canonical.Position{"1001": endA, "1002": endB, "1003": 0} {
		pos, err := c.AppliedPositionFor(ctx, sys, "same_slot")
		require.NoError(t, err)
		assert.Equal(t, want, pos, sys)
	}

	require.NoError(t, c.ResetAppliedPosition(ctx, "1002", "same_slot"))
	assert.Equal(t, endA, appliedPosition(t, c))
	require.NoError(t, c.ResetAppliedPosition(ctx, "1001", "same_slot"))
	assert.Zero(t, appliedPosition(t, c))
	assert.Equal(t, endA, appliedPosition(t, other), "the other database keeps its own")
}

// e2eDDL is the schema of the end-to-end test: a keyed table with a
// TOASTed column, a keyless table under REPLICA IDENTITY FULL holding
// duplicates and types without equality (json, point), and a table with a
// composite key and names that need quoting.
var e2eDDL = []string{
	`CREATE TABLE docs (id bigint PRIMARY KEY, rev int NOT NULL, price numeric(12,2), tags text[], body text)`,
	`CREATE TABLE log (k int, n numeric, doc json, at point, note text)`,
	`ALTER TABLE log REPLICA IDENTITY FULL`,
	`CREATE TABLE "Mixed ""Key""" ("Region" text, "Nr" int, "välue" jsonb, PRIMARY KEY ("Region", "Nr"))`,
}

var e2eTables = []string{"docs", "log", `"Mixed ""Key"""`}

// workload runs n random transactions on the source.
func workload(t *testing.T, conn *pgx.Conn, rng *rand.Rand, n int, nextID *int) {
	t.Helper()
	ctx := context.Background()
	randomText := func(size int) string {
		b := make([]byte, size)
		for i := range b {
			b[i] = byte(rng.IntN(256))
		}
		return base64.StdEncoding.EncodeToString(b)
	}
	for range n {
		tx, err := conn.Begin(ctx)
		require.NoError(t, err)
		for range 1 + rng.IntN(6) {
			var sql string
			var args []any
			switch op := rng.IntN(12); {
			case op < 3:
				*nextID++
				body := any(nil)
				if rng.IntN(2) == 0 {
					body = randomText(9000) // TOASTed out of line
				}
				sql, args = `INSERT INTO docs VALUES ($1, 0, $2, $3, $4)`, []any{*nextID, fmt.Sprintf("%d.%02d", rng.IntN(1000), rng.IntN(100)), []string{"a", "b\tc"}, body}
			case op == 3:
				sql = `INSERT INTO docs SELECT $1 + g, 1, g, '{}', 'bulk ' || g FROM generate_series(1, 150) g`
				args = []any{*nextID}
				*nextID += 150
			case op == 4:
				sql = `UPDATE docs SET rev = rev + 1, price = price * 1.5 WHERE id = (SELECT id FROM docs ORDER BY random() LIMIT 1)`
			case op == 5: // leaves a TOASTed body out of the change
				sql = `UPDATE docs SET rev = rev + 1 WHERE id = (SELECT id FROM docs WHERE length(body) > 5000 ORDER BY random() LIMIT 1)`
			case op == 6:
				sql, args = `UPDATE docs SET body = $1 WHERE id = (SELECT id FROM docs ORDER BY random() LIMIT 1)`, []any{randomText(100)}
			case op == 7:
				sql = `DELETE FROM docs WHERE id = (SELECT id FROM docs ORDER BY random() LIMIT 1)`
			case op == 8:
				sql, args = `INSERT INTO log SELECT $1, 1.50, '{"a":  [1, 2.0]}', '(1,-0)', NULL FROM generate_series(1, 2)`, []any{rng.IntN(5)}
			case op == 9:
				sql = `UPDATE log SET n = n + 1, note = 'x' WHERE ctid = (SELECT ctid FROM log ORDER BY k LIMIT 1)`
			case op == 10:
				sql = `DELETE FROM log WHERE ctid = (SELECT ctid FROM log ORDER BY k DESC LIMIT 1)`
			default:
				sql, args = `INSERT INTO "Mixed ""Key""" VALUES ($1, $2, '{"z": 1, "a": null}') ON CONFLICT ("Region", "Nr") DO UPDATE SET "välue" = '[]'`,
					[]any{fmt.Sprint("r ", rng.IntN(3)), rng.IntN(20)}
			}
			_, err := tx.Exec(ctx, sql, args...)
			require.NoError(t, err, sql)
		}
		require.NoError(t, tx.Commit(ctx))
	}
}

// TestConsumeCanonicalEndToEnd runs a random workload on a source, takes a
// snapshot and then incremental backups, and consumes them into a target
// created with the same DDL: the target ends identical to the source. Consuming every
// incremental again changes nothing; a second target that meets a cut
// incremental, then takes them all, ends identical too.
func TestConsumeCanonicalEndToEnd(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srcDSN, source := newDatabase(t)
	execSQL(t, source, e2eDDL...)
	src, _ := streamConn(t, srcDSN)
	_, target, c := applyTarget(t, e2eDDL...)
	_, second, secondConn := applyTarget(t, e2eDDL...)
	seed := time.Now().UnixNano()
	t.Logf("workload seed %d", seed)
	rng := rand.New(rand.NewPCG(uint64(seed), 7))

	_, err := src.CurrentPosition(ctx) // the publication and the slot
	require.NoError(t, err)
	nextID := 0
	workload(t, source, rng, 10, &nextID)
	var snapshot bytes.Buffer
	pos, err := src.EmitCanonical(ctx, nil, &snapshot)
	require.NoError(t, err)
	for _, conn := range []*siphon.Conn{c, secondConn} {
		require.NoError(t, consume(t, conn, snapshot.Bytes()))
		assert.Equal(t, pos, appliedPosition(t, conn))
	}
	for _, table := range e2eTables {
		require.Equal(t, digest(t, source, table), digest(t, target, table), "snapshot, %s", table)
	}
	var chunks [][]byte
	for round := range 4 {
		workload(t, source, rng, 25, &nextID)
		if round == 2 {
			execSQL(t, source, `TRUNCATE log`)
			workload(t, source, rng, 5, &nextID)
		}
		var buf bytes.Buffer
		end, err := src.BackupIncremental(ctx, pos, &buf)
		require.NoError(t, err)
		require.Greater(t, end, pos)
		pos = end
		chunks = append(chunks, buf.Bytes())
		require.NoError(t, consume(t, c, buf.Bytes()))
		for _, table := range e2eTables {
			require.Equal(t, digest(t, source, table), digest(t, target, table), "round %d, %s", round, table)
		}
	}
	assert.Equal(t, pos, appliedPosition(t, c))
	all := bytes.Join(chunks, nil)
	assert.True(t, bytes.Contains(all, []byte(`"unchanged":["body"]`)), "updates that left a TOASTed value out were applied")
	assert.True(t, bytes.Contains(all, []byte(`{"t":"truncate"`)))

	for _, chunk := range chunks {
		require.NoError(t, consume(t, c, chunk))
	}
	for _, table := range e2eTables {
		assert.Equal(t, digest(t, source, table), digest(t, target, table), "consumed twice: %s", table)
	}
	assert.Equal(t, pos, appliedPosition(t, c))

	require.NoError(t, consume(t, secondConn, chunks[0]))
	require.ErrorIs(t, consume(t, secondConn, chunks[1][:len(chunks[1])/2]), canonical.ErrTruncated)
	for _, chunk := range chunks {
		require.NoError(t, consume(t, secondConn, chunk))
	}
	for _, table := range e2eTables {
		assert.Equal(t, digest(t, source, table), digest(t, second, table), "cut, then whole: %s", table)
	}
	assert.Equal(t, pos, appliedPosition(t, secondConn))
}

// TestConsumeCanonicalFailureInMergedStatement makes the target refuse a
// row of the third transaction (a unique index the source lacks) while
// the inserts of several transactions are copied at once: the unit is
// rolled back and applied again a transaction at a time, so the first two
// are kept, with their Position.
func TestConsumeCanonicalFailureInMergedStatement(t *testing.T) {
	t.Parallel()
	_, target, c := applyTarget(t, ledgerDDL[0])
	items := tableOf(t, inspect(t, c), itemsName)
	execSQL(t, target, `CREATE UNIQUE INDEX items_note ON items (note)`)
	s := newStream(t, canonical.KindIncremental, 0x5000000, "merged", items)
	id := 0
	insert := func(tx int, n int, note func(i int) string) []canonical.Change {
		var changes []canonical.Change
		for i := range n {
			id++
			changes = append(changes, ins(itemsName, tv(fmt.Sprint(id)), tv(fmt.Sprint(tx)), tv(note(i))))
		}
		return changes
	}
	s.tx(insert(1, 3, func(i int) string { return fmt.Sprintf("a%d", i) })...)
	second := s.tx(insert(2, 40, func(i int) string { return fmt.Sprintf("b%d", i) })...)
	s.tx(insert(3, 40, func(i int) string { return fmt.Sprintf("a%d", i%2) })...)
	s.tx(insert(4, 1, func(int) string { return "d" })...)

	err := consume(t, c, s.done())
	require.Error(t, err)
	assert.Contains(t, err.Error(), "items_note")
	assert.Equal(t, second, appliedPosition(t, c))
	assert.Equal(t, [][]*string{{ptr("1"), ptr("3")}, {ptr("2"), ptr("40")}},
		rawRows(t, target, "SELECT tx, count(*) FROM items GROUP BY tx ORDER BY tx"))
}

// TestConsumeCanonicalLargeTransaction cuts a stream inside a transaction
// too large to be kept for a second attempt (a tenth more than the apply
// keeps), after small ones in the same target transaction: those are kept
// all the same, and the whole stream then completes.
func TestConsumeCanonicalLargeTransaction(t *testing.T) {
	t.Parallel()
	_, target, c := applyTarget(t, ledgerDDL[0])
	s := newStream(t, canonical.KindIncremental, 0x6000000, "large", tableOf(t, inspect(t, c), itemsName))
	for tx := 1; tx <= 3; tx++ {
		s.tx(ins(itemsName, tv(fmt.Sprint(tx)), tv(fmt.Sprint(tx)), tv("small")))
	}
	third := s.ends[2]
	big := strings.Repeat("0123456789abcdef", 100<<10/16)
	rows := siphon.MaxTapeBytesForTest * 11 / 10 / len(big)
	var changes []canonical.Change
	for i := range rows {
		changes = append(changes, ins(itemsName, tv(fmt.Sprint(100+i)), tv("4"), tv(big)))
	}
	s.tx(changes...)
	last := s.tx(ins(itemsName, tv("5"), tv("5"), tv("small")))
	stream := s.done()

	err := consume(t, c, stream[:len(stream)*9/10])
	require.ErrorIs(t, err, canonical.ErrTruncated)
	assert.Equal(t, third, appliedPosition(t, c))
	assert.Equal(t, [][]*string{{ptr("3")}}, rawRows(t, target, "SELECT count(*) FROM items"))

	require.NoError(t, consume(t, c, stream))
	assert.Equal(t, last, appliedPosition(t, c))
	assert.Equal(t, [][]*string{{ptr(fmt.Sprint(rows + 4))}}, rawRows(t, target, "SELECT count(*) FROM items"))
}

// TestConsumeCanonicalTransactionPastTheTapeEndsItsUnit applies, after a
// small transaction, two that each hold six tenths of what the apply keeps
// for a second attempt, then one the target refuses (a CHECK). The second
// large one takes the kept records past their bound, so it is not kept,
// and its target transaction must end with it: were the refused one in
// the same target transaction, the second attempt could not apply it
// again. Every transaction before the refused one stays applied.
func TestConsumeCanonicalTransactionPastTheTapeEndsItsUnit(t *testing.T) {
	t.Parallel()
	_, target, c := applyTarget(t, ledgerDDL[0], `ALTER TABLE items ADD CONSTRAINT no_refusals CHECK (note <> 'refused')`)
	s := newStream(t, canonical.KindIncremental, 0x6800000, "pasttape", tableOf(t, inspect(t, c), itemsName))
	s.tx(ins(itemsName, tv("1"), tv("1"), tv("small")))
	big := strings.Repeat("0123456789abcdef", 100<<10/16)
	rows := siphon.MaxTapeBytesForTest * 6 / 10 / len(big)
	id := 100
	for tx := 2; tx <= 3; tx++ {
		var changes []canonical.Change
		for range rows {
			changes = append(changes, ins(itemsName, tv(fmt.Sprint(id)), tv(fmt.Sprint(tx)), tv(big)))
			id++
		}
		s.tx(changes...)
	}
	third := s.ends[2]
	s.tx(ins(itemsName, tv("4"), tv("4"), tv("refused")))

	err := consume(t, c, s.done())
	require.Error(t, err)
	assert.Contains(t, err.Error(), "no_refusals")
	assert.Equal(t, third, appliedPosition(t, c))
	assert.Equal(t, [][]*string{{ptr("1"), ptr("1")}, {ptr("2"), ptr(fmt.Sprint(rows))}, {ptr("3"), ptr(fmt.Sprint(rows))}},
		rawRows(t, target, "SELECT tx, count(*) FROM items GROUP BY tx ORDER BY tx"))
}

// TestConsumeCanonicalInsertRunsIntoExistingRows copies long runs of
// inserts into tables that hold rows already: keys that are new go in with
// COPY, keys that exist are upserts, for integer and other keys alike.
func TestConsumeCanonicalInsertRunsIntoExistingRows(t *testing.T) {
	t.Parallel()
	_, target, c := applyTarget(t, ledgerDDL[0], `CREATE TABLE tagged (tag text PRIMARY KEY, n int)`)
	execSQL(t, target, `INSERT INTO items SELECT g, 0, 'old' FROM generate_series(2, 200, 2) g`,
		`INSERT INTO tagged SELECT 't' || g, 0 FROM generate_series(2, 200, 2) g`)
	schema := inspect(t, c)
	tagged := canonical.TableName{Schema: "public", Name: "tagged"}
	s := newStream(t, canonical.KindIncremental, 0x7000000, "existing", tableOf(t, schema, itemsName), tableOf(t, schema, tagged))
	var odd, even []canonical.Change
	for i := 1; i <= 199; i += 2 {
		odd = append(odd, ins(itemsName, tv(fmt.Sprint(i)), tv("1"), tv("new")), ins(tagged, tv(fmt.Sprint("t", i)), tv("1")))
	}
	for i := 2; i <= 130; i += 2 {
		even = append(even, ins(itemsName, tv(fmt.Sprint(i)), tv("2"), tv("new")), ins(tagged, tv(fmt.Sprint("t", i)), tv("2")))
	}
	// Runs of one table: all items first, then all tags.
	sortByTable := func(changes []canonical.Change) []canonical.Change {
		slices.SortStableFunc(changes, func(a, b canonical.Change) int { return strings.Compare(a.Table, b.Table) })
		return changes
	}
	s.tx(sortByTable(odd)...)
	s.tx(sortByTable(even)...)
	require.NoError(t, consume(t, c, s.done()))

	assert.Equal(t, [][]*string{{ptr("0"), ptr("35")}, {ptr("1"), ptr("100")}, {ptr("2"), ptr("65")}},
		rawRows(t, target, "SELECT tx, count(*) FROM items GROUP BY tx ORDER BY tx"))
	assert.Equal(t, [][]*string{{ptr("0"), ptr("35")}, {ptr("1"), ptr("100")}, {ptr("2"), ptr("65")}},
		rawRows(t, target, "SELECT n, count(*) FROM tagged GROUP BY n ORDER BY n"))
	assert.Equal(t, [][]*string{{ptr("new"), ptr("165")}, {ptr("old"), ptr("35")}},
		rawRows(t, target, "SELECT note, count(*) FROM items GROUP BY note ORDER BY note"))
}

// TestApplyKeysOfExtensionTypes replicates tables keyed by extension types
// (citext, ltree: their = lives in the extension's schema, which siphon's
// search_path leaves out) and then updates and deletes rows by key: apply
// finds each row with the key type's own equality operator, as PostgreSQL's
// apply does, so the target equals the source.
func TestApplyKeysOfExtensionTypes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srcDSN, src, tgtDSN, tgt := twinDatabases(t, `CREATE EXTENSION citext`, `CREATE EXTENSION ltree`,
		`CREATE TABLE users (email citext PRIMARY KEY, name text NOT NULL)`,
		`CREATE TABLE paths (path ltree PRIMARY KEY, label text)`)
	execSQL(t, src, `INSERT INTO users SELECT 'User' || i || '@Example.com', 'user ' || i FROM generate_series(1, 200) i`,
		`INSERT INTO paths SELECT ('top.n' || i)::ltree, 'node ' || i FROM generate_series(1, 200) i`)
	c, slot := streamConn(t, srcDSN)
	target := connect(t, tgtDSN)
	run := startReplicate(t, c, target, siphon.ReplicateOptions{Snapshot: true})
	systemID := systemIdentifier(t, src)
	waitApplied(t, target, systemID, slot, sourceMark(t, src), run)
	execSQL(t, src, `UPDATE users SET name = 'renamed' WHERE email = 'user7@example.com'`,
		`DELETE FROM users WHERE email = 'USER8@EXAMPLE.COM'`,
		`UPDATE users SET email = 'moved@example.com' WHERE email = 'user9@example.com'`,
		`UPDATE paths SET label = 'moved' WHERE path = 'top.n7'`,
		`DELETE FROM paths WHERE path <@ 'top.n8'`,
		`INSERT INTO users VALUES ('New@Example.com', 'new')`, `INSERT INTO paths VALUES ('top.new', 'new')`)
	waitApplied(t, target, systemID, slot, sourceMark(t, src), run)
	_, err := run.stop()
	require.NoError(t, err)
	for _, table := range []string{"users", "paths"} {
		assert.Equal(t, digest(t, src, table), digest(t, tgt, table), table)
	}
	assert.Equal(t, 1, count(t, tgt, `SELECT count(*) FROM users WHERE name = 'renamed' AND email = 'User7@Example.com'`), "the row found by its citext key")
	require.NoError(t, c.Detach(ctx))
}
