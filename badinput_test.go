package siphon_test

import (
	"bytes"
	"context"
	"errors"
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
// hold NUL bytes, invalid UTF-8 or garbage, each inside the stream's only
// transaction: each is a decode error that names the line, and the target
// is untouched.
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
		"cut mid-transaction":    {join(lines[:4]...) + lines[4][:10], canonical.ErrTruncated},
		"cut after a row":        {join(lines[:5]...), canonical.ErrTruncated},
		"corrupted JSON":         {replaceIn(4, `"two"]`, `"two"`), canonical.ErrSyntax},
		"value of another type":  {replaceIn(4, `"new":["2"`, `"new":[2`), canonical.ErrInvalidRecord},
		"row before its begin":   {join(lines[0], lines[1], lines[3], lines[2], lines[4], lines[5], lines[6]), canonical.ErrOrder},
		"duplicated header":      {join(lines[0], lines[0], join(lines[1:]...)), nil},
		"duplicated begin":       {join(lines[0], lines[1], lines[2], lines[2], join(lines[3:]...)), canonical.ErrOrder},
		"wrong version":          {replaceIn(0, `"version":1`, `"version":2`), canonical.ErrUnsupportedVersion},
		"NUL byte":               {replaceIn(4, `"two"`, "\"t\x00o\""), canonical.ErrSyntax},
		"invalid UTF-8":          {replaceIn(4, `"two"`, "\"t\xffo\""), canonical.ErrInvalidUTF8},
		"garbage":                {"\x89PNG\r\n\x1a\n" + strings.Repeat("\x00\xff", 100), nil},
		"line of 100 MB":         {replaceIn(4, `"two"`, `"`+strings.Repeat("x", 100<<20)+`"`), canonical.ErrLineTooLong},
		"unknown table":          {replaceIn(4, `"table":"t"`, `"table":"nope"`), canonical.ErrUnknownTable},
		"commit position behind": {replaceIn(5, `"position":"0/2100"`, `"position":"0/FFF"`), canonical.ErrInvalidRecord},
	}
	for name, tc := range cases {
		err := target.ConsumeCanonical(context.Background(), strings.NewReader(tc.stream))
		require.Error(t, err, name)
		if tc.want != nil {
			assert.ErrorIs(t, err, tc.want, name)
		}
		var decodeErr *canonical.DecodeError
		var gapErr *siphon.ApplyGapError
		if assert.True(t, errors.As(err, &decodeErr) || errors.As(err, &gapErr), "%s: a typed error, got %v", name, err) && decodeErr != nil {
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
