package siphon_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/siphondb/siphon"
	"github.com/siphondb/siphon/canonical"
)

// badInputStream is a valid change stream of one transaction inserting two
// rows into public.t, as JSONL lines.
func badInputStream(t *testing.T) []string {
	t.Helper()
	var buf bytes.Buffer
	enc := canonical.NewEncoder(&buf)
	require.NoError(t, enc.WriteHeader(canonical.Header{Kind: canonical.KindChanges, Engine: canonical.EnginePostgres,
		Start: 0x1000, SystemID: "7000000000000000001", Slot: "bad_input"}))
	cols := []canonical.Column{{Name: "id", Type: "integer", TypeOID: 23}, {Name: "v", Type: "text", TypeOID: 25, Nullable: true}}
	require.NoError(t, enc.WriteTable(&canonical.Table{Schema: "public", Name: "t", Columns: cols, PrimaryKey: []string{"id"},
		IdentityKey: []string{"id"}, ReplicaIdentity: canonical.IdentityDefault}))
	at := time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)
	for _, ch := range []canonical.Change{
		{Op: canonical.OpBegin, XID: 700, Position: 0x2000, CommitTime: at},
		{Op: canonical.OpInsert, XID: 700, Position: 0x2000, Schema: "public", Table: "t", Columns: cols,
			New: canonical.Row{canonical.Text("1"), canonical.Text("one")}},
		{Op: canonical.OpInsert, XID: 700, Position: 0x2000, Schema: "public", Table: "t", Columns: cols,
			New: canonical.Row{canonical.Text("2"), canonical.Text("two")}},
		{Op: canonical.OpCommit, XID: 700, Position: 0x2100, CommitTime: at},
	} {
		require.NoError(t, enc.WriteChange(&ch))
	}
	require.NoError(t, enc.WriteEnd(0x2100))
	return strings.SplitAfter(buf.String(), "\n")
}

// TestConsumeCanonicalRefusesBadInput feeds ConsumeCanonical streams that are
// cut, corrupted, reordered, duplicated, of another version, oversized, or
// hold NUL bytes, invalid UTF-8 or garbage, or whose values, positions or
// xids had a digit changed, each inside the stream's only transaction: each
// is a typed error (a decode error that names the line, or, for a stream
// that is not canonical at all, ErrNotCanonical), and the target is
// untouched. The stream is checked: an edit that leaves valid JSON is found
// by the checksum of the line, or of the commit that follows it.
func TestConsumeCanonicalRefusesBadInput(t *testing.T) {
	t.Parallel()
	dsn, admin := newDatabase(t)
	execSQL(t, admin, "CREATE TABLE t (id int PRIMARY KEY, v text)")
	target, err := siphon.Connect(context.Background(), dsn)
	require.NoError(t, err)
	defer target.Close()
	t.Cleanup(func() { target.ResetAppliedPosition(context.Background(), "7000000000000000001", "bad_input") })

	lines := badInputStream(t) // header, table, begin, insert, insert, commit, end, ""
	require.True(t, strings.Contains(lines[3], `"insert"`) && strings.Contains(lines[5], `"commit"`), "%q", lines)
	join := func(ls ...string) string { return strings.Join(ls, "") }
	replaceIn := func(i int, old, new string) string {
		ls := append([]string(nil), lines...)
		require.Contains(t, ls[i], old)
		ls[i] = strings.Replace(ls[i], old, new, 1)
		return join(ls...)
	}
	cases := map[string]struct {
		stream string
		want   error
	}{
		"cut mid-transaction":     {join(lines[:4]...) + lines[4][:10], canonical.ErrTruncated},
		"cut after a row":         {join(lines[:5]...), canonical.ErrTruncated},
		"corrupted JSON":          {replaceIn(4, `"two"]`, `"two"`), canonical.ErrSyntax},
		"value of another type":   {replaceIn(4, `"new":["2"`, `"new":[2`), canonical.ErrInvalidRecord},
		"a digit of a value":      {replaceIn(4, `"new":["2"`, `"new":["3"`), canonical.ErrChecksum},
		"a digit of a position":   {replaceIn(2, `"position":"0/2000"`, `"position":"0/2001"`), canonical.ErrChecksum},
		"a digit of an xid":       {replaceIn(3, `"xid":700`, `"xid":701`), canonical.ErrChecksum},
		"a commit position":       {replaceIn(5, `"position":"0/2100"`, `"position":"0/2101"`), canonical.ErrChecksum},
		"a row removed":           {join(lines[0], lines[1], lines[2], lines[3], lines[5], lines[6]), canonical.ErrChecksum},
		"row before its begin":    {join(lines[0], lines[1], lines[3], lines[2], lines[4], lines[5], lines[6]), canonical.ErrOrder},
		"duplicated header":       {join(lines[0], lines[0], join(lines[1:]...)), canonical.ErrChecksum},
		"duplicated begin":        {join(lines[0], lines[1], lines[2], lines[2], join(lines[3:]...)), canonical.ErrOrder},
		"wrong version":           {replaceIn(0, `"version":1`, `"version":2`), canonical.ErrChecksum},
		"NUL byte":                {replaceIn(4, `"two"`, "\"t\x00o\""), canonical.ErrSyntax},
		"invalid UTF-8":           {replaceIn(4, `"two"`, "\"t\xffo\""), canonical.ErrInvalidUTF8},
		"garbage":                 {"\x89PNG\r\n\x1a\n" + strings.Repeat("\x00\xff", 100), siphon.ErrNotCanonical},
		"line of 100 MB":          {replaceIn(4, `"two"`, `"`+strings.Repeat("x", 100<<20)+`"`), canonical.ErrLineTooLong},
		"unknown table":           {replaceIn(4, `"table":"t"`, `"table":"nope"`), canonical.ErrUnknownTable},
		"commit position behind":  {replaceIn(5, `"position":"0/2100"`, `"position":"0/FFF"`), canonical.ErrChecksum},
		"checksums taken away":    {strings.Join(uncheck(lines), ""), siphon.ErrUnchecked},
		"a pg_dump archive":       {"PGDMP\x01\x0f\x00\x04\x08\x01\x01\x01", siphon.ErrNotCanonical},
		"a full backup envelope":  {string(dumpEnvelope(t)), siphon.ErrNotCanonical},
		"an empty stream":         {"", canonical.ErrTruncated},
		"whitespace and a header": {"  \n" + join(lines...), canonical.ErrSyntax},
	}
	for name, tc := range cases {
		err := target.ConsumeCanonical(context.Background(), strings.NewReader(tc.stream))
		require.Error(t, err, name)
		assert.ErrorIs(t, err, tc.want, name)
		var decodeErr *canonical.DecodeError
		if errors.As(err, &decodeErr) {
			assert.Positive(t, decodeErr.Line, "%s: the error names the line", name)
		}
		assert.Less(t, len(err.Error()), 1000, "%s: the message does not quote a huge line", name)

		var rows int
		require.NoError(t, admin.QueryRow(context.Background(), "SELECT count(*) FROM t").Scan(&rows))
		assert.Zero(t, rows, "%s: nothing applied", name)
		pos, err := target.AppliedPosition(context.Background())
		require.NoError(t, err)
		assert.True(t, pos.IsZero(), "%s: no position recorded, got %v", name, pos)
	}

	// The intact stream applies, so the cases above failed for their defect.
	require.NoError(t, target.ConsumeCanonical(context.Background(), strings.NewReader(join(lines...))))
	var rows int
	require.NoError(t, admin.QueryRow(context.Background(), "SELECT count(*) FROM t").Scan(&rows))
	assert.Equal(t, 2, rows)
}

// uncheck removes the checksum members of a stream's lines, as a stream
// written by hand (or by an older siphon) would lack them.
func uncheck(lines []string) []string {
	out := make([]string, len(lines))
	for i, l := range lines {
		l = strings.Replace(l, `"checksum":"crc32c",`, "", 1)
		if at := strings.Index(l, `,"sum":"`); at >= 0 {
			l = l[:at] + "}\n"
		}
		out[i] = l
	}
	return out
}

// dumpEnvelope returns the start of an envelope holding a pg_dump archive.
func dumpEnvelope(t *testing.T) []byte {
	t.Helper()
	var buf bytes.Buffer
	ew, err := canonical.NewEnvelopeWriter(&buf, canonical.EnvelopeHeader{Kind: canonical.KindDump, Body: canonical.BodyPgDumpCustom,
		Engine: canonical.EnginePostgres, Start: 0x1000})
	require.NoError(t, err)
	_, err = ew.Write([]byte("PGDMP"))
	require.NoError(t, err)
	require.NoError(t, ew.Close())
	return buf.Bytes()
}

// TestConsumeCanonicalStopsAtTheDamage consumes a checked stream of five
// transactions damaged in its third (a digit of a value changed; the
// transaction removed; two transactions swapped): the first two are
// applied and recorded, nothing of the third or later, and the error is an
// ErrChecksum naming the line. Consuming the intact stream afterwards
// applies the rest, and the target holds exactly the source's rows.
func TestConsumeCanonicalStopsAtTheDamage(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	items := canonical.Table{Schema: "public", Name: "items", Columns: []canonical.Column{
		{Name: "id", Type: "integer", TypeOID: 23}, {Name: "qty", Type: "integer", TypeOID: 23, Nullable: true}},
		PrimaryKey: []string{"id"}, IdentityKey: []string{"id"}, ReplicaIdentity: canonical.IdentityDefault}
	name := items.TableName()
	s := newStream(t, canonical.KindIncremental, 0x100, "damage", items)
	var ends []canonical.Position
	for i := 1; i <= 5; i++ {
		ends = append(ends, s.tx(ins(name, tv(fmt.Sprint(i)), tv(fmt.Sprint(50070+i)))))
	}
	intact := s.done()
	txLines := func(data []byte) [][]byte { // header+table, tx1..tx5, end
		ls := bytes.SplitAfter(data, []byte("\n"))
		out := [][]byte{bytes.Join(ls[:2], nil)}
		for i := range 5 {
			out = append(out, bytes.Join(ls[2+3*i:5+3*i], nil))
		}
		return append(out, bytes.Join(ls[17:], nil))
	}
	parts := txLines(intact)
	cases := map[string][]byte{
		"a digit of a value":       bytes.Replace(intact, []byte(`"50073"`), []byte(`"10073"`), 1),
		"a transaction removed":    bytes.Join([][]byte{parts[0], parts[1], parts[2], parts[4], parts[5], parts[6]}, nil),
		"two transactions swapped": bytes.Join([][]byte{parts[0], parts[1], parts[2], parts[4], parts[3], parts[5], parts[6]}, nil),
	}
	for what, damaged := range cases {
		_, admin, c := applyTarget(t, `CREATE TABLE items (id int PRIMARY KEY, qty int)`)
		err := c.ConsumeCanonical(ctx, bytes.NewReader(damaged))
		require.ErrorIs(t, err, canonical.ErrChecksum, what)
		var de *canonical.DecodeError
		require.ErrorAs(t, err, &de, what)
		assert.Positive(t, de.Line, what)
		assert.Equal(t, ends[1], appliedPosition(t, c), "%s: the target stands at the last intact transaction", what)
		assert.Equal(t, [][]*string{{ptr("1"), ptr("50071")}, {ptr("2"), ptr("50072")}},
			rawRows(t, admin, "SELECT id::text, qty::text FROM items ORDER BY id"), "%s: nothing of the damaged part", what)

		require.NoError(t, c.ConsumeCanonical(ctx, bytes.NewReader(intact)), what)
		assert.Equal(t, ends[4], appliedPosition(t, c), what)
		assert.Equal(t, 5, count(t, admin, "SELECT count(*) FROM items WHERE qty = 50070 + id"), "%s: then the intact stream applies the rest", what)
	}
}
