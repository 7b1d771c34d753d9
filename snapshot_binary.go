package siphon

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5/pgtype"
)

// valueKind says how a column's binary COPY field becomes canonical text.
// Every kind produces exactly what the type's output function prints under
// siphon's session settings; a test checks each against the server.
type valueKind uint8

const (
	// kindText: the field already is the text. This covers text, varchar,
	// bpchar (padded as stored), name, json, and every column selected
	// through its type's output function (a cstring, sent as its text).
	kindText valueKind = iota
	kindBool
	kindChar // "char": one byte, octal escape when the high bit is set
	kindInt2
	kindInt4
	kindInt8
	kindOID
	kindBytea // \x and lowercase hex
	kindUUID
	kindJSONB // a version byte, then the text
	kindFloat4
	kindFloat8
	kindNumeric
	kindDate
	kindTimestamp
	kindTimestamptz
)

// binaryKinds maps the base type OIDs whose send format siphon converts to
// output text in Go. Every other type is selected through its output
// function, which the server runs.
var binaryKinds = map[uint32]valueKind{
	pgtype.BoolOID:        kindBool,
	pgtype.ByteaOID:       kindBytea,
	pgtype.QCharOID:       kindChar,
	pgtype.NameOID:        kindText,
	pgtype.Int8OID:        kindInt8,
	pgtype.Int2OID:        kindInt2,
	pgtype.Int4OID:        kindInt4,
	pgtype.TextOID:        kindText,
	pgtype.OIDOID:         kindOID,
	pgtype.JSONOID:        kindText,
	pgtype.Float4OID:      kindFloat4,
	pgtype.Float8OID:      kindFloat8,
	pgtype.BPCharOID:      kindText, // sent padded, as bpcharout prints it
	pgtype.VarcharOID:     kindText,
	pgtype.DateOID:        kindDate,
	pgtype.TimestampOID:   kindTimestamp,
	pgtype.TimestamptzOID: kindTimestamptz,
	pgtype.NumericOID:     kindNumeric,
	pgtype.UUIDOID:        kindUUID,
	pgtype.JSONBOID:       kindJSONB,
}

// appendValue appends the output text of one binary field of kind k to dst.
func appendValue(dst []byte, k valueKind, src []byte) ([]byte, error) {
	switch k {
	case kindText:
		return append(dst, src...), nil
	case kindBool:
		if len(src) != 1 {
			break
		}
		if src[0] != 0 {
			return append(dst, 't'), nil
		}
		return append(dst, 'f'), nil
	case kindChar:
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
	case kindInt2:
		if len(src) != 2 {
			break
		}
		return strconv.AppendInt(dst, int64(int16(binary.BigEndian.Uint16(src))), 10), nil
	case kindInt4:
		if len(src) != 4 {
			break
		}
		return strconv.AppendInt(dst, int64(int32(binary.BigEndian.Uint32(src))), 10), nil
	case kindInt8:
		if len(src) != 8 {
			break
		}
		return strconv.AppendInt(dst, int64(binary.BigEndian.Uint64(src)), 10), nil
	case kindOID:
		if len(src) != 4 {
			break
		}
		return strconv.AppendUint(dst, uint64(binary.BigEndian.Uint32(src)), 10), nil
	case kindBytea:
		return appendHex(append(dst, '\\', 'x'), src), nil
	case kindUUID:
		if len(src) != 16 {
			break
		}
		dst = appendHex(dst, src[0:4])
		dst = appendHex(append(dst, '-'), src[4:6])
		dst = appendHex(append(dst, '-'), src[6:8])
		dst = appendHex(append(dst, '-'), src[8:10])
		return appendHex(append(dst, '-'), src[10:16]), nil
	case kindJSONB:
		if len(src) < 1 || src[0] != 1 {
			return dst, errors.New("jsonb: unknown binary format version")
		}
		return append(dst, src[1:]...), nil
	case kindFloat4, kindFloat8:
		return appendFloat(dst, k, src)
	case kindNumeric:
		return appendNumeric(dst, src)
	case kindDate:
		return appendDate(dst, src)
	case kindTimestamp, kindTimestamptz:
		return appendTimestamp(dst, src, k == kindTimestamptz)
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

// copySignature starts every binary COPY stream.
const copySignature = "PGCOPY\n\xff\r\n\x00"

// copyParser parses a binary COPY stream as [pgconn.PgConn.CopyTo] hands it
// over, one CopyData message at a time (the server sends one message per
// tuple, but nothing here relies on that). With withCTID each tuple's first
// field is its ctid, checked to increase; the other fields are the copied
// columns, converted to canonical text and collected into batches.
type copyParser struct {
	kinds    []valueKind
	withCTID bool
	header   bool // the header was read
	ended    bool // the trailer was read
	rest     []byte

	lo, hi  CTID // every ctid must be in [lo, hi)
	last    CTID // the ctid of the latest tuple
	started bool // a tuple was read
	// row is called after each tuple has been appended to the batch.
	row func() error
	b   *rowBatch
}

// Write implements io.Writer.
func (p *copyParser) Write(data []byte) (int, error) {
	n := len(data)
	buf := data
	if len(p.rest) > 0 {
		p.rest = append(p.rest, data...)
		buf = p.rest
	}
	used, err := p.parse(buf)
	if err != nil {
		return 0, err
	}
	left := buf[used:]
	if len(p.rest) > 0 {
		p.rest = p.rest[:copy(p.rest, left)]
	} else {
		p.rest = append(p.rest, left...)
	}
	return n, nil
}

// parse consumes the header and every complete tuple of buf and returns how
// many bytes it used.
func (p *copyParser) parse(buf []byte) (int, error) {
	used := 0
	if !p.header {
		const fixed = len(copySignature) + 8
		if len(buf) < fixed {
			return 0, nil
		}
		if string(buf[:len(copySignature)]) != copySignature {
			return 0, errors.New("binary copy: bad signature")
		}
		ext := int(binary.BigEndian.Uint32(buf[len(copySignature)+4:]))
		if len(buf) < fixed+ext {
			return 0, nil
		}
		used, p.header = fixed+ext, true
	}
	for used < len(buf) {
		if p.ended {
			return 0, errors.New("binary copy: data after the trailer")
		}
		n, err := p.tuple(buf[used:])
		if err != nil || n == 0 {
			return used, err
		}
		used += n
	}
	return used, nil
}

// checkCTID reads a tuple's ctid field, which must come after the
// previous tuple's and be in the task's range.
func (p *copyParser) checkCTID(field []byte) error {
	if l := int32(binary.BigEndian.Uint32(field)); l != 6 {
		return fmt.Errorf("binary copy: ctid of %d bytes", l)
	}
	ctid := CTID{Block: binary.BigEndian.Uint32(field[4:]), Offset: binary.BigEndian.Uint16(field[8:])}
	switch {
	case p.started && !p.last.less(ctid):
		return fmt.Errorf("binary copy: ctid %v after %v: rows are not in physical order", ctid, p.last)
	case ctid.less(p.lo) || !ctid.less(p.hi):
		return fmt.Errorf("binary copy: ctid %v outside the range [%v, %v)", ctid, p.lo, p.hi)
	}
	p.last, p.started = ctid, true
	return nil
}

// tuple reads one tuple (or the trailer) from the start of buf and returns
// its length, or 0 when buf does not hold all of it yet.
func (p *copyParser) tuple(buf []byte) (int, error) {
	if len(buf) < 2 {
		return 0, nil
	}
	fields := int(int16(binary.BigEndian.Uint16(buf)))
	if fields == -1 {
		p.ended = true
		return 2, nil
	}
	first := 0 // fields before the columns
	if p.withCTID {
		first = 1
	}
	if fields != len(p.kinds)+first {
		return 0, fmt.Errorf("binary copy: %d fields in a tuple, expected %d", fields, len(p.kinds)+first)
	}
	// Check that the whole tuple is here before converting anything.
	end := 2
	for range fields {
		if len(buf) < end+4 {
			return 0, nil
		}
		if l := int32(binary.BigEndian.Uint32(buf[end:])); l > 0 {
			end += int(l)
		}
		end += 4
		if len(buf) < end {
			return 0, nil
		}
	}
	at := 2
	if p.withCTID {
		if err := p.checkCTID(buf[at:]); err != nil {
			return 0, err
		}
		at += 10
	}
	b := p.b
	for _, k := range p.kinds {
		l := int32(binary.BigEndian.Uint32(buf[at:]))
		at += 4
		if l < 0 {
			b.spans = append(b.spans, span{start: -1})
			continue
		}
		start := len(b.buf)
		var err error
		if b.buf, err = appendValue(b.buf, k, buf[at:at+int(l)]); err != nil {
			return 0, err
		}
		b.spans = append(b.spans, span{start: int32(start), end: int32(len(b.buf))})
		at += int(l)
	}
	b.rows++
	b.last = p.last
	b.copyBytes += int64(end)
	if err := p.row(); err != nil {
		return 0, err
	}
	return end, nil
}
