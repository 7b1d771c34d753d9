package canonical

import (
	"bytes"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// lineChanges is one transaction of every kind of change, on a table with
// odd identifiers and values of every state.
func lineChanges() []*Change {
	odd := oddTable()
	cols := odd.Columns
	return []*Change{
		{Op: OpBegin, XID: 745, Position: 0x16B3748, CommitTime: testTime},
		{Op: OpInsert, XID: 745, Position: 0x16B3748, Schema: odd.Schema, Table: odd.Name, Columns: cols,
			New: Row{Text("1"), Text("a\nb"), Null(), Text(""), Text("é\x00")}},
		{Op: OpUpdate, XID: 745, Position: 0x16B3748, Schema: odd.Schema, Table: odd.Name, Columns: cols,
			New: Row{Text("1"), Unchanged(), Null(), Text("b"), Unchanged()},
			Old: Row{Text("1"), Unchanged(), Null(), Null(), Null()}},
		{Op: OpDelete, XID: 745, Position: 0x16B3748, Schema: odd.Schema, Table: odd.Name, Columns: cols,
			Old: Row{Text("2"), Null(), Null(), Null(), Null()}},
		{Op: OpTruncate, XID: 745, Position: 0x16B3748, Truncated: []TableName{odd.TableName(), {Schema: "public", Name: "b"}},
			Cascade: true, RestartIdentity: true},
		{Op: OpMessage, XID: 745, Position: 0x16B3748, Message: &Message{Transactional: true, Prefix: "app/ü", Content: []byte{0, 1, 2, 0xFF}}},
		{Op: OpDDL, XID: 745, Position: 0x16B3748, DDL: &DDL{Tag: "CREATE INDEX", Statement: "CREATE INDEX i ON t (b)", SearchPath: "public",
			Objects: []DDLObject{{Type: "index", Identity: "public.i"}}}},
		{Op: OpCommit, XID: 745, Position: 0x16B3790, CommitTime: testTime},
		{Op: OpMessage, Position: 0x16B3800, Message: &Message{Prefix: "between transactions"}},
	}
}

// streamSum matches the checksum member ending a stream's checkpoint line.
var streamSum = regexp.MustCompile(`,"sum":"[0-9a-f]{8}"\}\n$`)

// TestAppendChangeWritesStreamLines: a change travels as exactly the lines
// an Encoder writes for it in a stream (its table record first for a row
// change), but for the checksum a stream's checkpoints carry, so a message
// and a stream line are one format.
func TestAppendChangeWritesStreamLines(t *testing.T) {
	t.Parallel()
	for _, ch := range lineChanges() {
		t.Run(ch.Op.String(), func(t *testing.T) {
			t.Parallel()
			got, err := AppendChange([]byte("kept"), ch)
			require.NoError(t, err)
			inTx := ch.Op != OpBegin && (ch.Op != OpMessage || ch.Message.Transactional)
			stream := encode(t, Header{Kind: KindChanges}, func(e *Encoder) {
				if inTx {
					require.NoError(t, e.WriteChange(&Change{Op: OpBegin, XID: ch.XID, CommitTime: testTime}))
				}
				require.NoError(t, e.WriteChange(ch))
			})
			skip := 1 // the header
			if inTx {
				skip++
			}
			lines := strings.SplitAfterN(string(stream), "\n", skip+1)
			// A stream's checkpoints may carry a checksum of the stream; a
			// change on its own carries none.
			line := streamSum.ReplaceAllString(lines[skip], "}\n")
			assert.Equal(t, "kept"+line, string(got))
		})
	}
}

// TestParseChangeRoundTrip: every change reads back as it was written, but
// the commit time of the changes inside a transaction, which their begin
// record carries in a stream.
func TestParseChangeRoundTrip(t *testing.T) {
	t.Parallel()
	for _, ch := range lineChanges() {
		data, err := AppendChange(nil, ch)
		require.NoError(t, err)
		got, err := ParseChange(data)
		require.NoError(t, err, "%s", data)
		want := *ch
		assert.Equal(t, want, got, "%s", data)

		// The last newline may be missing.
		got, err = ParseChange(bytes.TrimSuffix(data, []byte("\n")))
		require.NoError(t, err)
		assert.Equal(t, want, got)
	}
}

// TestParseChangeValues: values keep their three states (text, NULL,
// unchanged) and their exact text.
func TestParseChangeValues(t *testing.T) {
	t.Parallel()
	ch := lineChanges()[2] // the update
	data, err := AppendChange(nil, ch)
	require.NoError(t, err)
	got, err := ParseChange(data)
	require.NoError(t, err)
	assert.True(t, got.New[1].IsUnchanged())
	assert.True(t, got.New[2].IsNull())
	assert.True(t, got.Old[1].IsUnchanged())
	assert.Equal(t, []string{`"quoted"`, "tab\there"}, got.Unchanged())
	v, ok := got.Value("日本語😀")
	require.True(t, ok)
	assert.Equal(t, "b", v.String())
}

// TestParseChangeRefuses: anything but one well-formed change is an error
// naming the line.
func TestParseChangeRefuses(t *testing.T) {
	t.Parallel()
	insert, err := AppendChange(nil, lineChanges()[1])
	require.NoError(t, err)
	tableLine, insertLine, _ := strings.Cut(string(insert), "\n")
	commit, err := AppendChange(nil, lineChanges()[7])
	require.NoError(t, err)
	tests := []struct {
		name     string
		data     string
		sentinel error
		line     int
		msg      string
	}{
		{"empty", "", ErrOrder, 1, "no change record"},
		{"table record alone", tableLine + "\n", ErrOrder, 2, "no change record"},
		{"row change without its table", insertLine, ErrUnknownTable, 1, "before any table record"},
		{"two changes", string(commit) + string(commit), ErrOrder, 2, "a commit record after the change"},
		{"two table records", tableLine + "\n" + string(insert), ErrOrder, 2, "a second table record"},
		{"table record before a commit", tableLine + "\n" + string(commit), ErrOrder, 2, "a table record before a commit record"},
		{"a header", `{"t":"header","format":"siphon.jsonl","version":1,"kind":"changes","position":"0/0"}`, ErrOrder, 1, "a stream's header record"},
		{"an end record", `{"t":"end","position":"0/1","records":1}`, ErrOrder, 1, "a stream's end record"},
		{"a row", `{"t":"row","schema":"s","table":"t","values":[]}`, ErrOrder, 1, "a stream's row record"},
		{"not JSON", "insert into t", ErrSyntax, 1, ""},
		{"blank line first", "\n" + string(commit), ErrSyntax, 1, "blank line"},
		{"invalid UTF-8", `{"t":"message","xid":1,"position":"0/1","transactional":true,"prefix":"caf` + "\xe9" + `","content":""}`, ErrInvalidUTF8, 1, ""},
		{"values for other columns", tableLine + "\n" + strings.Replace(insertLine, `"new":["1",`, `"new":[`, 1), ErrInvalidRecord, 2, "4 values for the 5 columns"},
		{"insert of another table", tableLine + "\n" + strings.Replace(insertLine, `"table":"tab le`, `"table":"other`, 1), ErrUnknownTable, 2, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := ParseChange([]byte(tt.data))
			var de *DecodeError
			require.ErrorAs(t, err, &de)
			assert.ErrorIs(t, err, tt.sentinel)
			assert.Equal(t, tt.line, de.Line)
			assert.Contains(t, err.Error(), tt.msg)
		})
	}
}

// TestAppendChangeRefuses: what the Encoder refuses, and a row change
// without columns, is an *EncodeError and leaves dst as it was.
func TestAppendChangeRefuses(t *testing.T) {
	t.Parallel()
	tbl := testTable()
	tests := []struct {
		name     string
		ch       *Change
		sentinel error
		msg      string
	}{
		{"nil", nil, ErrInvalidRecord, "nil change"},
		{"unknown op", &Change{Op: 42}, ErrInvalidRecord, "unknown op"},
		{"no columns", &Change{Op: OpInsert, Schema: "public", Table: "t", New: Row{Text("1")}}, ErrInvalidRecord, "has none"},
		{"wrong length", &Change{Op: OpInsert, Schema: "public", Table: "t", Columns: tbl.Columns, New: Row{Text("1")}},
			ErrInvalidRecord, "1 new and 0 old values for 3 columns"},
		{"insert without new", &Change{Op: OpInsert, Schema: "public", Table: "t", Columns: tbl.Columns}, ErrInvalidRecord, "without new values"},
		{"invalid UTF-8 value", &Change{Op: OpInsert, Schema: "public", Table: "t", Columns: tbl.Columns,
			New: Row{Text("1"), Text("caf\xe9"), Null()}}, ErrInvalidUTF8, `column "body"`},
		{"invalid UTF-8 table name", &Change{Op: OpDelete, Schema: "public", Table: "caf\xe9", Columns: tbl.Columns,
			Old: Row{Text("1"), Null(), Null()}}, ErrInvalidUTF8, "its table record"},
		{"duplicate column", &Change{Op: OpInsert, Schema: "s", Table: "t", Columns: []Column{{Name: "a"}, {Name: "a"}},
			New: Row{Null(), Null()}}, ErrInvalidRecord, `duplicate column name "a"`},
		{"message without Message", &Change{Op: OpMessage}, ErrInvalidRecord, "without a Message"},
		{"invalid UTF-8 truncated table", &Change{Op: OpTruncate, Truncated: []TableName{{Schema: "s", Name: "caf\xe9"}}}, ErrInvalidUTF8, ""},
		{"year beyond 9999", &Change{Op: OpCommit, CommitTime: time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)}, ErrInvalidRecord, "year outside 0-9999"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			dst := []byte("kept")
			got, err := AppendChange(dst, tt.ch)
			var ee *EncodeError
			require.ErrorAs(t, err, &ee)
			assert.ErrorIs(t, err, tt.sentinel)
			assert.Contains(t, err.Error(), tt.msg)
			assert.Equal(t, "kept", string(got))
		})
	}
}

// FuzzParseChange: ParseChange never panics, and what it accepts writes
// back to bytes that read back the same.
func FuzzParseChange(f *testing.F) {
	for _, ch := range lineChanges() {
		data, err := AppendChange(nil, ch)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Add([]byte(`{"t":"commit","xid":1,"position":"0/1","commit_time":"2026-01-01T00:00:00Z"}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		ch, err := ParseChange(data)
		if err != nil {
			return
		}
		again, err := AppendChange(nil, &ch)
		if err != nil {
			t.Fatalf("a parsed change does not write back: %v\n%q", err, data)
		}
		back, err := ParseChange(again)
		if err != nil {
			t.Fatalf("written back, it does not parse: %v\n%q", err, again)
		}
		if !assert.ObjectsAreEqual(ch, back) {
			t.Fatalf("round trip changed the change:\n%q\n%q", data, again)
		}
	})
}
