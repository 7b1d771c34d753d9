package copytext

import (
	"encoding/binary"
	"math"
	"testing"

	"github.com/jackc/pgx/v5/pgtype"
)

func be(n int, v uint64) []byte {
	b := make([]byte, 8)
	binary.BigEndian.PutUint64(b, v)
	return b[8-n:]
}

// TestAppend checks one value of each kind against the text PostgreSQL's
// output function prints for it (the siphon package compares many more
// against a server).
func TestAppend(t *testing.T) {
	minus1, min16 := -1, math.MinInt16
	cases := []struct {
		kind Kind
		src  []byte
		want string
	}{
		{Text, []byte("plain"), "plain"},
		{Bool, []byte{1}, "t"},
		{Bool, []byte{0}, "f"},
		{Char, []byte{'a'}, "a"},
		{Char, []byte{0xe9}, `\351`},
		{Int2, be(2, uint64(uint16(min16))), "-32768"},
		{Int4, be(4, uint64(uint32(minus1))), "-1"},
		{Int8, be(8, math.MaxInt64), "9223372036854775807"},
		{OID, be(4, math.MaxUint32), "4294967295"},
		{Bytea, []byte{0xde, 0xad, 0x01}, `\xdead01`},
		{UUID, []byte{0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc, 0xde, 0xf0, 0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc, 0xde, 0xf0}, "12345678-9abc-def0-1234-56789abcdef0"},
		{JSONB, append([]byte{1}, `{"a": 1}`...), `{"a": 1}`},
		{Float8, be(8, math.Float64bits(0.1)), "0.1"},
		{Float8, be(8, math.Float64bits(1e15)), "1e+15"},
		{Float4, be(4, uint64(math.Float32bits(float32(math.Inf(-1))))), "-Infinity"},
		{Float8, be(8, math.Float64bits(math.NaN())), "NaN"},
		{Date, be(4, 0), "2000-01-01"},
		{Timestamp, be(8, 0), "2000-01-01 00:00:00"},
		{Timestamptz, be(8, 1_500_000), "2000-01-01 00:00:01.5+00"},
	}
	for _, c := range cases {
		got, err := Append(nil, c.kind, c.src)
		if err != nil || string(got) != c.want {
			t.Errorf("kind %d of %x: got %q, %v; want %q", c.kind, c.src, got, err, c.want)
		}
	}
	for _, k := range []Kind{Bool, Int4, UUID, JSONB, Float8, Date} {
		if _, err := Append(nil, k, []byte{2, 2, 2}); err == nil {
			t.Errorf("kind %d took a field of the wrong length or version", k)
		}
	}
	if k, ok := KindOf(pgtype.NumericOID); !ok || k != Numeric {
		t.Errorf("KindOf(numeric) = %d, %v", k, ok)
	}
	if _, ok := KindOf(pgtype.IntervalOID); ok {
		t.Error("interval's send format is not converted here: KindOf must say so")
	}
}

// FuzzAppend feeds every kind arbitrary fields: a malformed field gives an
// error, never a panic, and what is appended goes after dst.
func FuzzAppend(f *testing.F) {
	f.Add(uint8(Numeric), []byte{0, 1, 0, 0, 0, 0, 0, 2, 0, 42})
	f.Add(uint8(Timestamptz), be(8, math.MaxInt64))
	f.Add(uint8(Float4), be(4, 1))
	f.Fuzz(func(t *testing.T, kind uint8, src []byte) {
		k := Kind(kind % uint8(Timestamptz+1))
		got, err := Append([]byte("prefix"), k, src)
		if string(got[:6]) != "prefix" {
			t.Fatalf("kind %d of %x: dst overwritten: %q", k, src, got)
		}
		_ = err
	})
}
