package siphon

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/siphondb/siphon/internal/copytext"
)

// copySignature starts every binary COPY stream.
const copySignature = "PGCOPY\n\xff\r\n\x00"

// copyParser parses a binary COPY stream as [pgconn.PgConn.CopyTo] hands it
// over, one CopyData message at a time (the server sends one message per
// tuple, but nothing here relies on that). With withCTID each tuple's first
// field is its ctid, checked to increase; the other fields are the copied
// columns, converted to canonical text and collected into batches.
type copyParser struct {
	kinds    []copytext.Kind
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
		if b.buf, err = copytext.Append(b.buf, k, buf[at:at+int(l)]); err != nil {
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
