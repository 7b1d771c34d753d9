// Package copytext turns the fields of a binary COPY into the exact text
// the types' output functions print under siphon's session settings
// (extra_float_digits 3, DateStyle ISO, TimeZone UTC, bytea_output hex), so
// that a snapshot copied in binary reads as one copied in text. The
// siphon package's TestSnapshotValuesMatchServerText checks edge cases and
// many random values of each kind against the server.
package copytext

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5/pgtype"
)

// Kind says how a column's binary COPY field becomes canonical text.
// Every kind produces exactly what the type's output function prints under
// siphon's session settings; a test checks each against the server.
type Kind uint8

// The kinds, one per send format.
const (
	// Text: the field already is the text. This covers text, varchar,
	// bpchar (padded as stored), name, json, and every column selected
	// through its type's output function (a cstring, sent as its text).
	Text Kind = iota
	Bool
	Char // "char": one byte, octal escape when the high bit is set
	Int2
	Int4
	Int8
	OID
	Bytea // \x and lowercase hex
	UUID
	JSONB // a version byte, then the text
	Float4
	Float8
	Numeric
	Date
	Timestamp
	Timestamptz
)

// kinds maps the base type OIDs whose send format siphon converts to
// output text in Go. Every other type is selected through its output
// function, which the server runs.
var kinds = map[uint32]Kind{
	pgtype.BoolOID:        Bool,
	pgtype.ByteaOID:       Bytea,
	pgtype.QCharOID:       Char,
	pgtype.NameOID:        Text,
	pgtype.Int8OID:        Int8,
	pgtype.Int2OID:        Int2,
	pgtype.Int4OID:        Int4,
	pgtype.TextOID:        Text,
	pgtype.OIDOID:         OID,
	pgtype.JSONOID:        Text,
	pgtype.Float4OID:      Float4,
	pgtype.Float8OID:      Float8,
	pgtype.BPCharOID:      Text, // sent padded, as bpcharout prints it
	pgtype.VarcharOID:     Text,
	pgtype.DateOID:        Date,
	pgtype.TimestampOID:   Timestamp,
	pgtype.TimestamptzOID: Timestamptz,
	pgtype.NumericOID:     Numeric,
	pgtype.UUIDOID:        UUID,
	pgtype.JSONBOID:       JSONB,
}

// KindOf returns the Kind of the base type oid, and false for a type whose
// send format is not converted here: select such a column through its
// type's output function (its text is then Text).
func KindOf(oid uint32) (Kind, bool) {
	k, ok := kinds[oid]
	return k, ok
}

// Append appends the output text of one binary field of kind k to dst.
func Append(dst []byte, k Kind, src []byte) ([]byte, error) {
	switch k {
	case Text:
		return append(dst, src...), nil
	case Bool:
		if len(src) != 1 {
			break
		}
		if src[0] != 0 {
			return append(dst, 't'), nil
		}
		return append(dst, 'f'), nil
	case Char:
		if len(src) != 1 {
			break
		}
		switch c := src[0]; {
		case c == 0:
			return dst, nil
		case c >= 0x80:
			return append(dst, '\\', '0'+c>>6, '0'+(c>>3)&7, '0'+c&7), nil
		default:
			return append(dst, c), nil
		}
	case Int2:
		if len(src) != 2 {
			break
		}
		return strconv.AppendInt(dst, int64(int16(binary.BigEndian.Uint16(src))), 10), nil
	case Int4:
		if len(src) != 4 {
			break
		}
		return strconv.AppendInt(dst, int64(int32(binary.BigEndian.Uint32(src))), 10), nil
	case Int8:
		if len(src) != 8 {
			break
		}
		return strconv.AppendInt(dst, int64(binary.BigEndian.Uint64(src)), 10), nil
	case OID:
		if len(src) != 4 {
			break
		}
		return strconv.AppendUint(dst, uint64(binary.BigEndian.Uint32(src)), 10), nil
	case Bytea:
		return appendHex(append(dst, '\\', 'x'), src), nil
	case UUID:
		if len(src) != 16 {
			break
		}
		dst = appendHex(dst, src[0:4])
		dst = appendHex(append(dst, '-'), src[4:6])
		dst = appendHex(append(dst, '-'), src[6:8])
		dst = appendHex(append(dst, '-'), src[8:10])
		return appendHex(append(dst, '-'), src[10:16]), nil
	case JSONB:
		if len(src) < 1 || src[0] != 1 {
			return dst, errors.New("jsonb: unknown binary format version")
		}
		return append(dst, src[1:]...), nil
	case Float4, Float8:
		return appendFloat(dst, k, src)
	case Numeric:
		return appendNumeric(dst, src)
	case Date:
		return appendDate(dst, src)
	case Timestamp, Timestamptz:
		return appendTimestamp(dst, src, k == Timestamptz)
	}
	return dst, fmt.Errorf("unexpected binary value of %d bytes", len(src))
}

const hexDigits = "0123456789abcdef"

func appendHex(dst, src []byte) []byte {
	for _, b := range src {
		dst = append(dst, hexDigits[b>>4], hexDigits[b&15])
	}
	return dst
}
