package canonical

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestEncoderFormat pins the bytes of each record kind: the format is a
// contract with streams already written.
func TestEncoderFormat(t *testing.T) {
	t.Parallel()
	tbl := testTable()
	var buf bytes.Buffer
	e := NewEncoder(&buf)
	require.NoError(t, e.WriteHeader(testHeader))
	require.NoError(t, e.WriteTable(tbl))
	require.NoError(t, e.WriteChange(&Change{Op: OpBegin, XID: 745, Position: 0x16B3748, CommitTime: testTime}))
	require.NoError(t, e.WriteChange(&Change{Op: OpInsert, XID: 745, Position: 0x16B3748, Schema: "public", Table: "t",
		Columns: tbl.Columns, New: Row{Text("1"), Text("hi \"you\"\n"), Null()}}))
	require.NoError(t, e.WriteChange(&Change{Op: OpUpdate, XID: 745, Position: 0x16B3748, Schema: "public", Table: "t",
		Columns: tbl.Columns, New: Row{Text("1"), Unchanged(), Null()}, Old: Row{Text("1"), Null(), Null()}}))
	require.NoError(t, e.WriteChange(&Change{Op: OpDelete, XID: 745, Position: 0x16B3748, Schema: "public", Table: "t",
		Columns: tbl.Columns, Old: Row{Text("1"), Null(), Null()}}))
	require.NoError(t, e.WriteChange(&Change{Op: OpTruncate, XID: 745, Position: 0x16B3748, Truncated: []TableName{{Schema: "public", Name: "t"}}}))
	require.NoError(t, e.WriteChange(&Change{Op: OpMessage, XID: 745, Position: 0x16B3748, Message: &Message{Transactional: true, Prefix: "p", Content: []byte("hello")}}))
	require.NoError(t, e.WriteChange(&Change{Op: OpCommit, XID: 745, Position: 0x16B3790, CommitTime: testTime}))
	require.NoError(t, e.WriteEnd(0x16B3790))
	assert.Equal(t, uint64(8), e.Count())

	want := lines(
		`{"t":"header","format":"siphon.jsonl","version":1,"checksum":"crc32c","kind":"changes","engine":"postgres","position":"0/16B3748","end":"0/16B9000","system_id":"7301234567890123456","timeline":1,"slot":"siphon","server_version":"15.18","created":"2026-11-30T05:00:00Z","sum":"15f63fdd"}`,
		`{"t":"table","schema":"public","name":"t","columns":[{"name":"id","type":"bigint","type_oid":20,"nullable":false},{"name":"body","type":"text","type_oid":25,"nullable":true},{"name":"note","type":"text","type_oid":25,"nullable":true}],"primary_key":["id"],"identity_key":["id"],"replica_identity":"default"}`,
		`{"t":"begin","xid":745,"position":"0/16B3748","commit_time":"2026-11-30T05:00:00.123456Z"}`,
		`{"t":"insert","schema":"public","table":"t","xid":745,"position":"0/16B3748","new":["1","hi \"you\"\n",null]}`,
		`{"t":"update","schema":"public","table":"t","xid":745,"position":"0/16B3748","new":["1",null,null],"old":["1",null,null],"unchanged":["body"]}`,
		`{"t":"delete","schema":"public","table":"t","xid":745,"position":"0/16B3748","old":["1",null,null]}`,
		`{"t":"truncate","xid":745,"position":"0/16B3748","tables":[{"schema":"public","name":"t"}],"cascade":false,"restart_identity":false}`,
		`{"t":"message","xid":745,"position":"0/16B3748","transactional":true,"prefix":"p","content":"aGVsbG8="}`,
		`{"t":"commit","xid":745,"position":"0/16B3790","commit_time":"2026-11-30T05:00:00.123456Z","sum":"5af667ec"}`,
		`{"t":"end","position":"0/16B3790","records":8,"sum":"67ba838d"}`,
	)
	assert.Equal(t, string(want), buf.String())
	for _, l := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		assert.True(t, json.Valid([]byte(l)), "valid JSON: %s", l)
	}
}

// TestEncoderTableRecords checks when WriteChange writes table records.
func TestEncoderTableRecords(t *testing.T) {
	t.Parallel()
	tbl := testTable()
	added := append(append([]Column(nil), tbl.Columns...), Column{Name: "extra", Type: "int", Nullable: true})
	withoutID := tbl.Columns[1:]
	data := encode(t, Header{Kind: KindChanges}, func(e *Encoder) {
		require.NoError(t, e.WriteTable(tbl))
		require.NoError(t, e.WriteChange(&Change{Op: OpBegin, XID: 1, Position: 1}))
		ins := func(cols []Column, n int) {
			row := make(Row, n)
			for i := range row {
				row[i] = Text("v")
			}
			require.NoError(t, e.WriteChange(&Change{Op: OpInsert, XID: 1, Position: 1, Schema: "public", Table: "t", Columns: cols, New: row}))
		}
		ins(tbl.Columns, 3) // same columns: no table record
		ins(nil, 3)         // nil: the latest table record
		ins(added, 4)       // a column more: a table record, keys kept
		ins(added, 4)       // no new record
		ins(withoutID, 2)   // the key column is gone: keys dropped
		require.NoError(t, e.WriteChange(&Change{Op: OpCommit, XID: 1, Position: 2}))
		require.NoError(t, e.WriteEnd(2))
	})
	_, recs, err := decodeAll(data)
	require.NoError(t, err)
	var types []string
	for _, r := range recs {
		if r.Type == RecordChange {
			types = append(types, r.Change.Op.String())
		} else {
			types = append(types, r.Type.String())
		}
	}
	assert.Equal(t, []string{"table", "begin", "insert", "insert", "table", "insert", "insert", "table", "insert", "commit", "end"}, types)

	grown := recs[4].Table
	assert.Equal(t, added, grown.Columns)
	assert.Equal(t, []string{"id"}, grown.PrimaryKey, "keys carry over while their columns exist")
	assert.Equal(t, IdentityDefault, grown.ReplicaIdentity)
	assert.Same(t, grown, recs[5].Table)
	shrunk := recs[7].Table
	assert.Equal(t, withoutID, shrunk.Columns)
	assert.Nil(t, shrunk.PrimaryKey)
	assert.Nil(t, shrunk.IdentityKey)
}

type failWriter struct{ err error }

func (w failWriter) Write([]byte) (int, error) { return 0, w.err }

// TestEncoderRefuses checks that the Encoder refuses what the Decoder would
// reject, with an *EncodeError, and writes nothing of it.
func TestEncoderRefuses(t *testing.T) {
	t.Parallel()
	tbl := testTable()
	name := tbl.TableName()
	bad := "caf\xe9"
	tests := []struct {
		name     string
		kind     Kind
		setup    func(t testing.TB, e *Encoder) // after the header
		write    func(e *Encoder) error
		sentinel error
		msg      string
	}{
		{"invalid UTF-8 value", KindSnapshot, withTable(tbl),
			func(e *Encoder) error { return e.WriteRow(name, Row{Text("1"), Text(bad), Null()}) },
			ErrInvalidUTF8, `encode row record of public.t, column "body": invalid UTF-8 at byte 3`},
		{"invalid UTF-8 in a change", KindChanges, withTx(tbl),
			func(e *Encoder) error {
				return e.WriteChange(&Change{Op: OpUpdate, XID: 1, Schema: "public", Table: "t", Columns: tbl.Columns,
					New: Row{Text("1"), Null(), Null()}, Old: Row{Text("1"), Null(), Text(bad)}})
			}, ErrInvalidUTF8, `column "note"`},
		{"invalid UTF-8 table name", KindSnapshot, nil,
			func(e *Encoder) error { return e.WriteTable(&Table{Schema: "public", Name: bad}) },
			ErrInvalidUTF8, "table name: invalid UTF-8 at byte 3"},
		{"invalid UTF-8 column name", KindSnapshot, nil,
			func(e *Encoder) error {
				return e.WriteTable(&Table{Schema: "public", Name: "t", Columns: []Column{{Name: bad, Type: "text"}}})
			}, ErrInvalidUTF8, "name: invalid UTF-8"},
		{"invalid UTF-8 message prefix", KindChanges, nil,
			func(e *Encoder) error { return e.WriteChange(&Change{Op: OpMessage, Message: &Message{Prefix: bad}}) },
			ErrInvalidUTF8, "prefix"},
		{"row before its table", KindSnapshot, nil,
			func(e *Encoder) error { return e.WriteRow(name, Row{Text("1"), Null(), Null()}) },
			ErrUnknownTable, "write its table record first"},
		{"row too short", KindSnapshot, withTable(tbl),
			func(e *Encoder) error { return e.WriteRow(name, Row{Text("1")}) },
			ErrInvalidRecord, "1 values for 3 columns"},
		{"unchanged in a row", KindSnapshot, withTable(tbl),
			func(e *Encoder) error { return e.WriteRow(name, Row{Text("1"), Unchanged(), Null()}) },
			ErrInvalidRecord, "unchanged TOAST value"},
		{"row in a change stream", KindChanges, withTable(tbl),
			func(e *Encoder) error { return e.WriteRow(name, Row{Text("1"), Null(), Null()}) },
			ErrOrder, "holds changes, not rows"},
		{"change in a snapshot", KindSnapshot, nil,
			func(e *Encoder) error { return e.WriteChange(&Change{Op: OpBegin}) },
			ErrOrder, "holds rows, not changes"},
		{"second header", KindSnapshot, nil,
			func(e *Encoder) error { return e.WriteHeader(Header{Kind: KindSnapshot}) },
			ErrOrder, "already written"},
		{"after the end", KindSnapshot, func(t testing.TB, e *Encoder) { require.NoError(t, e.WriteEnd(1)) },
			func(e *Encoder) error { return e.WriteTable(tbl) },
			ErrOrder, "end record was written"},
		{"insert outside a transaction", KindChanges, withTable(tbl),
			func(e *Encoder) error {
				return e.WriteChange(&Change{Op: OpInsert, Schema: "public", Table: "t", New: Row{Text("1"), Null(), Null()}})
			}, ErrOrder, "insert outside a transaction"},
		{"end inside a transaction", KindChanges, withTx(tbl),
			func(e *Encoder) error { return e.WriteEnd(5) },
			ErrOrder, "transaction is open"},
		{"nested begin", KindChanges, withTx(tbl),
			func(e *Encoder) error { return e.WriteChange(&Change{Op: OpBegin}) },
			ErrOrder, "begin inside an open transaction"},
		{"commit without begin", KindChanges, nil,
			func(e *Encoder) error { return e.WriteChange(&Change{Op: OpCommit}) },
			ErrOrder, "commit outside a transaction"},
		{"change without columns or table", KindChanges, withTx(nil),
			func(e *Encoder) error {
				return e.WriteChange(&Change{Op: OpInsert, Schema: "public", Table: "t", New: Row{Text("1")}})
			}, ErrUnknownTable, "no columns"},
		{"delete without old", KindChanges, withTx(tbl),
			func(e *Encoder) error { return e.WriteChange(&Change{Op: OpDelete, Schema: "public", Table: "t"}) },
			ErrInvalidRecord, "delete without old values"},
		{"message without Message", KindChanges, nil,
			func(e *Encoder) error { return e.WriteChange(&Change{Op: OpMessage}) },
			ErrInvalidRecord, "without a Message"},
		{"unknown op", KindChanges, nil,
			func(e *Encoder) error { return e.WriteChange(&Change{Op: 42}) },
			ErrInvalidRecord, "unknown op Op(42)"},
		{"duplicate column", KindSnapshot, nil,
			func(e *Encoder) error {
				return e.WriteTable(&Table{Schema: "s", Name: "t", Columns: []Column{{Name: "a"}, {Name: "a"}}})
			}, ErrInvalidRecord, `duplicate column name "a"`},
		{"key names no column", KindSnapshot, nil,
			func(e *Encoder) error {
				return e.WriteTable(&Table{Schema: "s", Name: "t", Columns: []Column{{Name: "a"}}, PrimaryKey: []string{"b"}})
			}, ErrInvalidRecord, "primary_key names no column"},
		{"year beyond 9999", KindChanges, nil,
			func(e *Encoder) error {
				return e.WriteChange(&Change{Op: OpBegin, CommitTime: time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)})
			}, ErrInvalidRecord, "year outside 0-9999"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var buf bytes.Buffer
			e := NewEncoder(&buf)
			require.NoError(t, e.WriteHeader(Header{Kind: tt.kind}))
			if tt.setup != nil {
				tt.setup(t, e)
			}
			require.NoError(t, e.Flush())
			before := buf.Len()

			err := tt.write(e)
			var ee *EncodeError
			require.ErrorAs(t, err, &ee)
			assert.ErrorIs(t, err, tt.sentinel)
			assert.Contains(t, err.Error(), tt.msg)
			require.NoError(t, e.Flush())
			assert.Equal(t, before, buf.Len(), "nothing of a refused record is written")
		})
	}
}

func withTable(tbl *Table) func(t testing.TB, e *Encoder) {
	return func(t testing.TB, e *Encoder) { require.NoError(t, e.WriteTable(tbl)) }
}

func withTx(tbl *Table) func(t testing.TB, e *Encoder) {
	return func(t testing.TB, e *Encoder) {
		if tbl != nil {
			require.NoError(t, e.WriteTable(tbl))
		}
		require.NoError(t, e.WriteChange(&Change{Op: OpBegin, XID: 1}))
	}
}

// TestEncoderUsableAfterRefusal: a refused record leaves a valid stream.
func TestEncoderUsableAfterRefusal(t *testing.T) {
	t.Parallel()
	tbl := testTable()
	data := encode(t, Header{Kind: KindSnapshot}, func(e *Encoder) {
		require.NoError(t, e.WriteTable(tbl))
		require.Error(t, e.WriteRow(tbl.TableName(), Row{Text("1"), Text("\xff"), Null()}))
		require.NoError(t, e.WriteRow(tbl.TableName(), Row{Text("1"), Text("ok"), Null()}))
		require.NoError(t, e.WriteEnd(3))
	})
	_, recs, err := decodeAll(data)
	require.NoError(t, err)
	require.Len(t, recs, 3)
	assert.Equal(t, Row{Text("1"), Text("ok"), Null()}, recs[1].Row)
}

// TestEncoderWriteErrorIsFinal: an error of the writer comes back, wrapped,
// from every later call.
func TestEncoderWriteErrorIsFinal(t *testing.T) {
	t.Parallel()
	boom := errors.New("disk full")
	e := NewEncoder(failWriter{boom})
	require.NoError(t, e.WriteHeader(Header{Kind: KindSnapshot}), "buffered")
	err := e.Flush()
	require.ErrorIs(t, err, boom)
	assert.Contains(t, err.Error(), "canonical: write: disk full")
	assert.ErrorIs(t, e.WriteTable(testTable()), boom)
	assert.ErrorIs(t, e.WriteEnd(1), boom)
}

// TestAppendString checks the JSON string escaping against encoding/json,
// for every ASCII byte and assorted UTF-8.
func TestAppendString(t *testing.T) {
	t.Parallel()
	var inputs []string
	for c := range 128 {
		inputs = append(inputs, string(rune(c)), "a"+string(rune(c))+"b")
	}
	inputs = append(inputs, "", "日本語", "😀", "\u2028\u2029", "\ufffd", "é\x00é", strings.Repeat(`\"`, 100))
	for _, in := range inputs {
		out, bad := appendString(nil, in)
		require.Equal(t, -1, bad, "%q", in)
		var back string
		require.NoError(t, json.Unmarshal(out, &back), "%s", out)
		assert.Equal(t, in, back)
		assert.True(t, utf8.Valid(out))
		for _, c := range out {
			assert.False(t, c < 0x20, "no raw control characters in %q", out)
		}
	}
	got, _ := appendString(nil, "\x00\x1f\n\"\\\x7f<>&\u2028")
	assert.Equal(t, `"\u0000\u001f\n\"\\`+"\x7f<>&\u2028"+`"`, string(got))

	for in, off := range map[string]int{"\xff": 0, "ab\xc3": 2, "é\xe9x": 2, "\xed\xa0\x80": 0 /* a surrogate */} {
		_, bad := appendString(nil, in)
		assert.Equal(t, off, bad, "%q", in)
	}
}
