package canonical

import (
	"bytes"
	"encoding/json"
	"io"
	"testing"

	"github.com/stretchr/testify/require"
)

// benchTable and benchRow are a typical row of 8 mixed columns.
var (
	benchTable = &Table{Schema: "public", Name: "orders", Columns: []Column{
		{Name: "id", Type: "bigint", TypeOID: 20},
		{Name: "customer", Type: "text", TypeOID: 25, Nullable: true},
		{Name: "amount", Type: "numeric(12,4)", TypeOID: 1700, Nullable: true},
		{Name: "created_at", Type: "timestamp with time zone", TypeOID: 1184},
		{Name: "paid", Type: "boolean", TypeOID: 16},
		{Name: "attrs", Type: "jsonb", TypeOID: 3802, Nullable: true},
		{Name: "note", Type: "text", TypeOID: 25, Nullable: true},
		{Name: "ref", Type: "uuid", TypeOID: 2950},
	}}
	benchRow = Row{
		Text("9007199254740993"),
		Text("Ada Lovelace"),
		Text("12345.6789"),
		Text("2026-11-30 05:00:00.123456+00"),
		Text("t"),
		Text(`{"tags": ["a", "b"], "note": "say \"hi\"", "n": 1.5}`),
		Null(),
		Text("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"),
	}
)

// benchRowLine is benchRow's row record, newline included.
func benchRowLine(b *testing.B) []byte {
	data := encode(b, Header{Kind: KindSnapshot}, func(e *Encoder) {
		require.NoError(b, e.WriteTable(benchTable))
		require.NoError(b, e.WriteRow(benchTable.TableName(), benchRow))
	})
	ls := bytes.SplitAfter(data, []byte("\n"))
	return ls[2]
}

func BenchmarkEncodeRow(b *testing.B) {
	e := NewEncoder(io.Discard)
	require.NoError(b, e.WriteHeader(Header{Kind: KindSnapshot}))
	require.NoError(b, e.WriteTable(benchTable))
	name := benchTable.TableName()
	b.SetBytes(int64(len(benchRowLine(b))))
	b.ReportAllocs()
	for b.Loop() {
		if err := e.WriteRow(name, benchRow); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "rows/s")
}

// repeatReader yields prefix once, then line forever.
type repeatReader struct {
	prefix, line []byte
	off          int
}

func (r *repeatReader) Read(p []byte) (int, error) {
	n := 0
	for n < len(p) {
		if len(r.prefix) > 0 {
			c := copy(p[n:], r.prefix)
			r.prefix = r.prefix[c:]
			n += c
			continue
		}
		c := copy(p[n:], r.line[r.off:])
		r.off = (r.off + c) % len(r.line)
		n += c
	}
	return n, nil
}

// BenchmarkDecodeRow decodes row records of 8 mixed columns; the
// encoding_json sibling unmarshals the same lines with encoding/json into a
// struct, for a ratio on the same machine.
func BenchmarkDecodeRow(b *testing.B) {
	line := benchRowLine(b)
	prefix := encode(b, Header{Kind: KindSnapshot}, func(e *Encoder) { require.NoError(b, e.WriteTable(benchTable)) })

	b.Run("siphon", func(b *testing.B) {
		d := NewDecoder(&repeatReader{prefix: prefix, line: line})
		_, err := d.Next() // the table record
		require.NoError(b, err)
		b.SetBytes(int64(len(line)))
		b.ReportAllocs()
		for b.Loop() {
			r, err := d.Next()
			if err != nil || len(r.Row) != 8 {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "rows/s")
	})
	b.Run("encoding_json", func(b *testing.B) {
		var rec struct {
			T      string    `json:"t"`
			Schema string    `json:"schema"`
			Table  string    `json:"table"`
			Values []*string `json:"values"`
		}
		b.SetBytes(int64(len(line)))
		b.ReportAllocs()
		for b.Loop() {
			rec.Values = nil
			if err := json.Unmarshal(line, &rec); err != nil || len(rec.Values) != 8 {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "rows/s")
	})
}

func TestEncodeRowAllocs(t *testing.T) {
	// Not parallel: testing.AllocsPerRun counts allocations process-wide.
	e := NewEncoder(io.Discard)
	require.NoError(t, e.WriteHeader(Header{Kind: KindChanges}))
	require.NoError(t, e.WriteTable(benchTable))
	require.NoError(t, e.WriteChange(&Change{Op: OpBegin}))
	name := benchTable.TableName()
	ch := &Change{Op: OpUpdate, Schema: name.Schema, Table: name.Name, Columns: benchTable.Columns,
		New: benchRow, Old: benchRow}
	allocs := testing.AllocsPerRun(1000, func() {
		if err := e.WriteChange(ch); err != nil {
			t.Fatal(err)
		}
	})
	require.Zero(t, allocs, "writing a change allocates nothing")

	e = NewEncoder(io.Discard)
	require.NoError(t, e.WriteHeader(Header{Kind: KindSnapshot}))
	require.NoError(t, e.WriteTable(benchTable))
	allocs = testing.AllocsPerRun(1000, func() {
		if err := e.WriteRow(name, benchRow); err != nil {
			t.Fatal(err)
		}
	})
	require.Zero(t, allocs, "writing a row allocates nothing")
}

// BenchmarkEncodeRowAuthenticated is BenchmarkEncodeRow in a stream
// authenticated with a key (Encoder.SetKey): the cost of the HMAC.
func BenchmarkEncodeRowAuthenticated(b *testing.B) {
	e := NewEncoder(io.Discard)
	require.NoError(b, e.SetKey(bytes.Repeat([]byte("k"), 32)))
	require.NoError(b, e.WriteHeader(Header{Kind: KindSnapshot}))
	require.NoError(b, e.WriteTable(benchTable))
	name := benchTable.TableName()
	b.SetBytes(int64(len(benchRowLine(b))))
	b.ReportAllocs()
	for b.Loop() {
		if err := e.WriteRow(name, benchRow); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "rows/s")
}

// BenchmarkDecodeRowAuthenticated is BenchmarkDecodeRow's siphon case in
// a stream authenticated with a key the Decoder holds.
func BenchmarkDecodeRowAuthenticated(b *testing.B) {
	key := bytes.Repeat([]byte("k"), 32)
	line := benchRowLine(b)
	var buf bytes.Buffer
	e := NewEncoder(&buf)
	require.NoError(b, e.SetKey(key))
	require.NoError(b, e.WriteHeader(Header{Kind: KindSnapshot}))
	require.NoError(b, e.WriteTable(benchTable))
	require.NoError(b, e.Flush())
	d := NewDecoder(&repeatReader{prefix: buf.Bytes(), line: line})
	d.SetKeys(key)
	_, err := d.Next() // the table record
	require.NoError(b, err)
	require.True(b, d.Authenticated())
	b.SetBytes(int64(len(line)))
	b.ReportAllocs()
	for b.Loop() {
		r, err := d.Next()
		if err != nil || len(r.Row) != 8 {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "rows/s")
}

// BenchmarkEncodeTransaction writes one-row transactions (begin, insert,
// commit: a checkpoint each), checked and authenticated.
func BenchmarkEncodeTransaction(b *testing.B) {
	for _, key := range []struct {
		name string
		key  []byte
	}{{"checked", nil}, {"authenticated", bytes.Repeat([]byte("k"), 32)}} {
		b.Run(key.name, func(b *testing.B) {
			e := NewEncoder(io.Discard)
			if key.key != nil {
				require.NoError(b, e.SetKey(key.key))
			}
			require.NoError(b, e.WriteHeader(Header{Kind: KindChanges}))
			require.NoError(b, e.WriteTable(benchTable))
			name := benchTable.TableName()
			begin, commit := &Change{Op: OpBegin}, &Change{Op: OpCommit}
			ins := &Change{Op: OpInsert, Schema: name.Schema, Table: name.Name, Columns: benchTable.Columns, New: benchRow}
			b.ReportAllocs()
			for b.Loop() {
				for _, ch := range []*Change{begin, ins, commit} {
					if err := e.WriteChange(ch); err != nil {
						b.Fatal(err)
					}
				}
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "tx/s")
		})
	}
}
