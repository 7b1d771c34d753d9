package canonical

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// valueClasses holds PostgreSQL output text for every value class DESIGN.md
// names, as the source prints it under siphon's session settings.
var valueClasses = []struct {
	class, typ string
	texts      []string
}{
	{"numeric", "numeric", []string{"NaN", "Infinity", "-Infinity", "0", "0.10", "-0.000000000000000000000001",
		"123456789012345678901234567890123456789.123456789012345678901234567890123456789"}},
	{"int8 beyond 2^53", "bigint", []string{"9007199254740993", "9223372036854775807", "-9223372036854775808"}},
	{"float specials", "double precision", []string{"NaN", "Infinity", "-Infinity", "-0", "1.7976931348623157e+308", "5e-324", "0.1"}},
	{"float4", "real", []string{"3.4028235e+38", "1.401298e-45", "NaN"}},
	{"timestamp", "timestamp without time zone", []string{"2026-11-30 05:00:00.123456", "infinity", "-infinity", "4713-01-01 00:00:00 BC", "294276-12-31 23:59:59.999999"}},
	{"timestamptz", "timestamp with time zone", []string{"2026-11-30 05:00:00.000001+00", "1999-12-31 23:59:59.999999+00", "infinity", "-infinity"}},
	{"date", "date", []string{"2026-11-30", "infinity", "-infinity", "0001-01-01 BC", "5874897-12-31"}},
	{"time", "time without time zone", []string{"23:59:59.999999", "24:00:00", "00:00:00"}},
	{"timetz", "time with time zone", []string{"23:59:59.999999+05:30", "00:00:00-14:59"}},
	{"interval", "interval", []string{"1 year 2 mons 3 days 04:05:06.789012", "-00:00:00.000001", "178000000 years", "-1 days +02:00:00", "00:00:00"}},
	{"bytea", "bytea", []string{`\x`, `\xdeadbeef00`, `\x5c78`}},
	{"uuid", "uuid", []string{"a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", "00000000-0000-0000-0000-000000000000"}},
	{"json", "json", []string{`{"a": "b \"quoted\" \\ back\\slash", "n": [1, 2.5e10, null], "u": "\u00e9", "nl": "x\ny"}`, `"just a string"`, `null`, `  [ ]  `}},
	{"jsonb", "jsonb", []string{`{"k": "va\"l", "nested": {"x": [true, false, {"deep": "\\\""}]}}`, `{"\u0000": 1}`}},
	{"arrays", "integer[]", []string{"{{1,NULL},{3,4}}", "{}", "[0:1]={1,2}", "{{{1}}}"}},
	{"text arrays", "text[]", []string{`{"a b","c\"d",NULL,"NULL","",\\}`, `{"{}","\\\\"}`}},
	{"ranges", "tstzrange", []string{`["2026-01-01 00:00:00+00","2026-02-01 00:00:00+00")`, "empty", `(,"2026-01-01 00:00:00+00"]`, `["-infinity",infinity)`}},
	{"int ranges", "int4range", []string{"[1,10)", "empty", "(,5)"}},
	{"enum", "public.mood", []string{"happy", "ça va", "with space"}},
	{"domain", "public.posint", []string{"42"}},
	{"composite", "public.pair", []string{`(1,"a b")`, `(,)`, `("x""y",)`, `("(1,2)","{a,b}")`}},
	{"inet", "inet", []string{"192.168.0.1/24", "::1", "2001:db8::/32", "10.1.2.3"}},
	{"cidr", "cidr", []string{"10.0.0.0/8", "2001:db8::/32"}},
	{"macaddr", "macaddr", []string{"08:00:2b:01:02:03"}},
	{"macaddr8", "macaddr8", []string{"08:00:2b:01:02:03:04:05"}},
	{"money", "money", []string{"$1,234.56", "-$0.01", "$92,233,720,368,547,758.07"}},
	{"bit", "bit varying", []string{"101", "", "0000000000000000000000000000000000000000000000000000000000000001"}},
	{"tsvector", "tsvector", []string{`'a':1A 'cat':2 'fat':3B,4C`, `'it''s' 'back\\slash'`, ""}},
	{"tsquery", "tsquery", []string{`'fat' & ( 'rat' | 'cat' )`}},
	{"unknown type", "public.geometry", []string{"(1,2)", "POINT(1 2)", "<(0,0),1>"}},
	{"text", "text", []string{"", " ", "line1\nline2\r\n\ttab", `\`, `"`, "\x01\x02\x1f\x7f", "\b\f",
		"unicode: 日本語 ✓ Ünïcödé 😀 \u2028 \u2029 \ufeff \U0010FFFF", "a\x00b", "\x00", strings.Repeat("x", 70000)}},
}

// TestValueClassesRoundTrip encodes each class's texts as a snapshot row and
// an update, decodes them, and checks the text is byte-identical. It also
// checks the encoded line against encoding/json, as an independent decoder.
func TestValueClassesRoundTrip(t *testing.T) {
	t.Parallel()
	for _, vc := range valueClasses {
		t.Run(vc.class, func(t *testing.T) {
			t.Parallel()
			table := &Table{Schema: "public", Name: "v", Columns: []Column{
				{Name: "id", Type: "bigint"}, {Name: "v", Type: vc.typ, Nullable: true}, {Name: "n", Type: vc.typ, Nullable: true},
			}}
			for _, text := range vc.texts {
				row := Row{Text("1"), Text(text), Null()}

				snap := encode(t, Header{Kind: KindSnapshot}, func(e *Encoder) {
					require.NoError(t, e.WriteTable(table))
					require.NoError(t, e.WriteRow(table.TableName(), row))
					require.NoError(t, e.WriteEnd(9))
				})
				rowLine := strings.Split(string(snap), "\n")[2]
				var std struct{ Values []*string }
				require.NoError(t, json.Unmarshal([]byte(rowLine), &std), "line %s", rowLine)
				require.Len(t, std.Values, 3)
				if assert.NotNil(t, std.Values[1]) {
					assert.Equal(t, text, *std.Values[1], "encoding/json reads the same text")
				}
				assert.Nil(t, std.Values[2])

				_, recs, err := decodeAll(snap)
				require.NoError(t, err)
				require.Len(t, recs, 3)
				got, ok := recs[1].Row[1].Text()
				assert.True(t, ok)
				assert.Equal(t, text, got)
				assert.Equal(t, row, recs[1].Row)

				ch := &Change{Op: OpUpdate, XID: 9, Position: 5, Schema: "public", Table: "v", Columns: table.Columns,
					New: Row{Text("1"), Text(text), Unchanged()}, Old: Row{Text("1"), Text(text), Null()}}
				stream := encode(t, Header{Kind: KindChanges}, func(e *Encoder) {
					require.NoError(t, e.WriteChange(&Change{Op: OpBegin, XID: 9, Position: 5, CommitTime: testTime}))
					require.NoError(t, e.WriteChange(ch))
					require.NoError(t, e.WriteChange(&Change{Op: OpCommit, XID: 9, Position: 6, CommitTime: testTime}))
					require.NoError(t, e.WriteEnd(6))
				})
				_, recs, err = decodeAll(stream)
				require.NoError(t, err)
				require.Len(t, recs, 5)
				dec := recs[2].Change
				require.NotNil(t, dec)
				assert.Equal(t, ch.New, dec.New)
				assert.Equal(t, ch.Old, dec.Old)
			}
		})
	}
}

// TestValueStates checks that NULL, unchanged and the empty string stay
// three different things through the codec, in rows and in changes.
func TestValueStates(t *testing.T) {
	t.Parallel()
	tbl := &Table{Schema: "s", Name: "t", Columns: []Column{
		{Name: "null", Type: "text", Nullable: true},
		{Name: "empty", Type: "text", Nullable: true},
		{Name: "unchanged", Type: "text", Nullable: true},
		{Name: "NULL text", Type: "text", Nullable: true},
	}}
	newRow := Row{Null(), Text(""), Unchanged(), Text("NULL")}
	oldRow := Row{Null(), Text(""), Unchanged(), Text("null")}
	data := encode(t, Header{Kind: KindChanges}, func(e *Encoder) {
		require.NoError(t, e.WriteTable(tbl))
		require.NoError(t, e.WriteChange(&Change{Op: OpBegin, XID: 1, Position: 1}))
		require.NoError(t, e.WriteChange(&Change{Op: OpUpdate, XID: 1, Position: 1, Schema: "s", Table: "t",
			Columns: tbl.Columns, New: newRow, Old: oldRow}))
		require.NoError(t, e.WriteChange(&Change{Op: OpCommit, XID: 1, Position: 2}))
		require.NoError(t, e.WriteEnd(2))
	})
	assert.Contains(t, string(data), `"new":[null,"",null,"NULL"],"old":[null,"",null,"null"],"unchanged":["unchanged"],"old_unchanged":["unchanged"]`)

	_, recs, err := decodeAll(data)
	require.NoError(t, err)
	ch := recs[2].Change
	require.NotNil(t, ch)
	for _, row := range []Row{ch.New, ch.Old} {
		require.Len(t, row, 4)
		assert.True(t, row[0].IsNull())
		assert.False(t, row[0].IsUnchanged())
		s, ok := row[1].Text()
		assert.True(t, ok, "the empty string is present")
		assert.Empty(t, s)
		assert.False(t, row[1].IsNull())
		assert.True(t, row[2].IsUnchanged())
		assert.False(t, row[2].IsNull())
	}
	assert.Equal(t, []string{"unchanged"}, ch.Unchanged())
	assert.Equal(t, newRow, ch.New)
	assert.Equal(t, oldRow, ch.Old)
}

// oddTable has identifiers that need quoting in SQL and escaping in JSON.
func oddTable() *Table {
	return &Table{
		Schema: `My "Schema"`,
		Name:   "tab le\\Ünï",
		Columns: []Column{
			{Name: "ID", Type: "bigint", TypeOID: 20},
			{Name: `"quoted"`, Type: `"My Type"[]`, Nullable: true},
			{Name: "with space", Type: "text", Nullable: true},
			{Name: "日本語😀", Type: "public.\"ça\"", Nullable: true},
			{Name: "tab\there", Type: "text", Nullable: true, Default: true},
		},
		PrimaryKey:      []string{"ID", "with space"},
		IdentityKey:     []string{"日本語😀"},
		ReplicaIdentity: IdentityIndex,
		PartitionOf:     &TableName{Schema: `My "Schema"`, Name: "Parent Ü"},
	}
}

// TestSnapshotRoundTrip round-trips a header, table records (every field)
// and rows.
func TestSnapshotRoundTrip(t *testing.T) {
	t.Parallel()
	odd := oddTable()
	parent := &Table{Schema: `My "Schema"`, Name: "Parent Ü", Columns: odd.Columns, Partitioned: true}
	empty := &Table{Schema: "public", Name: "no_columns"}
	rows := []Row{
		{Text("1"), Text(`{"a b"}`), Null(), Text("x"), Text("")},
		{Text("2"), Null(), Null(), Null(), Null()},
	}
	h := testHeader
	h.Kind = KindSnapshot
	data := encode(t, h, func(e *Encoder) {
		require.NoError(t, e.WriteTable(parent))
		require.NoError(t, e.WriteTable(odd))
		for _, r := range rows {
			require.NoError(t, e.WriteRow(odd.TableName(), r))
		}
		require.NoError(t, e.WriteTable(empty))
		require.NoError(t, e.WriteRow(empty.TableName(), Row{}))
		require.NoError(t, e.WriteEnd(h.End))
	})
	gotHeader, recs, err := decodeAll(data)
	require.NoError(t, err)
	assert.Equal(t, h, gotHeader)
	require.Len(t, recs, 7)

	assert.Equal(t, RecordTable, recs[0].Type)
	assert.Equal(t, parent, recs[0].Table)
	assert.Equal(t, odd, recs[1].Table)
	for i, r := range rows {
		rec := recs[2+i]
		assert.Equal(t, RecordRow, rec.Type)
		assert.Equal(t, odd.TableName(), rec.TableName())
		assert.Same(t, recs[1].Table, rec.Table, "rows point at their table record")
		assert.Equal(t, r, rec.Row)
	}
	assert.Equal(t, empty, recs[4].Table)
	assert.Equal(t, Row{}, recs[5].Row)
	assert.Equal(t, Record{Type: RecordEnd, Position: h.End, Count: 6}, recs[6])
}

// TestChangesRoundTrip round-trips every change record kind.
func TestChangesRoundTrip(t *testing.T) {
	t.Parallel()
	odd := oddTable()
	cols := odd.Columns
	tx1 := []*Change{
		{Op: OpBegin, XID: 745, Position: 0x16B3748, CommitTime: testTime},
		{Op: OpInsert, XID: 745, Position: 0x16B3748, Schema: odd.Schema, Table: odd.Name, Columns: cols,
			New: Row{Text("1"), Text("a"), Null(), Text(""), Text("é")}},
		{Op: OpUpdate, XID: 745, Position: 0x16B3748, Schema: odd.Schema, Table: odd.Name, Columns: cols,
			New: Row{Text("1"), Unchanged(), Null(), Text("b"), Unchanged()}},
		{Op: OpUpdate, XID: 745, Position: 0x16B3748, Schema: odd.Schema, Table: odd.Name, Columns: cols,
			New: Row{Text("2"), Text("x"), Null(), Null(), Null()},
			Old: Row{Text("1"), Null(), Null(), Null(), Null()}},
		{Op: OpDelete, XID: 745, Position: 0x16B3748, Schema: odd.Schema, Table: odd.Name, Columns: cols,
			Old: Row{Text("2"), Null(), Null(), Null(), Null()}},
		{Op: OpTruncate, XID: 745, Position: 0x16B3748, Truncated: []TableName{odd.TableName(), {Schema: "public", Name: "b"}},
			Cascade: true, RestartIdentity: true},
		{Op: OpMessage, XID: 745, Position: 0x16B3748, Message: &Message{Transactional: true, Prefix: "app/ü", Content: []byte{0, 1, 2, 0xFF}}},
		{Op: OpDDL, XID: 745, Position: 0x16B3748, DDL: &DDL{Tag: "ALTER TABLE", Statement: "ALTER TABLE \"Odd\" ADD COLUMN \"ü\" text DEFAULT 'a\nb'",
			SearchPath: `"$user", public`, Role: "app", Objects: []DDLObject{{Type: "table", Identity: "public.\"Odd\""}, {Type: "index", Identity: "public.i", Dropped: true}}}},
		{Op: OpDDL, XID: 745, Position: 0x16B3748, DDL: &DDL{Tag: "GRANT", Statement: "GRANT SELECT ON t TO PUBLIC; SELECT f()", Problem: "ran in an SQL function"}},
		{Op: OpCommit, XID: 745, Position: 0x16B3790, CommitTime: testTime},
	}
	nonTx := &Change{Op: OpMessage, Position: 0x16B3800, Message: &Message{Prefix: "heartbeat"}}
	seq := Sequence{Schema: "public", Name: "t_id_seq", Value: -9223372036854775808, Called: true}
	data := encode(t, testHeader, func(e *Encoder) {
		require.NoError(t, e.WriteTable(odd))
		for _, ch := range tx1 {
			require.NoError(t, e.WriteChange(ch))
		}
		require.NoError(t, e.WriteChange(nonTx))
		require.NoError(t, e.WriteSequence(seq))
		require.NoError(t, e.WriteEnd(0x16B3790))
	})
	h, recs, err := decodeAll(data)
	require.NoError(t, err)
	assert.Equal(t, testHeader, h)
	require.Len(t, recs, 1+len(tx1)+3, "no extra table record: the changes' columns match")
	assert.Equal(t, Record{Type: RecordSequence, Sequence: &seq}, recs[len(recs)-2])

	assert.Equal(t, odd, recs[0].Table)
	for i, want := range tx1 {
		rec := recs[1+i]
		require.Equal(t, RecordChange, rec.Type)
		got := rec.Change
		exp := *want
		switch want.Op {
		case OpInsert, OpUpdate, OpDelete:
			exp.CommitTime = testTime // from the begin record
			assert.Same(t, recs[0].Table, rec.Table)
		case OpTruncate, OpMessage, OpDDL:
			exp.CommitTime = testTime
		}
		assert.Equal(t, &exp, got, "change %d (%s)", i, want.Op)
	}
	msg := recs[1+len(tx1)].Change
	assert.Equal(t, OpMessage, msg.Op)
	assert.Equal(t, nonTx.Message.Prefix, msg.Message.Prefix)
	assert.Empty(t, msg.Message.Content)
	assert.False(t, msg.Message.Transactional)
	assert.True(t, msg.CommitTime.IsZero())
	assert.Equal(t, Record{Type: RecordEnd, Position: 0x16B3790, Count: uint64(1 + len(tx1) + 2)}, recs[len(recs)-1])
}

// TestWriteRecordCopiesStream decodes a stream and writes its records to a
// new Encoder: the copy is byte-identical.
func TestWriteRecordCopiesStream(t *testing.T) {
	t.Parallel()
	odd := oddTable()
	orig := encode(t, testHeader, func(e *Encoder) {
		require.NoError(t, e.WriteChange(&Change{Op: OpBegin, XID: 1, Position: 10, CommitTime: testTime}))
		require.NoError(t, e.WriteChange(&Change{Op: OpInsert, XID: 1, Position: 10, Schema: odd.Schema, Table: odd.Name,
			Columns: odd.Columns, New: Row{Text("1"), Null(), Text("\x00"), Text("x"), Unchanged()}}))
		require.NoError(t, e.WriteChange(&Change{Op: OpCommit, XID: 1, Position: 20, CommitTime: testTime}))
		require.NoError(t, e.WriteEnd(20))
	})
	h, recs, err := decodeAll(orig)
	require.NoError(t, err)
	copied := encode(t, h, func(e *Encoder) {
		for _, r := range recs {
			require.NoError(t, e.WriteRecord(r))
		}
	})
	assert.Equal(t, string(orig), string(copied))
}
