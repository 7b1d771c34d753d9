package canonical

import (
	"bufio"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"time"
	"unicode/utf8"
)

// DefaultMaxLineBytes is the longest line a [Decoder] accepts unless told
// otherwise with [Decoder.SetMaxLineBytes]: 64 MiB.
const DefaultMaxLineBytes = 64 << 20

// Decoder reads a JSONL stream written by an [Encoder] (or anything that
// writes the same format): [Decoder.Header] returns the header and
// [Decoder.Next] the records that follow, in order, until [io.EOF] after the
// end record.
//
// The Decoder checks the stream as it goes and returns a [*DecodeError]
// naming the line for anything wrong with it: malformed JSON, invalid UTF-8,
// an unknown record type, a row or change for a table no table record
// described, a value count that does not match the table's columns, records
// out of order, a stream cut short (no end record, wrapping
// [io.ErrUnexpectedEOF]), a line over the length limit. Errors are final:
// once Header or Next has returned one, later calls return it again.
//
// Members a record does not need are ignored, so later revisions of format
// version 1 can add optional fields. Lines may end in "\n" or "\r\n"; the
// last line's newline may be missing.
//
// A Decoder is not safe for concurrent use.
type Decoder struct {
	r       *bufio.Reader
	maxLine int
	lineNo  int
	long    []byte // accumulates lines longer than the reader's buffer
	cut     bool   // the last line read had no newline

	sc           scanner
	f            recordFields
	arena        []byte // the text of the current record's values
	newSpans     []span
	oldSpans     []span
	names        []byte // the current record's unchanged column names
	unchanged    []span
	oldUnchanged []span

	// Checksums (see checksum.go): the running CRC-32C of the lines read,
	// whether the current line carried a sum that verified, and the last
	// checkpoint that did.
	crc       uint32
	summed    bool
	lastCheck int
	lastSum   uint32

	// Authentication (see auth.go): the keys given, the MAC chain when
	// the header names one of them, where the current line's MAC starts
	// (-1: it has none), and the last MAC read and its line.
	keys        [][]byte
	mac         *macChain
	macAt       int
	lastMAC     [64]byte
	lastMACLine int

	header     Header
	haveHeader bool
	ended      bool
	endPos     Position
	err        error
	count      uint64
	inTx       bool
	txTime     time.Time
	txCommit   Position // the commit LSN the open transaction's begin announced

	tables map[string]map[string]*Table
	last   *Table
}

// NewDecoder returns a Decoder that reads from r through a buffer.
func NewDecoder(r io.Reader) *Decoder {
	return &Decoder{
		r:       bufio.NewReaderSize(r, 64<<10),
		maxLine: DefaultMaxLineBytes,
		tables:  make(map[string]map[string]*Table),
	}
}

// SetMaxLineBytes sets the longest line (newline excluded) the Decoder
// accepts, from the next line read on; longer lines are an error wrapping
// [ErrLineTooLong]. n <= 0 restores [DefaultMaxLineBytes]. The limit bounds
// the Decoder's memory: a row is held whole.
func (d *Decoder) SetMaxLineBytes(n int) {
	if n <= 0 {
		n = DefaultMaxLineBytes
	}
	d.maxLine = n
}

// Header reads the stream's header, if it has not been read yet, and returns
// it. A header whose version is not [FormatVersion] is an error wrapping
// [ErrUnsupportedVersion].
func (d *Decoder) Header() (Header, error) {
	if d.haveHeader {
		return d.header, nil
	}
	if d.err != nil {
		return Header{}, d.err
	}
	line, err := d.readLine()
	if err == io.EOF {
		d.lineNo++
		err = d.fail(fmt.Errorf("%w (empty stream: no header)", ErrTruncated), "")
	}
	if err != nil {
		return Header{}, err
	}
	if err := d.checksum(line); err != nil {
		return Header{}, err
	}
	if _, err := d.record(line); err != nil {
		return Header{}, err
	}
	if err := d.authenticateHeader(line); err != nil {
		d.haveHeader = false // d.err holds err
		return Header{}, err
	}
	return d.header, nil
}

// Next returns the next record after the header (reading the header first
// if [Decoder.Header] was not called). After the end record it returns
// [io.EOF], and a [*DecodeError] wrapping [ErrOrder] if anything follows the
// end record. A stream that ends without an end record is an error wrapping
// [ErrTruncated] and [io.ErrUnexpectedEOF].
func (d *Decoder) Next() (Record, error) {
	if d.err != nil {
		return Record{}, d.err
	}
	if !d.haveHeader {
		if _, err := d.Header(); err != nil {
			return Record{}, err
		}
	}
	line, err := d.readLine()
	switch {
	case err == io.EOF && d.ended:
		d.err = io.EOF
		return Record{}, io.EOF
	case err == io.EOF:
		d.lineNo++
		return Record{}, d.fail(ErrTruncated, "")
	case err != nil:
		return Record{}, err
	case d.ended:
		return Record{}, d.fail(fmt.Errorf("%w: a record after the end record", ErrOrder), "")
	}
	if err := d.checksum(line); err != nil {
		return Record{}, err
	}
	rec, err := d.record(line)
	if err == nil && d.header.Checked && !d.summed &&
		(rec.Type == RecordEnd || rec.Type == RecordSequence || rec.Type == RecordChange && rec.Change.Op == OpCommit) {
		err = d.fail(fmt.Errorf("%w: the record carries no checksum, which every commit, sequence and the end record of a checked stream do", ErrChecksum), recordName(rec))
	}
	if err == nil && d.header.KeyID != "" && d.macAt < 0 &&
		(d.summed || rec.Type == RecordChange && rec.Change.Op == OpDDL) {
		err = d.fail(fmt.Errorf("%w: the record carries no MAC, which every checkpoint and ddl record of an authenticated stream do", ErrAuthentication), recordName(rec))
	}
	return rec, err
}

// checksum verifies the sum line carries, if any, and adds line to the
// running CRC-32C.
func (d *Decoder) checksum(line []byte) error {
	covered, sum, ok := splitSum(line)
	d.summed, d.macAt = false, -1
	if ok {
		if d.haveHeader && !d.header.Checked {
			return d.fail(fmt.Errorf("%w: a checksum in a stream whose header carries none: the header was changed", ErrChecksum), "")
		}
		if at := crc32.Update(d.crc, castagnoli, covered); at != sum {
			since := "its start"
			if d.lastCheck > 0 {
				since = fmt.Sprintf("line %d, its last checkpoint that verified", d.lastCheck)
			}
			return d.fail(fmt.Errorf("%w: the stream's bytes changed after %s", ErrChecksum, since), "")
		}
		d.summed, d.lastCheck, d.lastSum = true, d.lineNo, sum
		if head, _, ok := splitMAC(covered); ok {
			if d.haveHeader && d.header.KeyID == "" {
				return d.fail(fmt.Errorf("%w: a MAC in a stream whose header names no key: the header was changed", ErrAuthentication), "")
			}
			d.macAt = len(head)
		}
	}
	d.crc = crc32.Update(d.crc, castagnoli, line)
	if !d.cut {
		d.crc = crc32.Update(d.crc, castagnoli, newline)
	}
	if !d.haveHeader {
		return nil // the header names the key: see authenticateHeader
	}
	if d.macAt < 0 {
		d.feedMAC(line)
		return nil
	}
	if err := d.authenticate(line); err != nil {
		return err
	}
	d.feedMAC(line[d.macAt:])
	return nil
}

var newline = []byte{'\n'}

// Link identifies a checked stream once its end record was read: its end
// Position and its last checksum, which covers every byte of it. The next
// backup of a chain records it as its [Header].Previous. It is empty
// before the end record and for a stream without checksums.
func (d *Decoder) Link() string {
	switch {
	case !d.ended || !d.header.Checked:
		return ""
	case d.header.KeyID != "":
		return authLink(d.header.KeyID, d.lastMAC[:], d.endPos)
	}
	return link(d.lastSum, d.endPos)
}

// recordName is the name of a record's type as the stream writes it.
func recordName(rec Record) string {
	if rec.Type == RecordChange {
		return rec.Change.Op.String()
	}
	return rec.Type.String()
}

// readLine returns the next line without its newline, or io.EOF when there
// are no more lines. The line is valid until the next read.
func (d *Decoder) readLine() ([]byte, error) {
	d.long = d.long[:0]
	for {
		frag, err := d.r.ReadSlice('\n')
		switch {
		case err == nil:
			d.lineNo++
			line := frag[:len(frag)-1]
			if len(d.long) > 0 {
				d.long = append(d.long, line...)
				line = d.long
			}
			if len(line) > d.maxLine {
				return nil, d.tooLong()
			}
			return line, nil
		case errors.Is(err, bufio.ErrBufferFull):
			d.long = append(d.long, frag...)
			if len(d.long) > d.maxLine {
				d.lineNo++
				return nil, d.tooLong()
			}
		case errors.Is(err, io.EOF):
			if len(d.long)+len(frag) == 0 {
				return nil, io.EOF
			}
			d.lineNo++
			d.cut = true
			line := frag
			if len(d.long) > 0 {
				d.long = append(d.long, frag...)
				line = d.long
			}
			if len(line) > d.maxLine {
				return nil, d.tooLong()
			}
			return line, nil
		default:
			d.lineNo++
			return nil, d.fail(fmt.Errorf("read: %w", err), "")
		}
	}
}

func (d *Decoder) tooLong() error {
	return d.fail(fmt.Errorf("%w: more than %d bytes (see Decoder.SetMaxLineBytes)", ErrLineTooLong, d.maxLine), "")
}

// fail records err as the Decoder's final error, as a *DecodeError for the
// current line, and returns it.
func (d *Decoder) fail(err error, record string) error {
	de := &DecodeError{Line: d.lineNo, Record: record, Err: err}
	var ce *colError
	if errors.As(err, &ce) {
		de.Col = ce.off + 1
	}
	if d.cut && (errors.Is(err, ErrSyntax) || ce != nil && errors.Is(err, ErrInvalidUTF8) && !utf8.FullRune(d.sc.data[ce.off:])) {
		// A last line without its newline that does not parse, or that
		// ends inside a character, was most likely cut short.
		de.Err = fmt.Errorf("%w: the last line is incomplete: %w", ErrTruncated, err)
	}
	d.err = de
	return de
}
