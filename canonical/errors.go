package canonical

import (
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// Sentinel errors of the JSONL codec. A [*DecodeError] or [*EncodeError]
// wraps one of them; branch with [errors.Is].
var (
	// ErrSyntax means a line is not a well-formed JSON object: bad JSON, a raw
	// control character (a NUL byte, say) in a string, a blank line, or data
	// after the object.
	ErrSyntax = errors.New("malformed JSON")

	// ErrInvalidRecord means a line is well-formed JSON but not a valid
	// record: an unknown record type, a missing or mistyped field, a bad
	// position, a value count that does not match the table's columns, an
	// end record whose count does not match the stream, a commit whose
	// Position is not after the commit LSN its begin announced.
	ErrInvalidRecord = errors.New("invalid record")

	// ErrOrder means a record appears where the format does not allow it:
	// before the header, a second header, a record after the end record, a
	// row in a change stream (or a change in a snapshot), a row change
	// outside begin/commit, nested transactions, a stream ending inside a
	// transaction.
	ErrOrder = errors.New("record out of order")

	// ErrUnknownTable means a row or change names a table that no earlier
	// table record described.
	ErrUnknownTable = errors.New("unknown table")

	// ErrUnsupportedVersion means the header announces a format version this
	// package does not read (it reads [FormatVersion]).
	ErrUnsupportedVersion = errors.New("unsupported format version")

	// ErrTruncated means the stream ended before its end record: it was cut
	// short (a copy interrupted, a disk full). It wraps
	// [io.ErrUnexpectedEOF], so errors.Is(err, io.ErrUnexpectedEOF) holds
	// too.
	ErrTruncated = fmt.Errorf("stream ends without an end record: %w", io.ErrUnexpectedEOF)

	// ErrInvalidUTF8 means a string is not valid UTF-8: a value from a
	// database whose encoding is not UTF-8 (encoding), or a corrupted line
	// or an escaped lone surrogate (decoding). The codec never replaces bad
	// bytes silently.
	ErrInvalidUTF8 = errors.New("invalid UTF-8")

	// ErrLineTooLong means a line is longer than the Decoder's limit (see
	// [Decoder.SetMaxLineBytes]).
	ErrLineTooLong = errors.New("line too long")

	// ErrChecksum means a checked stream's bytes are not those its writer
	// wrote: a checkpoint's sum does not match the bytes before it (a
	// value, position or any byte changed, a record or transaction removed,
	// added or moved), a commit or end record lacks its sum, or the header's
	// own checksum members were changed. Nothing after the last checkpoint
	// that verified can be trusted.
	ErrChecksum = errors.New("checksum mismatch")

	// ErrAuthentication means an authenticated stream (see [Header].KeyID)
	// fails its authentication: a checkpoint's MAC does not match the
	// bytes before it under the key the header names (the stream was
	// changed by someone without the key, or written with another key
	// under this key's id), a checkpoint or a ddl record lacks its MAC, or
	// the header's authentication members were changed. Nothing after the
	// last checkpoint that verified can be trusted. It is also the error
	// for a key too short to use.
	ErrAuthentication = errors.New("authentication failed")
)

// DecodeError is the error [Decoder.Header] and [Decoder.Next] return for
// any problem with the stream (other than the clean [io.EOF] after the end
// record). Err wraps one of the sentinel errors of this package or the
// reader's own error.
type DecodeError struct {
	// Line is the 1-based line number of the offending record; for a stream
	// cut short, the line where the missing record was expected.
	Line int
	// Col is the 1-based byte column where a syntax problem was found; 0 when
	// the problem is not at one point of the line.
	Col int
	// Record is the record's type ("row", "update", ...) when it is known.
	Record string
	// Err says what was wrong.
	Err error
}

// Error names the line (and column) and what was wrong, for example
// "canonical: line 12 (row record): invalid record: 3 values for 4 columns of public.t".
func (e *DecodeError) Error() string {
	var b strings.Builder
	b.WriteString("canonical: line ")
	b.WriteString(strconv.Itoa(e.Line))
	if e.Col > 0 {
		b.WriteString(", byte ")
		b.WriteString(strconv.Itoa(e.Col))
	}
	if e.Record != "" {
		b.WriteString(" (")
		b.WriteString(e.Record)
		b.WriteString(" record)")
	}
	b.WriteString(": ")
	if e.Err != nil {
		b.WriteString(e.Err.Error())
	} else {
		b.WriteString("decode error")
	}
	return b.String()
}

// Unwrap returns Err.
func (e *DecodeError) Unwrap() error { return e.Err }

// EncodeError is the error the [Encoder] returns when it refuses to write a
// record: a value or name that is not valid UTF-8, a row of the wrong length,
// a record out of order. Nothing of the refused record has been written; the
// Encoder stays usable. (Errors of the underlying writer are returned
// wrapped, not as an EncodeError, and are final.)
type EncodeError struct {
	// Record is the type of the record being written ("row", "update", ...).
	Record string
	// Table names the record's table; zero when the record has none.
	Table TableName
	// Column names the column whose value or name was refused; "" when the
	// problem is not about one column.
	Column string
	// Err says what was wrong; it wraps one of the sentinel errors of this
	// package.
	Err error
}

// Error says which record, table and column were refused and why, for
// example `canonical: encode row record of public.t, column "body": invalid UTF-8 at byte 3`.
func (e *EncodeError) Error() string {
	var b strings.Builder
	b.WriteString("canonical: encode ")
	b.WriteString(e.Record)
	b.WriteString(" record")
	if e.Table != (TableName{}) {
		b.WriteString(" of ")
		b.WriteString(e.Table.String())
	}
	if e.Column != "" {
		b.WriteString(", column ")
		b.WriteString(strconv.Quote(e.Column))
	}
	b.WriteString(": ")
	if e.Err != nil {
		b.WriteString(e.Err.Error())
	} else {
		b.WriteString("encode error")
	}
	return b.String()
}

// Unwrap returns Err.
func (e *EncodeError) Unwrap() error { return e.Err }

// colError is a syntax or content error at a byte offset of the line being
// decoded; the Decoder turns it into a DecodeError with Col set.
type colError struct {
	off int
	err error
}

func (e *colError) Error() string { return e.err.Error() }
func (e *colError) Unwrap() error { return e.err }
