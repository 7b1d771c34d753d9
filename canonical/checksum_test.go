package canonical

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// checkedChanges returns a checked change stream of n transactions, each an
// insert and an update of table t, then a non-transactional message.
func checkedChanges(t testing.TB, n int) []byte {
	tbl := testTable()
	return encode(t, testHeader, func(e *Encoder) {
		require.NoError(t, e.WriteTable(tbl))
		for i := range n {
			pos := Position(0x1000 * (i + 1))
			id := Text(fmt.Sprint(50077 + i))
			require.NoError(t, e.WriteChange(&Change{Op: OpBegin, XID: uint32(700 + i), Position: pos, CommitTime: testTime}))
			require.NoError(t, e.WriteChange(&Change{Op: OpInsert, XID: uint32(700 + i), Position: pos, Schema: "public", Table: "t",
				Columns: tbl.Columns, New: Row{id, Text("body"), Null()}}))
			require.NoError(t, e.WriteChange(&Change{Op: OpUpdate, XID: uint32(700 + i), Position: pos, Schema: "public", Table: "t",
				Columns: tbl.Columns, New: Row{id, Unchanged(), Text("n")}, Old: Row{id, Null(), Null()}}))
			require.NoError(t, e.WriteChange(&Change{Op: OpCommit, XID: uint32(700 + i), Position: pos + 0x40, CommitTime: testTime}))
		}
		require.NoError(t, e.WriteChange(&Change{Op: OpMessage, Position: 0x900000, Message: &Message{Prefix: "p", Content: []byte("x")}}))
		require.NoError(t, e.WriteEnd(Position(0x1000*n+0x40)))
	})
}

// checkedSnapshot returns a checked snapshot of rows rows, long enough to
// carry checkpoints between rows.
func checkedSnapshot(t testing.TB, rows int) []byte {
	tbl := testTable()
	h := testHeader
	h.Kind = KindSnapshot
	return encode(t, h, func(e *Encoder) {
		require.NoError(t, e.WriteTable(tbl))
		for i := range rows {
			require.NoError(t, e.WriteRow(tbl.TableName(), Row{Text(fmt.Sprint(i)), Text(strings.Repeat("v", 200)), Null()}))
		}
		require.NoError(t, e.WriteEnd(h.End))
	})
}

// TestEveryChangedByteIsDetected changes each byte of checked streams in
// turn (to another digit, letter or byte) and decodes: every change is an
// error, and every error of a checksum is an ErrChecksum naming a line.
func TestEveryChangedByteIsDetected(t *testing.T) {
	t.Parallel()
	for name, data := range map[string][]byte{"changes": checkedChanges(t, 3), "snapshot": checkedSnapshot(t, 12)} {
		checksums := 0
		for i := range data {
			for _, v := range []byte{'1', 'x', data[i] ^ 0x20} {
				if v == data[i] {
					continue
				}
				changed := bytes.Clone(data)
				changed[i] = v
				_, _, err := decodeAll(changed)
				require.Error(t, err, "%s: byte %d changed from %q to %q", name, i, data[i], v)
				if errors.Is(err, ErrChecksum) {
					checksums++
					var de *DecodeError
					require.ErrorAs(t, err, &de)
					assert.Positive(t, de.Line)
				}
			}
		}
		t.Logf("%s: %d bytes, %d changes found by a checksum (the others broke the JSON first)", name, len(data), checksums)
		assert.Positive(t, checksums)
	}
}

// TestChecksumsCatchEditedTransactions removes, repeats and swaps whole
// transactions of a checked stream, fixing the end record's count as an
// editor would, and changes one digit of a value: each is an ErrChecksum at
// the commit that follows the edit, so a reader that applies a transaction
// only at its commit applies nothing of it.
func TestChecksumsCatchEditedTransactions(t *testing.T) {
	t.Parallel()
	data := checkedChanges(t, 3)
	ls := strings.Split(strings.TrimSuffix(string(data), "\n"), "\n")
	// Lines: header, table, then 4 per transaction, message, end.
	tx := func(i int) []string { return ls[2+4*i : 6+4*i] }
	rebuild := func(txs ...[]string) []byte {
		out := append([]string{ls[0], ls[1]}, concat(txs...)...)
		out = append(out, ls[len(ls)-2], strings.Replace(ls[len(ls)-1], `"records":14`, fmt.Sprintf(`"records":%d`, 2+4*len(txs)), 1))
		return []byte(strings.Join(out, "\n") + "\n")
	}
	cases := []struct {
		name    string
		changed []byte
		intact  int // transactions before the edit, delivered whole
	}{
		{"a transaction removed", rebuild(tx(0), tx(2)), 1},
		{"a transaction repeated", rebuild(tx(0), tx(1), tx(1), tx(2)), 2},
		{"two transactions swapped", rebuild(tx(1), tx(0), tx(2)), 0},
		{"a digit of a value", bytes.Replace(data, []byte(`"50078"`), []byte(`"10078"`), 1), 1},
		{"a digit of a position", bytes.Replace(data, []byte(`"0/2040"`), []byte(`"0/2041"`), 1), 1},
		{"a digit of an xid", bytes.Replace(data, []byte(`"xid":701,"position":"0/2040"`), []byte(`"xid":702,"position":"0/2040"`), 1), 1},
	}
	for _, tc := range cases {
		require.NotEqual(t, data, tc.changed, tc.name)
		_, recs, err := decodeAll(tc.changed)
		require.ErrorIs(t, err, ErrChecksum, tc.name)
		commits := []Position{}
		for _, r := range recs {
			if r.Type == RecordChange && r.Change.Op == OpCommit {
				commits = append(commits, r.Change.Position)
			}
		}
		want := []Position{0x1040, 0x2040}[:tc.intact]
		assert.Equal(t, want, commits[:min(len(commits), len(want))], tc.name)
		assert.Len(t, commits, tc.intact, "%s: only the transactions before the edit are delivered whole", tc.name)
	}
}

func concat(parts ...[]string) []string {
	var out []string
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// TestUncheckedStreams reads streams without checksums (hand-written), and
// damaged checksum members: a stream whose header has no sum is read as
// unchecked, with Checked false; one whose header was changed into an
// unchecked one while its records carry sums, or that names an algorithm
// without a sum, is an ErrChecksum.
func TestUncheckedStreams(t *testing.T) {
	t.Parallel()
	h, _, err := decodeAll(lines(changesHeaderLine, tableLine, beginLine, commitLine, `{"t":"end","position":"0/20","records":3}`))
	require.NoError(t, err)
	assert.False(t, h.Checked)

	data := checkedChanges(t, 1)
	header, rest, _ := bytes.Cut(data, []byte("\n"))
	covered, _, ok := splitSum(header)
	require.True(t, ok)
	plain := append(bytes.TrimSuffix(bytes.Replace(covered, []byte(`"checksum":"crc32c",`), nil, 1), []byte(`,"sum":"`)), '}')
	_, _, err = decodeAll(append(append(plain, '\n'), rest...))
	require.ErrorIs(t, err, ErrChecksum, "a sum in a stream whose header carries none")

	named := append(bytes.TrimSuffix(covered, []byte(`,"sum":"`)), '}')
	_, _, err = decodeAll(append(append(named, '\n'), rest...))
	require.ErrorIs(t, err, ErrChecksum, "a header that names crc32c without a sum")

	noSum := append(bytes.Clone(data[:bytes.LastIndex(data, []byte(sumKey))]), "}\n"...)
	_, _, err = decodeAll(noSum)
	require.ErrorIs(t, err, ErrChecksum, "an end record without its sum")

	// A sequence is set outside any transaction, so it is a checkpoint of
	// its own: one whose sum was taken off is refused as it is read.
	withSeq := encode(t, testHeader, func(e *Encoder) {
		require.NoError(t, e.WriteSequence(Sequence{Schema: "public", Name: "s", Value: 7, Called: true}))
		require.NoError(t, e.WriteEnd(0x20))
	})
	seqLines := bytes.SplitAfter(withSeq, []byte("\n"))
	seqLines[1] = regexp.MustCompile(`,"sum":"[0-9a-f]{8}"`).ReplaceAll(seqLines[1], nil)
	_, _, err = decodeAll(bytes.Join(seqLines, nil))
	require.ErrorIs(t, err, ErrChecksum, "a sequence without its sum")
	assert.ErrorContains(t, err, "line 2 (sequence record)")
}

// TestLinkAndPrevious checks that a checked stream's Link names its end
// and differs from another stream's, and that Previous round-trips.
func TestLinkAndPrevious(t *testing.T) {
	t.Parallel()
	linkOf := func(data []byte) string {
		d := NewDecoder(bytes.NewReader(data))
		for {
			if _, err := d.Next(); err != nil {
				require.ErrorIs(t, err, io.EOF)
				return d.Link()
			}
		}
	}
	one, two := linkOf(checkedChanges(t, 1)), linkOf(checkedChanges(t, 2))
	var buf bytes.Buffer
	e := NewEncoder(&buf)
	require.NoError(t, e.WriteHeader(testHeader))
	assert.Empty(t, e.Link(), "no link before the end")
	require.NoError(t, e.WriteEnd(0x40))
	assert.Equal(t, linkOf(buf.Bytes()), e.Link(), "the Encoder's link is the one the Decoder reads")
	assert.Regexp(t, `^crc32c:[0-9a-f]{8}@0/1040$`, one)
	assert.NotEqual(t, one, two)
	assert.Empty(t, linkOf(lines(changesHeaderLine, `{"t":"end","position":"0/1","records":0}`)), "an unchecked stream has no link")

	h := testHeader
	h.Previous = one
	got, _, err := decodeAll(encode(t, h, func(e *Encoder) { require.NoError(t, e.WriteEnd(h.Start)) }))
	require.NoError(t, err)
	assert.Equal(t, one, got.Previous)
}
