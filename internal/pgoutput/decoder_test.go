package pgoutput

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/siphondb/siphon/canonical"
)

// fakeTypes resolves the few built-in types these tests use, and custom
// types by the names Type messages announced.
func fakeTypes(rel *Relation, types map[uint32]TypeName) error {
	for i := range rel.Columns {
		c := &rel.Columns[i]
		switch c.TypeOID {
		case 23:
			c.Type = "integer"
		case 25:
			c.Type = "text"
		case 1700:
			c.Type = "numeric"
			if tm := rel.TypeModifiers[i]; tm >= 4 {
				c.Type = fmt.Sprintf("numeric(%d,%d)", (tm-4)>>16, (tm-4)&0xffff)
			}
		default:
			t, ok := types[c.TypeOID]
			if !ok {
				return fmt.Errorf("type %d unknown", c.TypeOID)
			}
			c.Type = t.Schema + "." + t.Name
		}
		c.Nullable = !rel.Key[i]
	}
	return nil
}

var (
	t0       = time.Date(2026, 3, 1, 12, 30, 45, 123456000, time.UTC)
	usersRel = relationMsg(16384, "public", "users", 'd',
		col{key: true, name: "id", oid: 23, typmod: -1},
		col{name: "name", oid: 25, typmod: -1},
		col{name: "balance", oid: 1700, typmod: (12<<16 | 2) + 4},
	)
	usersCols = []canonical.Column{
		{Name: "id", Type: "integer", TypeOID: 23, Nullable: false},
		{Name: "name", Type: "text", TypeOID: 25, Nullable: true},
		{Name: "balance", Type: "numeric(12,2)", TypeOID: 1700, Nullable: true},
	}
)

// decodeAll decodes msgs in order and returns the changes.
func decodeAll(t *testing.T, d *Decoder, msgs ...msg) []canonical.Change {
	t.Helper()
	var out []canonical.Change
	for _, m := range msgs {
		var ch canonical.Change
		ok, err := d.Decode(m, &ch)
		require.NoError(t, err, "message %q", m[0])
		if ok {
			out = append(out, ch)
		}
	}
	return out
}

func TestDecodeTransaction(t *testing.T) {
	t.Parallel()
	d := NewDecoder(fakeTypes)
	got := decodeAll(t, d,
		usersRel,
		beginMsg(0x1_0000_0100, t0, 777),
		insertMsg(16384, txt("1"), txt("Ann"), txt("10.50")),
		insertMsg(16384, txt("2"), txt(""), nil),
		updateMsg(16384, 0, nil, txt("1"), unchanged, txt("11.00")),
		updateMsg(16384, 'K', []val{txt("2"), nil, nil}, txt("3"), txt("Bo"), nil),
		deleteMsg(16384, 'K', txt("3"), nil, nil),
		commitMsg(0x1_0000_0100, 0x1_0000_0180, t0),
	)
	require.Len(t, got, 7)
	commitPos := canonical.Position(0x1_0000_0100)
	for _, ch := range got[:6] {
		assert.Equal(t, commitPos, ch.Position, "%v carries the commit LSN", ch.Op)
		assert.Equal(t, uint32(777), ch.XID)
		assert.True(t, t0.Equal(ch.CommitTime))
	}
	assert.Equal(t, canonical.OpBegin, got[0].Op)

	ins := got[1]
	assert.Equal(t, canonical.OpInsert, ins.Op)
	assert.Equal(t, "public", ins.Schema)
	assert.Equal(t, "users", ins.Table)
	assert.Equal(t, usersCols, ins.Columns)
	assert.Equal(t, canonical.Row{canonical.Text("1"), canonical.Text("Ann"), canonical.Text("10.50")}, ins.New)
	assert.Nil(t, ins.Old)

	empty := got[2]
	assert.Equal(t, canonical.Row{canonical.Text("2"), canonical.Text(""), canonical.Null()}, empty.New,
		"empty text and NULL stay different")

	toast := got[3]
	assert.Equal(t, canonical.OpUpdate, toast.Op)
	assert.Nil(t, toast.Old, "no old tuple when the key did not change")
	assert.True(t, toast.New[1].IsUnchanged())
	assert.Equal(t, []string{"name"}, toast.Unchanged(), "unchanged TOAST column listed, not NULL")

	keyChange := got[4]
	assert.Equal(t, canonical.Row{canonical.Text("2"), canonical.Null(), canonical.Null()}, keyChange.Old)
	assert.Equal(t, canonical.Row{canonical.Text("3"), canonical.Text("Bo"), canonical.Null()}, keyChange.New)

	del := got[5]
	assert.Equal(t, canonical.OpDelete, del.Op)
	assert.Nil(t, del.New)
	assert.Equal(t, canonical.Row{canonical.Text("3"), canonical.Null(), canonical.Null()}, del.Old)

	commit := got[6]
	assert.Equal(t, canonical.OpCommit, commit.Op)
	assert.Equal(t, canonical.Position(0x1_0000_0180), commit.Position, "commit carries the end LSN")
	assert.Equal(t, uint32(777), commit.XID)
	assert.False(t, d.InTransaction())

	assert.Same(t, &ins.Columns[0], &del.Columns[0], "columns shared per relation version")
}

func TestDecodeReplicaIdentityFull(t *testing.T) {
	t.Parallel()
	d := NewDecoder(fakeTypes)
	got := decodeAll(t, d,
		relationMsg(5, "s", "full", 'f', col{key: true, name: "a", oid: 23, typmod: -1}, col{key: true, name: "b", oid: 25, typmod: -1}),
		beginMsg(100, t0, 9),
		updateMsg(5, 'O', []val{txt("1"), txt("x")}, txt("1"), txt("y")),
		deleteMsg(5, 'O', txt("1"), txt("y")),
		commitMsg(100, 200, t0),
	)
	require.Len(t, got, 4)
	assert.Equal(t, canonical.Row{canonical.Text("1"), canonical.Text("x")}, got[1].Old, "full old row")
	assert.Equal(t, canonical.Row{canonical.Text("1"), canonical.Text("y")}, got[2].Old)
	assert.Equal(t, 'f', rune(d.Relation(5).ReplicaIdentity))
}

func TestDecodeRelationChangeMidStream(t *testing.T) {
	t.Parallel()
	d := NewDecoder(fakeTypes)
	got := decodeAll(t, d,
		relationMsg(7, "public", "t", 'd', col{key: true, name: "id", oid: 23, typmod: -1}),
		beginMsg(100, t0, 1),
		insertMsg(7, txt("1")),
		commitMsg(100, 150, t0),
		relationMsg(7, "public", "t", 'd', col{key: true, name: "id", oid: 23, typmod: -1}, col{name: "note", oid: 25, typmod: -1}),
		beginMsg(200, t0, 2),
		insertMsg(7, txt("2"), txt("added")),
		commitMsg(200, 250, t0),
	)
	require.Len(t, got, 6)
	assert.Len(t, got[1].Columns, 1, "the first change keeps its relation version")
	require.Len(t, got[4].Columns, 2)
	assert.Equal(t, "note", got[4].Columns[1].Name)
	assert.Equal(t, canonical.Row{canonical.Text("2"), canonical.Text("added")}, got[4].New)
}

func TestDecodeTruncateMessageTypeOrigin(t *testing.T) {
	t.Parallel()
	d := NewDecoder(fakeTypes)
	got := decodeAll(t, d,
		messageMsg(false, 0x50, "outside", []byte("hi")),
		typeMsg(90000, "public", "mood"),
		relationMsg(1, "", "pg_thing", 'n', col{name: "m", oid: 90000, typmod: -1}),
		relationMsg(2, "public", "b", 'd', col{key: true, name: "id", oid: 23, typmod: -1}),
		beginMsg(300, t0, 3),
		originMsg(12, "upstream"),
		truncateMsg(3, 1, 2),
		messageMsg(true, 0x60, "inside", []byte{0, 1, 2}),
		insertMsg(1, txt("happy")),
		commitMsg(300, 360, t0),
	)
	require.Len(t, got, 6)
	outside := got[0]
	assert.Equal(t, canonical.OpMessage, outside.Op)
	assert.Equal(t, canonical.Position(0x50), outside.Position, "non-transactional message carries its own LSN")
	assert.Zero(t, outside.XID)
	assert.Equal(t, &canonical.Message{Prefix: "outside", Content: []byte("hi")}, outside.Message)

	trunc := got[2]
	assert.Equal(t, canonical.OpTruncate, trunc.Op)
	assert.Equal(t, []canonical.TableName{{Schema: "pg_catalog", Name: "pg_thing"}, {Schema: "public", Name: "b"}}, trunc.Truncated)
	assert.True(t, trunc.Cascade)
	assert.True(t, trunc.RestartIdentity)
	assert.Equal(t, canonical.Position(300), trunc.Position)

	inside := got[3]
	assert.Equal(t, &canonical.Message{Transactional: true, Prefix: "inside", Content: []byte{0, 1, 2}}, inside.Message)
	assert.Equal(t, canonical.Position(300), inside.Position, "transactional message carries the commit LSN")
	assert.Equal(t, uint32(3), inside.XID)

	assert.Equal(t, "public.mood", got[4].Columns[0].Type, "custom type named from its Type message")
}

func TestDecodeValuesDoNotAliasInput(t *testing.T) {
	t.Parallel()
	d := NewDecoder(fakeTypes)
	decodeAll(t, d, usersRel, beginMsg(1, t0, 1))
	m := insertMsg(16384, txt("1"), txt("Ann"), txt("1.00"))
	var ch canonical.Change
	_, err := d.Decode(m, &ch)
	require.NoError(t, err)
	for i := range m {
		m[i] = 'X' // the caller reuses its buffer
	}
	assert.Equal(t, canonical.Row{canonical.Text("1"), canonical.Text("Ann"), canonical.Text("1.00")}, ch.New)
}

func TestDecodeErrors(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		setup []msg
		bad   msg
		want  error
	}{
		{"empty", nil, msg{}, ErrTruncated},
		{"unknown type", nil, newMsg('S').u32(1), ErrUnknownMessage},
		{"short begin", nil, newMsg(MsgBegin).u64(1), ErrTruncated},
		{"begin trailing", nil, beginMsg(1, t0, 1).u8(0), ErrTrailingBytes},
		{"commit without begin", nil, commitMsg(1, 2, t0), ErrOutOfOrder},
		{"begin in begin", []msg{beginMsg(1, t0, 1)}, beginMsg(1, t0, 1), ErrOutOfOrder},
		{"insert outside tx", []msg{usersRel}, insertMsg(16384, txt("1"), nil, nil), ErrOutOfOrder},
		{"unknown relation", []msg{beginMsg(1, t0, 1)}, insertMsg(99, txt("1")), ErrUnknownRelation},
		{"column count", []msg{usersRel, beginMsg(1, t0, 1)}, insertMsg(16384, txt("1")), ErrColumnCount},
		{"binary value", []msg{usersRel, beginMsg(1, t0, 1)},
			newMsg(MsgInsert).u32(16384).u8('N').u16(3).u8('b').u32(1).u8(7).u8('n').u8('n'), ErrBinaryValue},
		{"bad column kind", []msg{usersRel, beginMsg(1, t0, 1)},
			newMsg(MsgInsert).u32(16384).u8('N').u16(3).u8('x').u8('n').u8('n'), ErrInvalidTuple},
		{"bad tuple kind", []msg{usersRel, beginMsg(1, t0, 1)}, tuple(newMsg(MsgInsert).u32(16384).u8('K'), nil, nil, nil), ErrInvalidTuple},
		{"value past end", []msg{usersRel, beginMsg(1, t0, 1)},
			newMsg(MsgInsert).u32(16384).u8('N').u16(3).u8('t').u32(100).raw([]byte("ab")), ErrTruncated},
		{"negative length", []msg{usersRel, beginMsg(1, t0, 1)},
			newMsg(MsgInsert).u32(16384).u8('N').u16(3).u8('t').u32(0xffffffff).u8('n').u8('n'), ErrTruncated},
		{"relation without NUL", nil, newMsg(MsgRelation).u32(1).raw([]byte("public")), ErrTruncated},
		{"relation column count lies", nil, newMsg(MsgRelation).u32(1).str("s").str("t").u8('d').u16(60000), ErrTruncated},
		{"truncate count lies", []msg{beginMsg(1, t0, 1)}, newMsg(MsgTruncate).u32(0x7fffffff).u8(0), ErrTruncated},
		{"truncate unknown relation", []msg{beginMsg(1, t0, 1)}, truncateMsg(0, 5), ErrUnknownRelation},
		{"message content lies", nil, newMsg(MsgMessage).u8(0).u64(1).str("p").u32(10).raw([]byte("ab")), ErrTruncated},
		{"transactional message outside tx", nil, messageMsg(true, 1, "p", nil), ErrOutOfOrder},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := NewDecoder(fakeTypes)
			decodeAll(t, d, tc.setup...)
			var ch canonical.Change
			ok, err := d.Decode(tc.bad, &ch)
			assert.False(t, ok)
			var de *DecodeError
			require.ErrorAs(t, err, &de)
			assert.ErrorIs(t, err, tc.want)
		})
	}
}

func TestDecodeResolverError(t *testing.T) {
	t.Parallel()
	boom := errors.New("catalog unreachable")
	d := NewDecoder(func(*Relation, map[uint32]TypeName) error { return boom })
	var ch canonical.Change
	_, err := d.Decode(usersRel, &ch)
	var re *ResolveError
	require.ErrorAs(t, err, &re)
	assert.Equal(t, canonical.TableName{Schema: "public", Name: "users"}, re.Relation)
	assert.ErrorIs(t, err, boom)
	assert.Nil(t, d.Relation(16384), "a relation that could not be resolved is not cached")
}

func BenchmarkDecodeInsert(b *testing.B) {
	d := NewDecoder(fakeTypes)
	var ch canonical.Change
	for _, m := range []msg{usersRel, beginMsg(1, t0, 1)} {
		if _, err := d.Decode(m, &ch); err != nil {
			b.Fatal(err)
		}
	}
	m := insertMsg(16384, txt("123456"), txt("some name of a person"), txt("12345.67"))
	b.ReportAllocs()
	b.SetBytes(int64(len(m)))
	for b.Loop() {
		if _, err := d.Decode(m, &ch); err != nil {
			b.Fatal(err)
		}
	}
}
