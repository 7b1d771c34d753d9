package canonical

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestDecoderErrors(t *testing.T) {
	t.Parallel()
	row := func(values string) string {
		return `{"t":"row","schema":"public","table":"t","values":` + values + `}`
	}
	insert := func(fields string) string {
		return `{"t":"insert","schema":"public","table":"t","xid":7,"position":"0/10"` + fields + `}`
	}
	tests := []struct {
		name     string
		input    []byte
		line     int
		col      int // 0: not checked
		sentinel error
		msg      string // a substring of the error message
	}{
		{"empty stream", nil, 1, 0, ErrTruncated, "no header"},
		{"header only", lines(snapshotHeaderLine), 2, 0, ErrTruncated, "line 2: stream ends without an end record"},
		{"cut after a row", lines(snapshotHeaderLine, tableLine, row(`["1","x"]`)), 4, 0, ErrTruncated, "unexpected EOF"},
		{"cut inside a line", []byte(snapshotHeaderLine + "\n" + tableLine + "\n" + `{"t":"row","sch`), 3, 0, ErrTruncated, "last line is incomplete"},
		{"cut inside a character", []byte(snapshotHeaderLine + "\n" + tableLine + "\n" + `{"t":"row","schema":"public","table":"t","values":["1","caf` + "\xc3"), 3, 60, ErrTruncated, "last line is incomplete"},
		{"invalid UTF-8 on a last line without newline", []byte(snapshotHeaderLine + "\n" + tableLine + "\n" + row("[\"1\",\"caf\xc3\"]")), 3, 60, ErrInvalidUTF8, "byte 0xc3"},
		{"corrupted JSON", lines(snapshotHeaderLine, tableLine, `{"t":"row","schema":"public""table":"t"}`), 3, 29, ErrSyntax, "line 3, byte 29 (row record)"},
		{"not JSON at all", lines("PGDMP\x01\x0e"), 1, 1, ErrSyntax, "line 1, byte 1"},
		{"unknown record type", lines(snapshotHeaderLine, `{"t":"upsert"}`), 2, 0, ErrInvalidRecord, `unknown record type "upsert"`},
		{"no record type", lines(snapshotHeaderLine, `{"schema":"public"}`), 2, 0, ErrInvalidRecord, `no "t" member`},
		{"row before its table", lines(snapshotHeaderLine, row(`["1","x"]`), tableLine), 2, 0, ErrUnknownTable, "a row for public.t before any table record"},
		{"insert before its table", lines(changesHeaderLine, beginLine, insert(`,"new":["1","x"]`)), 3, 0, ErrUnknownTable, "an insert for public.t"},
		{"update before its table", lines(changesHeaderLine, beginLine, strings.Replace(insert(`,"new":["1","x"]`), "insert", "update", 1)), 3, 0, ErrUnknownTable, "an update for public.t"},
		{"delete before its table", lines(changesHeaderLine, beginLine, strings.Replace(insert(`,"old":["1","x"]`), "insert", "delete", 1)), 3, 0, ErrUnknownTable, "a delete for public.t"},
		{"duplicated header", lines(snapshotHeaderLine, tableLine, snapshotHeaderLine), 3, 0, ErrOrder, "second header"},
		{"first record not a header", lines(tableLine), 1, 0, ErrOrder, "starts with a table record"},
		{"wrong version", lines(`{"t":"header","format":"siphon.jsonl","version":2,"kind":"future","position":42}`), 1, 0, ErrUnsupportedVersion, "version 2"},
		{"version as string", lines(`{"t":"header","format":"siphon.jsonl","version":"1","kind":"snapshot","position":"0/1"}`), 1, 0, ErrUnsupportedVersion, `version "1"`},
		{"wrong format", lines(`{"t":"header","format":"other","version":1,"kind":"snapshot","position":"0/1"}`), 1, 0, ErrInvalidRecord, `format "other"`},
		{"unknown kind", lines(`{"t":"header","format":"siphon.jsonl","version":1,"kind":"dump","position":"0/1"}`), 1, 0, ErrInvalidRecord, `kind "dump"`},
		{"header without position", lines(`{"t":"header","format":"siphon.jsonl","version":1,"kind":"snapshot"}`), 1, 0, ErrInvalidRecord, `missing field "position"`},
		{"raw NUL byte in a string", lines(snapshotHeaderLine, tableLine, row("[\"1\",\"a\x00b\"]")), 3, 58, ErrSyntax, "raw control character 0x00"},
		{"raw NUL byte between values", lines(snapshotHeaderLine, tableLine, row("[\"1\",\x00\"b\"]")), 3, 0, ErrSyntax, "unexpected"},
		{"raw newline escape missing", lines(snapshotHeaderLine, tableLine, row("[\"1\",\"a\tb\"]")), 3, 0, ErrSyntax, "raw control character 0x09"},
		{"invalid UTF-8 in a value", lines(snapshotHeaderLine, tableLine, row("[\"1\",\"caf\xe9\"]")), 3, 60, ErrInvalidUTF8, "byte 0xe9"},
		{"invalid UTF-8 in a name", lines(snapshotHeaderLine, strings.Replace(tableLine, `"body"`, "\"b\xffdy\"", 1)), 2, 0, ErrInvalidUTF8, ""},
		{"lone surrogate escape", lines(snapshotHeaderLine, tableLine, row(`["1","\ud800x"]`)), 3, 0, ErrInvalidUTF8, `unpaired surrogate \ud800`},
		{"lone low surrogate", lines(snapshotHeaderLine, tableLine, row(`["1","\udc00"]`)), 3, 0, ErrInvalidUTF8, "unpaired surrogate"},
		{"bad escape", lines(snapshotHeaderLine, tableLine, row(`["1","\x41"]`)), 3, 0, ErrSyntax, `bad escape \x`},
		{"too few values", lines(snapshotHeaderLine, tableLine, row(`["1"]`)), 3, 0, ErrInvalidRecord, "1 values for the 2 columns of public.t"},
		{"too many values", lines(snapshotHeaderLine, tableLine, row(`["1","x",null]`)), 3, 0, ErrInvalidRecord, "3 values for the 2 columns"},
		{"value of the wrong type", lines(snapshotHeaderLine, tableLine, row(`[1,"x"]`)), 3, 0, ErrInvalidRecord, "values: invalid record: 1 is not a value (a string or null)"},
		{"record after end", lines(snapshotHeaderLine, `{"t":"end","position":"0/1","records":0}`, tableLine), 3, 0, ErrOrder, "after the end record"},
		{"end count mismatch", lines(snapshotHeaderLine, tableLine, `{"t":"end","position":"0/1","records":5}`), 3, 0, ErrInvalidRecord, "counts 5 records, the stream has 1"},
		{"bad position", lines(snapshotHeaderLine, `{"t":"end","position":"0/XYZ","records":0}`), 2, 0, ErrInvalidPosition, `"0/XYZ"`},
		{"position too long", lines(snapshotHeaderLine, `{"t":"end","position":"123456789/0","records":0}`), 2, 0, ErrInvalidRecord, "invalid position"},
		{"position not a string", lines(snapshotHeaderLine, `{"t":"end","position":17,"records":0}`), 2, 0, ErrInvalidRecord, "position: invalid record: 17 is not a string"},
		{"missing field", lines(snapshotHeaderLine, `{"t":"row","schema":"public","values":[]}`), 2, 0, ErrInvalidRecord, `missing field "table"`},
		{"duplicate field", lines(snapshotHeaderLine, tableLine, `{"t":"row","schema":"public","table":"t","table":"u","values":[]}`), 3, 0, ErrInvalidRecord, `duplicate field "table"`},
		{"row in a change stream", lines(changesHeaderLine, tableLine, row(`["1","x"]`)), 3, 0, ErrOrder, "a row in a changes stream"},
		{"change in a snapshot", lines(snapshotHeaderLine, beginLine), 2, 0, ErrOrder, "a begin record in a snapshot stream"},
		{"insert outside a transaction", lines(changesHeaderLine, tableLine, insert(`,"new":["1","x"]`)), 3, 0, ErrOrder, "insert outside a transaction"},
		{"commit without begin", lines(changesHeaderLine, commitLine), 2, 0, ErrOrder, "commit without begin"},
		{"commit not after its begin", lines(changesHeaderLine, beginLine, `{"t":"commit","xid":7,"position":"0/10","commit_time":"2026-11-30T05:00:00Z"}`), 3, 0, ErrInvalidRecord, "not after the commit LSN"},
		{"nested begin", lines(changesHeaderLine, beginLine, beginLine), 3, 0, ErrOrder, "begin inside an open transaction"},
		{"end inside a transaction", lines(changesHeaderLine, beginLine, `{"t":"end","position":"0/1","records":1}`), 3, 0, ErrOrder, "ends inside a transaction"},
		{"insert without new", lines(changesHeaderLine, tableLine, beginLine, insert("")), 4, 0, ErrInvalidRecord, "no new values"},
		{"unchanged names no column", lines(changesHeaderLine, tableLine, beginLine, insert(`,"new":["1",null],"unchanged":["nope"]`)), 4, 0, ErrInvalidRecord, `unchanged lists "nope", not a column`},
		{"unchanged slot not null", lines(changesHeaderLine, tableLine, beginLine, insert(`,"new":["1","x"],"unchanged":["body"]`)), 4, 0, ErrInvalidRecord, "whose value is not null"},
		{"blank line", lines(snapshotHeaderLine, "", tableLine), 2, 1, ErrSyntax, "blank line"},
		{"data after the record", lines(snapshotHeaderLine, tableLine+` {}`), 2, 0, ErrSyntax, "data after"},
		{"trailing comma", lines(snapshotHeaderLine, tableLine, row(`["1","x",]`)), 3, 0, ErrSyntax, "trailing comma"},
		{"deeply nested unknown field", lines(snapshotHeaderLine, `{"t":"table","x":`+strings.Repeat("[", 5000)+strings.Repeat("]", 5000)+`}`), 2, 0, ErrSyntax, "nested deeper"},
		{"bad base64", lines(changesHeaderLine, `{"t":"message","xid":0,"position":"0/1","transactional":false,"prefix":"p","content":"!!"}`), 2, 0, ErrInvalidRecord, "not standard base64"},
		{"xid too big", lines(changesHeaderLine, `{"t":"begin","xid":4294967296,"position":"0/10","commit_time":"2026-11-30T05:00:00Z"}`), 2, 0, ErrInvalidRecord, "does not fit in 32 bits"},
		{"negative xid", lines(changesHeaderLine, `{"t":"begin","xid":-1,"position":"0/10","commit_time":"2026-11-30T05:00:00Z"}`), 2, 0, ErrInvalidRecord, "not an unsigned integer"},
		{"bad commit time", lines(changesHeaderLine, `{"t":"begin","xid":1,"position":"0/10","commit_time":"yesterday"}`), 2, 0, ErrInvalidRecord, "not an RFC 3339 time"},
		{"duplicate column", lines(snapshotHeaderLine, `{"t":"table","schema":"s","name":"t","columns":[{"name":"a","type":"int","nullable":true},{"name":"a","type":"int","nullable":true}]}`), 2, 0, ErrInvalidRecord, `duplicate column name "a"`},
		{"key names no column", lines(snapshotHeaderLine, `{"t":"table","schema":"s","name":"t","columns":[],"primary_key":["id"]}`), 2, 0, ErrInvalidRecord, `primary_key names "id"`},
		{"column without type", lines(snapshotHeaderLine, `{"t":"table","schema":"s","name":"t","columns":[{"name":"a","nullable":true}]}`), 2, 0, ErrInvalidRecord, "needs name, type and nullable"},
		{"ddl outside a transaction", lines(changesHeaderLine, `{"t":"ddl","xid":7,"position":"0/10","tag":"CREATE TABLE","statement":"CREATE TABLE x ()","search_path":"public"}`), 2, 0, ErrOrder, "ddl outside a transaction"},
		{"ddl without a statement", lines(changesHeaderLine, beginLine, `{"t":"ddl","xid":7,"position":"0/10","tag":"CREATE TABLE","statement":"","search_path":"public"}`), 3, 0, ErrInvalidRecord, "without a statement"},
		{"ddl without its search_path", lines(changesHeaderLine, beginLine, `{"t":"ddl","xid":7,"position":"0/10","tag":"CREATE TABLE","statement":"CREATE TABLE x ()"}`), 3, 0, ErrInvalidRecord, `missing field "search_path"`},
		{"ddl object without identity", lines(changesHeaderLine, beginLine, `{"t":"ddl","xid":7,"position":"0/10","tag":"CREATE TABLE","statement":"CREATE TABLE x ()","search_path":"","objects":[{"type":"table"}]}`), 3, 0, ErrInvalidRecord, "needs type and identity"},
		{"ddl in a snapshot", lines(snapshotHeaderLine, `{"t":"ddl","xid":7,"position":"0/10","tag":"CREATE TABLE","statement":"CREATE TABLE x ()","search_path":"public"}`), 2, 0, ErrOrder, "a ddl record in a snapshot stream"},
		{"sequence inside a transaction", lines(changesHeaderLine, beginLine, `{"t":"sequence","schema":"public","name":"s","value":1,"called":true}`), 3, 0, ErrOrder, "a sequence inside a transaction"},
		{"sequence value out of range", lines(snapshotHeaderLine, `{"t":"sequence","schema":"public","name":"s","value":9223372036854775808,"called":true}`), 2, 0, ErrInvalidRecord, "not a 64-bit integer"},
		{"sequence value not a number", lines(snapshotHeaderLine, `{"t":"sequence","schema":"public","name":"s","value":"1","called":true}`), 2, 0, ErrInvalidRecord, "is not an integer"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, _, err := decodeAll(tt.input)
			require.Error(t, err)
			var de *DecodeError
			require.ErrorAs(t, err, &de, "every decoding error is a *DecodeError")
			assert.Equal(t, tt.line, de.Line, "line of %v", err)
			if tt.col != 0 {
				assert.Equal(t, tt.col, de.Col, "column of %v", err)
			}
			assert.ErrorIs(t, err, tt.sentinel)
			assert.Contains(t, err.Error(), tt.msg)
			if errors.Is(err, ErrTruncated) {
				assert.ErrorIs(t, err, io.ErrUnexpectedEOF)
			}
		})
	}
}

func TestDecoderLineTooLong(t *testing.T) {
	t.Parallel()
	big := `{"t":"row","schema":"public","table":"t","values":["1","` + strings.Repeat("x", 200_000) + `"]}`
	data := lines(snapshotHeaderLine, tableLine, big, `{"t":"end","position":"0/1","records":2}`)

	d := NewDecoder(bytes.NewReader(data))
	d.SetMaxLineBytes(100_000)
	_, err := d.Next()
	require.NoError(t, err)
	_, err = d.Next()
	var de *DecodeError
	require.ErrorAs(t, err, &de)
	assert.ErrorIs(t, err, ErrLineTooLong)
	assert.Equal(t, 3, de.Line)
	assert.Contains(t, err.Error(), "line 3: line too long: more than 100000 bytes")

	// The default limit takes it, through the long-line path of the reader.
	_, recs, err := decodeAll(data)
	require.NoError(t, err)
	require.Len(t, recs, 3)
	got, _ := recs[1].Row[1].Text()
	assert.Len(t, got, 200_000)

	// A small limit applies to lines shorter than the read buffer too.
	d = NewDecoder(bytes.NewReader(data))
	d.SetMaxLineBytes(50)
	_, err = d.Header()
	assert.ErrorIs(t, err, ErrLineTooLong)
}

func TestDecoderErrorsAreFinal(t *testing.T) {
	t.Parallel()
	d := NewDecoder(bytes.NewReader(lines(snapshotHeaderLine, `{"t":"row"`, tableLine)))
	_, err := d.Next()
	require.Error(t, err)
	_, err2 := d.Next()
	assert.Same(t, err, err2)
	_, err3 := d.Header()
	assert.NoError(t, err3, "the header was read fine")
}

func TestDecoderEOFAfterEnd(t *testing.T) {
	t.Parallel()
	d := NewDecoder(bytes.NewReader(lines(snapshotHeaderLine, `{"t":"end","position":"0/9","records":0}`)))
	r, err := d.Next()
	require.NoError(t, err)
	assert.Equal(t, Record{Type: RecordEnd, Position: 9}, r)
	for range 2 {
		_, err = d.Next()
		assert.Equal(t, io.EOF, err)
	}
}

func TestDecoderReadError(t *testing.T) {
	t.Parallel()
	boom := errors.New("disk on fire")
	d := NewDecoder(io.MultiReader(bytes.NewReader(lines(snapshotHeaderLine)), iotest.ErrReader(boom)))
	_, err := d.Next()
	var de *DecodeError
	require.ErrorAs(t, err, &de)
	assert.ErrorIs(t, err, boom)
	assert.Equal(t, 2, de.Line)
}

// TestDecoderLenient checks what a decoder accepts beyond the Encoder's own
// output: members in any order, unknown members, blanks, CRLF line ends, a
// missing final newline, escaped keys and values.
func TestDecoderLenient(t *testing.T) {
	t.Parallel()
	data := []byte(
		`{"format":"siphon.jsonl","kind":"changes","future":{"x":[1,2.5e-3,true,null,"s"]},"version":1,"position":"0/1","t":"header"}` + "\r\n" +
			` { "t" : "table" , "columns" : [ {"nullable":false,"type":"bigint","name":"id","extra":1} ], "name":"t", "schema":"public" } ` + "\r\n" +
			beginLine + "\n" +
			`{"values_ignored":[1],"new":["\u0031"],"position":"0/10","xid":7,"table":"t","schema":"pub\u006cic","t":"ins\u0065rt"}` + "\n" +
			commitLine + "\n" +
			`{"records":4,"position":"0/20","t":"end"}`)
	h, recs, err := decodeAll(data)
	require.NoError(t, err)
	assert.Equal(t, KindChanges, h.Kind)
	require.Len(t, recs, 5)
	ins := recs[2].Change
	require.NotNil(t, ins)
	assert.Equal(t, OpInsert, ins.Op)
	assert.Equal(t, "public", ins.Schema)
	assert.Equal(t, Row{Text("1")}, ins.New)
	assert.Equal(t, Record{Type: RecordEnd, Position: 0x20, Count: 4}, recs[4])
}

// TestDecoderTableRecordChanges checks that values align with the latest
// table record of their table.
func TestDecoderTableRecordChanges(t *testing.T) {
	t.Parallel()
	data := lines(snapshotHeaderLine, tableLine,
		`{"t":"row","schema":"public","table":"t","values":["1","x"]}`,
		`{"t":"table","schema":"public","name":"t","columns":[{"name":"id","type":"bigint","nullable":false}]}`,
		`{"t":"row","schema":"public","table":"t","values":["2"]}`,
		`{"t":"row","schema":"public","table":"t","values":["3","y"]}`,
	)
	_, recs, err := decodeAll(data)
	var de *DecodeError
	require.ErrorAs(t, err, &de)
	assert.Equal(t, 6, de.Line, "the old shape is no longer accepted")
	require.Len(t, recs, 4)
	assert.Len(t, recs[1].Table.Columns, 2, "an earlier record keeps its table")
	assert.Len(t, recs[3].Table.Columns, 1)
}

func TestRecordTypeString(t *testing.T) {
	t.Parallel()
	assert.Equal(t, "row", RecordRow.String())
	assert.Equal(t, "RecordType(99)", RecordType(99).String())
}
