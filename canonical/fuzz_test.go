package canonical

import (
	"bytes"
	"errors"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
)

// FuzzDecoder feeds arbitrary bytes to the Decoder: it never panics, every
// error is a *DecodeError with a line number, and a stream that decodes
// re-encodes to one that decodes to the same header and records.
// Seeds: testdata/fuzz/FuzzDecoder and the streams below.
func FuzzDecoder(f *testing.F) {
	odd := oddTable()
	f.Add(encode(f, testHeader, func(e *Encoder) {
		require.NoError(f, e.WriteTable(odd))
		require.NoError(f, e.WriteChange(&Change{Op: OpBegin, XID: 3, Position: 10, CommitTime: testTime}))
		require.NoError(f, e.WriteChange(&Change{Op: OpUpdate, XID: 3, Position: 10, Schema: odd.Schema, Table: odd.Name,
			Columns: odd.Columns, New: Row{Text("1"), Unchanged(), Null(), Text("\x00\"\\"), Text("é")},
			Old: Row{Text("1"), Null(), Null(), Null(), Null()}}))
		require.NoError(f, e.WriteChange(&Change{Op: OpMessage, XID: 3, Position: 10, Message: &Message{Transactional: true, Prefix: "p", Content: []byte{1, 2}}}))
		require.NoError(f, e.WriteChange(&Change{Op: OpTruncate, XID: 3, Position: 10, Truncated: []TableName{odd.TableName()}}))
		require.NoError(f, e.WriteChange(&Change{Op: OpDDL, XID: 3, Position: 10, DDL: &DDL{Tag: "ALTER TABLE",
			Statement: "ALTER TABLE t DROP COLUMN b", SearchPath: "public", Objects: []DDLObject{{Type: "table column", Identity: "public.t.b", Dropped: true}}}}))
		require.NoError(f, e.WriteChange(&Change{Op: OpCommit, XID: 3, Position: 20, CommitTime: testTime}))
		require.NoError(f, e.WriteSequence(Sequence{Schema: "public", Name: "s", Value: 42, Called: true}))
		require.NoError(f, e.WriteEnd(20))
	}))
	f.Add(lines(snapshotHeaderLine, tableLine, `{"t":"row","schema":"public","table":"t","values":["1",null]}`,
		`{"t":"end","position":"0/1","records":2}`))
	f.Add(lines(snapshotHeaderLine, tableLine, `{"t":"row","schema":"public","table":"t","values":["\ud83d\ude00","\u0000"]}`))
	f.Add(keyedChanges(f, testKey, 1))

	f.Fuzz(func(t *testing.T, data []byte) {
		// With the key, the MACs are verified too: any error is a
		// *DecodeError all the same.
		if _, _, err := decodeKeyed(data, testKey); err != nil {
			if _, ok := err.(*DecodeError); !ok {
				t.Fatalf("error %T is not a *DecodeError: %v", err, err)
			}
		}
		h, recs, err := decodeAll(data)
		if err != nil {
			de, ok := err.(*DecodeError)
			if !ok {
				t.Fatalf("error %T is not a *DecodeError: %v", err, err)
			}
			if de.Line < 1 || de.Err == nil {
				t.Fatalf("error without a line or cause: %#v", de)
			}
			_ = de.Error()
			return
		}
		var buf bytes.Buffer
		e := NewEncoder(&buf)
		require.NoError(t, e.WriteHeader(h))
		for _, r := range recs {
			require.NoError(t, e.WriteRecord(r), "re-encoding %v", r.Type)
		}
		require.NoError(t, e.Flush())
		h2, recs2, err := decodeAll(buf.Bytes())
		require.NoError(t, err, "re-encoded stream:\n%s", buf.Bytes())
		h.Checked = true // an Encoder writes checksums, whatever the stream had
		h.KeyID = ""     // and authenticates only with a key
		require.Equal(t, h, h2)
		require.Equal(t, recs, recs2)
	})
}

// FuzzRoundTrip encodes arbitrary values, names and message content, as a
// snapshot row and as an update, and checks they decode to what was
// encoded, or that the Encoder refused invalid UTF-8 with an *EncodeError.
// Seeds: testdata/fuzz/FuzzRoundTrip and the values below.
func FuzzRoundTrip(f *testing.F) {
	for _, vc := range valueClasses {
		for _, text := range vc.texts {
			if len(text) > 1000 {
				continue // large seeds make minimization crawl
			}
			f.Add(text, "", vc.class, uint8(0b011001), vc.typ, []byte(text))
		}
	}
	f.Add("a\x00b", "\u2028", `"quoted" col`, uint8(0b100110), "", []byte{0, 0xFF})
	f.Add("caf\xe9", "", "c", uint8(0xFF), "p", []byte(nil))

	f.Fuzz(func(t *testing.T, a, b, column string, states uint8, prefix string, content []byte) {
		tbl := &Table{Schema: "s " + column, Name: column, Columns: []Column{
			{Name: "id", Type: "bigint"},
			{Name: "a:" + column, Type: column, Nullable: true},
			{Name: "b:" + column, Type: "text", Nullable: true},
		}, PrimaryKey: []string{"id"}}
		// Two bits of states per value: 0 and 3 present, 1 NULL, 2 unchanged.
		value := func(text string, bits uint8, unchanged bool) Value {
			switch bits & 3 {
			case 1:
				return Null()
			case 2:
				if unchanged {
					return Unchanged()
				}
				return Null()
			}
			return Text(text)
		}
		newRow := Row{Text("1"), value(a, states, true), value(b, states>>2, true)}
		oldRow := Row{Text("1"), value(b, states>>4, false), value(a, states>>6, false)}
		snapRow := Row{Text("1"), value(a, states, false), value(b, states>>2, false)}
		valid := utf8.ValidString(column) && utf8.ValidString(prefix) && rowValid(newRow, oldRow)

		var buf bytes.Buffer
		e := NewEncoder(&buf)
		err := errors.Join(
			e.WriteHeader(Header{Kind: KindChanges, Slot: prefix}),
			e.WriteTable(tbl),
			e.WriteChange(&Change{Op: OpBegin, XID: 1, Position: 5, CommitTime: testTime}),
			e.WriteChange(&Change{Op: OpUpdate, XID: 1, Position: 5, Schema: tbl.Schema, Table: tbl.Name,
				Columns: tbl.Columns, New: newRow, Old: oldRow}),
			e.WriteChange(&Change{Op: OpMessage, XID: 1, Position: 5, Message: &Message{Transactional: true, Prefix: prefix, Content: content}}),
			e.WriteChange(&Change{Op: OpCommit, XID: 1, Position: 6, CommitTime: testTime}),
			e.WriteEnd(6),
		)
		if !valid {
			require.Error(t, err)
			var ee *EncodeError
			require.ErrorAs(t, err, &ee)
			require.ErrorIs(t, err, ErrInvalidUTF8)
			return
		}
		require.NoError(t, err)
		_, recs, err := decodeAll(buf.Bytes())
		require.NoError(t, err, "stream:\n%s", buf.Bytes())
		require.Len(t, recs, 6)
		require.Equal(t, tbl, recs[0].Table)
		up := recs[2].Change
		require.Equal(t, newRow, up.New)
		require.Equal(t, oldRow, up.Old)
		msg := recs[3].Change.Message
		require.Equal(t, prefix, msg.Prefix)
		require.True(t, bytes.Equal(content, msg.Content))

		buf.Reset()
		e = NewEncoder(&buf)
		require.NoError(t, errors.Join(
			e.WriteHeader(Header{Kind: KindSnapshot}),
			e.WriteTable(tbl),
			e.WriteRow(tbl.TableName(), snapRow),
			e.WriteEnd(6),
		))
		_, recs, err = decodeAll(buf.Bytes())
		require.NoError(t, err)
		require.Equal(t, snapRow, recs[1].Row)
	})
}

// rowValid reports whether the present values of rows are valid UTF-8.
func rowValid(rows ...Row) bool {
	for _, r := range rows {
		for _, v := range r {
			if s, ok := v.Text(); ok && !utf8.ValidString(s) {
				return false
			}
		}
	}
	return true
}

// FuzzChecksum replaces, deletes or inserts one byte of a checked stream:
// the Decoder never reads the changed stream to its end as if it were
// intact (but for the last newline, which no record needs: a stream may
// end without it). Seeds: testdata/fuzz/FuzzChecksum and the one below.
func FuzzChecksum(f *testing.F) {
	streams := [][]byte{checkedChanges(f, 2), checkedSnapshot(f, 8), keyedChanges(f, testKey, 2)}
	f.Add(uint8(0), uint8(0), uint16(40), byte('x'))
	f.Fuzz(func(t *testing.T, which, edit uint8, at uint16, v byte) {
		orig := streams[int(which)%len(streams)]
		i := int(at) % len(orig)
		var data []byte
		switch edit % 3 {
		case 0:
			data = bytes.Clone(orig)
			data[i] = v
		case 1:
			data = append(bytes.Clone(orig[:i]), orig[i+1:]...)
		default:
			data = append(append(bytes.Clone(orig[:i]), v), orig[i:]...)
		}
		if bytes.Equal(data, orig) || bytes.Equal(data, orig[:len(orig)-1]) {
			return
		}
		if _, _, err := decodeAll(data); err == nil {
			t.Fatalf("a stream changed at byte %d (edit %d, %q) decodes:\n%s", i, edit%3, v, data)
		}
	})
}

// FuzzAuthentication replaces, deletes or inserts one byte of an
// authenticated stream and recomputes every checksum, as someone without
// the key can: the Decoder that holds the key never reads the changed
// stream to its end as authenticated, and never returns a ddl record that
// is not one the key holder wrote. (Removing the authentication outright
// takes more than one byte; TestTamperedStreamsAreRefused covers it.)
func FuzzAuthentication(f *testing.F) {
	orig := keyedChanges(f, testKey, 2)
	f.Add(uint8(0), uint16(40), byte('x'))
	f.Add(uint8(1), uint16(300), byte('x'))
	f.Fuzz(func(t *testing.T, edit uint8, at uint16, v byte) {
		i := int(at) % len(orig)
		var data []byte
		switch edit % 3 {
		case 0:
			data = bytes.Clone(orig)
			data[i] = v
		case 1:
			data = append(bytes.Clone(orig[:i]), orig[i+1:]...)
		default:
			data = append(append(bytes.Clone(orig[:i]), v), orig[i:]...)
		}
		data = resum(data)
		if bytes.Equal(data, orig) || bytes.Equal(data, orig[:len(orig)-1]) {
			return
		}
		d, recs, err := decodeKeyed(data, testKey)
		if err == nil && d.Authenticated() {
			t.Fatalf("a stream changed at byte %d (edit %d, %q) authenticates:\n%s", i, edit%3, v, data)
		}
		if !d.Authenticated() {
			return
		}
		for _, r := range recs {
			if r.Type == RecordChange && r.Change.Op == OpDDL && !bytes.Contains(orig, []byte(`"statement":"`+r.Change.DDL.Statement+`"`)) {
				t.Fatalf("a changed ddl record was returned as authenticated: %q", r.Change.DDL.Statement)
			}
		}
	})
}
