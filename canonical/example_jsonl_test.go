package canonical_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/siphondb/siphon/canonical"
)

// Encode a transaction as a recorded change stream.
func ExampleEncoder_WriteChange() {
	columns := []canonical.Column{
		{Name: "id", Type: "bigint", TypeOID: 20},
		{Name: "body", Type: "text", TypeOID: 25, Nullable: true},
	}
	at := time.Date(2026, 11, 30, 5, 0, 0, 123456000, time.UTC)

	enc := canonical.NewEncoder(os.Stdout)
	changes := []*canonical.Change{
		{Op: canonical.OpBegin, XID: 745, Position: 0x16B3748, CommitTime: at},
		{Op: canonical.OpUpdate, XID: 745, Position: 0x16B3748, Schema: "public", Table: "t", Columns: columns,
			New: canonical.Row{canonical.Text("1"), canonical.Unchanged()}},
		{Op: canonical.OpCommit, XID: 745, Position: 0x16B3790, CommitTime: at},
	}
	if err := enc.WriteHeader(canonical.Header{Kind: canonical.KindChanges, Start: 0x16B3700}); err != nil {
		fmt.Println(err)
		return
	}
	for _, ch := range changes {
		if err := enc.WriteChange(ch); err != nil {
			fmt.Println(err)
			return
		}
	}
	if err := enc.WriteEnd(0x16B3790); err != nil {
		fmt.Println(err)
	}
	// Output:
	// {"t":"header","format":"siphon.jsonl","version":1,"checksum":"crc32c","kind":"changes","position":"0/16B3700","sum":"57066459"}
	// {"t":"begin","xid":745,"position":"0/16B3748","commit_time":"2026-11-30T05:00:00.123456Z"}
	// {"t":"table","schema":"public","name":"t","columns":[{"name":"id","type":"bigint","type_oid":20,"nullable":false},{"name":"body","type":"text","type_oid":25,"nullable":true}]}
	// {"t":"update","schema":"public","table":"t","xid":745,"position":"0/16B3748","new":["1",null],"unchanged":["body"]}
	// {"t":"commit","xid":745,"position":"0/16B3790","commit_time":"2026-11-30T05:00:00.123456Z","sum":"ae8fb80c"}
	// {"t":"end","position":"0/16B3790","records":4,"sum":"909a704d"}
}

// Read a snapshot stream record by record.
func ExampleDecoder() {
	stream := `{"t":"header","format":"siphon.jsonl","version":1,"kind":"snapshot","position":"0/16B3748"}
{"t":"table","schema":"public","name":"t","columns":[{"name":"id","type":"bigint","nullable":false},{"name":"body","type":"text","nullable":true}]}
{"t":"row","schema":"public","table":"t","values":["1","hello"]}
{"t":"row","schema":"public","table":"t","values":["2",null]}
{"t":"end","position":"0/16B3748","records":3}
`
	dec := canonical.NewDecoder(strings.NewReader(stream))
	h, err := dec.Header()
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(h.Kind, "at", h.Start)
	for {
		rec, err := dec.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			fmt.Println(err)
			return
		}
		switch rec.Type {
		case canonical.RecordTable:
			fmt.Println("table", rec.Table.TableName(), len(rec.Table.Columns), "columns")
		case canonical.RecordRow:
			fmt.Println("row", rec.Row)
		case canonical.RecordEnd:
			fmt.Println("end: resume from", rec.Position)
		}
	}
	// Output:
	// snapshot at 0/16B3748
	// table public.t 2 columns
	// row [1 hello]
	// row [2 NULL]
	// end: resume from 0/16B3748
}

// A stream cut short reports ErrTruncated, which wraps io.ErrUnexpectedEOF.
func ExampleDecoder_truncated() {
	stream := `{"t":"header","format":"siphon.jsonl","version":1,"kind":"snapshot","position":"0/1"}
{"t":"table","schema":"public","name":"t","columns":[]}
`
	dec := canonical.NewDecoder(strings.NewReader(stream))
	var err error
	for err == nil {
		_, err = dec.Next()
	}
	var de *canonical.DecodeError
	fmt.Println(errors.As(err, &de), de.Line)
	fmt.Println(errors.Is(err, canonical.ErrTruncated), errors.Is(err, io.ErrUnexpectedEOF))
	fmt.Println(err)
	// Output:
	// true 3
	// true true
	// canonical: line 3: stream ends without an end record: unexpected EOF
}

// The Encoder refuses text that is not valid UTF-8 instead of corrupting it.
func ExampleEncodeError() {
	var buf bytes.Buffer
	enc := canonical.NewEncoder(&buf)
	table := &canonical.Table{Schema: "public", Name: "t", Columns: []canonical.Column{{Name: "body", Type: "text"}}}
	_ = enc.WriteHeader(canonical.Header{Kind: canonical.KindSnapshot})
	_ = enc.WriteTable(table)
	err := enc.WriteRow(table.TableName(), canonical.Row{canonical.Text("caf\xe9")}) // Latin-1, not UTF-8
	fmt.Println(errors.Is(err, canonical.ErrInvalidUTF8))
	fmt.Println(err)
	// Output:
	// true
	// canonical: encode row record of public.t, column "body": invalid UTF-8 at byte 3
}
