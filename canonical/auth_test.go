package canonical

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var (
	testKey  = bytes.Repeat([]byte("k"), 32)
	otherKey = bytes.Repeat([]byte("o"), 32)
)

// keyedChanges returns a changes stream of n transactions, each with a
// schema change, authenticated with key (none when nil).
func keyedChanges(t testing.TB, key []byte, n int) []byte {
	tbl := testTable()
	var buf bytes.Buffer
	e := NewEncoder(&buf)
	if key != nil {
		require.NoError(t, e.SetKey(key))
	}
	require.NoError(t, e.WriteHeader(testHeader))
	require.NoError(t, e.WriteTable(tbl))
	for i := range n {
		pos, xid := Position(0x1000*(i+1)), uint32(700+i)
		require.NoError(t, e.WriteChange(&Change{Op: OpBegin, XID: xid, Position: pos, CommitTime: testTime}))
		require.NoError(t, e.WriteChange(&Change{Op: OpInsert, XID: xid, Position: pos, Schema: "public", Table: "t",
			Columns: tbl.Columns, New: Row{Text(fmt.Sprint(i)), Text("body"), Null()}}))
		require.NoError(t, e.WriteChange(&Change{Op: OpDDL, XID: xid, Position: pos, DDL: &DDL{Tag: "CREATE INDEX",
			Statement: fmt.Sprintf("CREATE INDEX i%d ON t (body)", i), SearchPath: "public"}}))
		require.NoError(t, e.WriteChange(&Change{Op: OpCommit, XID: xid, Position: pos + 0x40, CommitTime: testTime}))
	}
	require.NoError(t, e.WriteSequence(Sequence{Schema: "public", Name: "s", Value: 3, Called: true}))
	require.NoError(t, e.WriteEnd(Position(0x1000*n+0x40)))
	return buf.Bytes()
}

// resum recomputes every checksum of a stream, as anyone who changes a
// stream can: what is left to find the change is the MAC.
func resum(data []byte) []byte {
	var out []byte
	var crc uint32
	for _, line := range bytes.SplitAfter(data, []byte("\n")) {
		if len(line) == 0 {
			continue
		}
		body := bytes.TrimSuffix(line, []byte("\n"))
		if covered, _, ok := splitSum(body); ok {
			sum := crc32.Update(crc, castagnoli, covered)
			body = hex.AppendEncode(bytes.Clone(covered), []byte{byte(sum >> 24), byte(sum >> 16), byte(sum >> 8), byte(sum)})
			body = append(body, '"', '}')
			if bytes.HasSuffix(line, []byte("\n")) {
				body = append(body, '\n')
			}
			line = body
		}
		crc = crc32.Update(crc, castagnoli, line)
		out = append(out, line...)
	}
	return out
}

// decodeKeyed reads a whole stream with keys, and reports whether it was
// authenticated.
func decodeKeyed(data []byte, keys ...[]byte) (*Decoder, []Record, error) {
	d := NewDecoder(bytes.NewReader(data))
	d.SetKeys(keys...)
	if _, err := d.Header(); err != nil {
		return d, nil, err
	}
	var recs []Record
	for {
		r, err := d.Next()
		if err == io.EOF {
			return d, recs, nil
		}
		if err != nil {
			return d, recs, err
		}
		recs = append(recs, r)
	}
}

// TestAuthenticatedRoundTrip: a keyed stream reads back the same, names
// its key, is authenticated for a reader with the key (the current one or
// among previous ones) and checked only for one without.
func TestAuthenticatedRoundTrip(t *testing.T) {
	t.Parallel()
	data := keyedChanges(t, testKey, 3)
	plain := keyedChanges(t, nil, 3)
	_, want, err := decodeAll(plain)
	require.NoError(t, err)
	assert.Contains(t, string(data), `"auth":"hmac-sha256","key":"`+KeyID(testKey)+`"`)
	assert.Equal(t, 1+3+3+1+1, strings.Count(string(data), `"mac":"`), "header, ddl records, commits, sequence, end")

	for _, keys := range [][][]byte{{testKey}, {otherKey, testKey}} {
		d, got, err := decodeKeyed(data, keys...)
		require.NoError(t, err)
		assert.True(t, d.Authenticated())
		h, _ := d.Header()
		assert.Equal(t, KeyID(testKey), h.KeyID)
		assert.Equal(t, want, got)
		assert.True(t, strings.HasPrefix(d.Link(), "hmac-sha256:"+KeyID(testKey)+":"), d.Link())
	}
	d, got, err := decodeKeyed(data, otherKey)
	require.NoError(t, err, "a reader without the key still reads (and checks) it")
	assert.False(t, d.Authenticated())
	assert.Equal(t, want, got)

	// The Encoder's Link is the Decoder's.
	var buf bytes.Buffer
	e := NewEncoder(&buf)
	require.NoError(t, e.SetKey(testKey))
	require.NoError(t, e.WriteHeader(testHeader))
	require.NoError(t, e.WriteEnd(9))
	d, _, err = decodeKeyed(buf.Bytes(), testKey)
	require.NoError(t, err)
	assert.Equal(t, e.Link(), d.Link())

	// The unkeyed format is as before: no MAC, not authenticated.
	d, _, err = decodeKeyed(plain, testKey)
	require.NoError(t, err)
	assert.False(t, d.Authenticated())
	assert.NotContains(t, string(plain), `"mac"`)
}

// TestSetKeyRefusesShortKeysAndLateKeys.
func TestSetKeyRefusesShortKeysAndLateKeys(t *testing.T) {
	t.Parallel()
	e := NewEncoder(io.Discard)
	err := e.SetKey(make([]byte, 31))
	require.ErrorIs(t, err, ErrAuthentication)
	assert.NotContains(t, err.Error(), "\x00")
	require.NoError(t, e.WriteHeader(testHeader))
	require.ErrorIs(t, e.SetKey(testKey), ErrOrder)
}

// TestTamperedStreamsAreRefused runs the attacks on a keyed stream by
// someone without the key, each with every checksum recomputed: the
// Decoder that holds the key refuses each at the latest at the next
// checkpoint, and before returning a changed ddl record.
func TestTamperedStreamsAreRefused(t *testing.T) {
	t.Parallel()
	data := keyedChanges(t, testKey, 3)
	other := keyedChanges(t, otherKey, 3)
	lines := bytes.SplitAfter(data, []byte("\n"))
	join := func(ls ...[]byte) []byte { return bytes.Join(ls, nil) }
	ddlLine := 4 // header, table, begin, insert, ddl
	require.Contains(t, string(lines[ddlLine]), `"t":"ddl"`)

	for name, tampered := range map[string][]byte{
		"statement replaced": bytes.Replace(data, []byte("CREATE INDEX i0 ON t (body)"), []byte("COPY t TO PROGRAM 'touch /tmp/x'"), 1),
		"value changed":      bytes.Replace(data, []byte(`"new":["1"`), []byte(`"new":["9"`), 1),
		"record moved":       join(append(append([][]byte{}, lines[:3]...), append([][]byte{lines[ddlLine], lines[3]}, lines[ddlLine+1:]...)...)...),
		"record swapped from a stream with another key": join(append(append([][]byte{}, lines[:ddlLine]...), append([][]byte{bytes.SplitAfter(other, []byte("\n"))[ddlLine]}, lines[ddlLine+1:]...)...)...),
		"truncated then extended": join(append(append([][]byte{}, lines[:6]...), []byte(`{"t":"begin","xid":9,"position":"0/9000","commit_time":"2026-11-30T05:00:00.123456Z"}`+"\n"),
			[]byte(`{"t":"ddl","xid":9,"position":"0/9000","tag":"DROP TABLE","statement":"DROP TABLE t","search_path":"public"}`+"\n"),
			[]byte(`{"t":"commit","xid":9,"position":"0/9040","commit_time":"2026-11-30T05:00:00.123456Z","sum":"00000000"}`+"\n"),
			[]byte(`{"t":"end","position":"0/9040","records":9,"sum":"00000000"}`+"\n"))...),
		"key id claimed by another key": bytes.Replace(other, []byte(KeyID(otherKey)), []byte(KeyID(testKey)), 1),
		"header's MAC removed":          bytes.Replace(data, lines[0][bytes.Index(lines[0], []byte(macKey)):bytes.Index(lines[0], []byte(sumKey))], nil, 1),
		"a commit's MAC removed":        bytes.Replace(data, lines[5][bytes.Index(lines[5], []byte(macKey)):bytes.Index(lines[5], []byte(sumKey))], nil, 1),
	} {
		t.Run(name, func(t *testing.T) {
			tampered := resum(tampered)
			require.NotEqual(t, data, tampered)
			d, recs, err := decodeKeyed(tampered, testKey)
			require.ErrorIs(t, err, ErrAuthentication, "%s", tampered)
			assert.NotContains(t, err.Error(), string(testKey))
			for _, r := range recs {
				if r.Type == RecordChange && r.Change.Op == OpDDL {
					assert.True(t, bytes.Contains(data, []byte(r.Change.DDL.Statement)), "a changed ddl record was returned: %q", r.Change.DDL.Statement)
				}
			}
			_ = d
		})
	}

	// A stream stripped of its authentication decodes, and says it is not
	// authenticated: what it holds is then the reader's policy's to refuse.
	stripped := bytes.Replace(data, []byte(`,"auth":"hmac-sha256","key":"`+KeyID(testKey)+`"`), nil, 1)
	for _, l := range lines {
		if i := bytes.Index(l, []byte(macKey)); i >= 0 {
			stripped = bytes.Replace(stripped, l[i:bytes.Index(l, []byte(sumKey))], nil, 1)
		}
	}
	d, _, err := decodeKeyed(resum(stripped), testKey)
	require.NoError(t, err)
	assert.False(t, d.Authenticated())
	h, _ := d.Header()
	assert.Empty(t, h.KeyID)

	// A MAC in a stream whose header names no key is refused.
	_, _, err = decodeKeyed(resum(bytes.Replace(data, []byte(`,"auth":"hmac-sha256","key":"`+KeyID(testKey)+`"`), nil, 1)))
	require.ErrorIs(t, err, ErrAuthentication)
	require.False(t, errors.Is(err, ErrChecksum))
}

// TestKeyID: stable, 16 hex digits, distinct per key, and not the key.
func TestKeyID(t *testing.T) {
	t.Parallel()
	assert.Len(t, KeyID(testKey), 16)
	assert.Equal(t, KeyID(testKey), KeyID(bytes.Clone(testKey)))
	assert.NotEqual(t, KeyID(testKey), KeyID(otherKey))
	assert.NotContains(t, KeyID(testKey), hex.EncodeToString(testKey[:8]))
}

// TestRecorderSetKey: a recording made with a key is authenticated.
func TestRecorderSetKey(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	r := NewRecorder(&buf, 0)
	require.NoError(t, r.SetKey(testKey))
	require.NoError(t, r.Emit(Change{Op: OpBegin, XID: 1, Position: 0x10, CommitTime: testTime}))
	require.NoError(t, r.Emit(Change{Op: OpDDL, XID: 1, Position: 0x10, DDL: &DDL{Tag: "CREATE TABLE", Statement: "CREATE TABLE t ()", SearchPath: "public"}}))
	require.NoError(t, r.Emit(Change{Op: OpCommit, XID: 1, Position: 0x20, CommitTime: testTime}))
	require.NoError(t, r.Close())
	d, recs, err := decodeKeyed(buf.Bytes(), testKey)
	require.NoError(t, err)
	assert.True(t, d.Authenticated())
	assert.Len(t, recs, 4)
}
