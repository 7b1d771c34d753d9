package canonical

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"hash/crc32"
	"io"
	"strconv"
	"time"
)

// An envelope wraps a backup's body (a pg_dump archive, or a JSONL
// snapshot or incremental) with what is needed to trust it and to chain it:
// where it sits on the source's timeline, which system it comes from, and
// checksums. Format version 1, byte by byte:
//
//	magic line    "siphon-envelope/1\n" (the number is the format version)
//	header line   one JSON object (see EnvelopeHeader), then "\n"; at most 1 MiB
//	body chunks   each: length n as 4 bytes big-endian (1 to 1 MiB), n bytes
//	              of body, their CRC-32C (Castagnoli) as 4 bytes big-endian
//	end marker    4 zero bytes (a chunk of length 0)
//	trailer line  one JSON object (see EnvelopeTrailer), a space, the CRC-32C
//	              of that JSON as 8 lowercase hex digits, then "\n"; the
//	              stream ends there
//
// The body is framed in chunks so that a reader knows where it ends
// without buffering it, hands on only bytes whose chunk checked out, and
// can say where a corruption is. The trailer records the body's length
// and SHA-256 and the SHA-256 of the magic and header lines, so a single
// changed byte anywhere is detected.

// EnvelopeVersion is the envelope format version this package writes and
// the only one it reads.
const EnvelopeVersion = 1

// EnvelopeMagic starts every envelope: its magic line is EnvelopeMagic and
// the format version.
const EnvelopeMagic = "siphon-envelope/"

const (
	maxHeaderLine  = 1 << 20
	maxTrailerLine = 4 << 10
	// maxChunk is the largest chunk a reader accepts; writers use
	// envelopeChunk.
	maxChunk      = 1 << 20
	envelopeChunk = 256 << 10
)

// KindDump is the kind of an envelope whose body is a pg_dump archive: a
// full backup taken through an exported snapshot, whose Start (and End) is
// that snapshot's consistent point.
const KindDump Kind = "dump"

// BodyFormat says how an envelope's body is encoded.
type BodyFormat string

// The body formats.
const (
	// BodyPgDumpCustom is a pg_dump custom-format archive, as pg_dump
	// wrote it.
	BodyPgDumpCustom BodyFormat = "pg_dump-custom"
	// BodyPgDumpDirectoryTar is a pg_dump directory-format dump (a parallel
	// dump) as a POSIX tar stream: toc.dat first, then the data files in
	// name order, all at the top level.
	BodyPgDumpDirectoryTar BodyFormat = "pg_dump-directory-tar"
	// BodyJSONL is a canonical JSONL stream (see [Encoder]).
	BodyJSONL BodyFormat = "jsonl"
)

// EnvelopeBase describes the physical base slot of a backup that pins
// WAL from its start: its WALStart is in the header, its WALEnd (known
// only once the body is written) in the trailer.
type EnvelopeBase struct {
	Slot     string   `json:"slot"`
	WALStart Position `json:"wal_start"`
	WALEnd   Position `json:"wal_end,omitzero"`
}

// EnvelopeHeader is what an envelope says about its body, written before
// it.
type EnvelopeHeader struct {
	// Kind is KindDump, KindSnapshot or KindIncremental. Required.
	Kind Kind `json:"kind"`
	// Body is how the body is encoded; it must suit Kind (a pg_dump body
	// for a dump, JSONL otherwise). Required.
	Body BodyFormat `json:"body"`
	// Engine is the source's engine, [EnginePostgres]. Required.
	Engine string `json:"engine"`
	// ServerVersion is the source's version, for example "15.4".
	ServerVersion string `json:"server_version,omitempty"`
	// Tool is what wrote the body, for example "pg_dump 15.4".
	Tool string `json:"tool,omitempty"`
	// SystemID and Timeline identify the source cluster and its history:
	// positions of different systems or timelines do not compare.
	SystemID string `json:"system_id,omitempty"`
	Timeline uint32 `json:"timeline,omitempty"`
	// Slot is the persistent replication slot the backup is aligned with.
	Slot string `json:"slot,omitempty"`
	// Start is where the body starts on the source's timeline: a dump's or
	// snapshot's consistent point, or the Position an incremental continues
	// from.
	Start Position `json:"start"`
	// End is where the body ends, when known before writing it (a dump's
	// End is its Start); zero otherwise, and the trailer carries it.
	End Position `json:"end,omitzero"`
	// Base describes the physical base slot, when the backup made one.
	Base *EnvelopeBase `json:"base,omitempty"`
	// Previous is the Link of the chain's previous envelope ("" for the
	// first).
	Previous string `json:"previous,omitempty"`
	// Tables lists the tables the body holds, when the writer knows them.
	Tables []TableName `json:"tables,omitempty"`
	// Created is when the envelope was written.
	Created time.Time `json:"created"`
}

// validate checks the header's required fields and their consistency.
func (h *EnvelopeHeader) validate() error {
	switch h.Kind {
	case KindDump:
		if h.Body != BodyPgDumpCustom && h.Body != BodyPgDumpDirectoryTar {
			return fmt.Errorf("body %q does not suit kind %q (want %q or %q)", h.Body, h.Kind, BodyPgDumpCustom, BodyPgDumpDirectoryTar)
		}
	case KindSnapshot, KindIncremental:
		if h.Body != BodyJSONL {
			return fmt.Errorf("body %q does not suit kind %q (want %q)", h.Body, h.Kind, BodyJSONL)
		}
	default:
		return fmt.Errorf("unknown kind %q (want %q, %q or %q)", h.Kind, KindDump, KindSnapshot, KindIncremental)
	}
	if h.Engine == "" {
		return errors.New("engine is missing")
	}
	if !h.End.IsZero() && h.End < h.Start {
		return fmt.Errorf("end %v is before start %v", h.End, h.Start)
	}
	return nil
}

// EnvelopeTrailer is what an envelope records after its body.
type EnvelopeTrailer struct {
	// BodyBytes is the body's length.
	BodyBytes int64 `json:"body_bytes"`
	// BodySHA256 is the body's SHA-256, in lowercase hex.
	BodySHA256 string `json:"body_sha256"`
	// HeaderSHA256 is the SHA-256 of the magic and header lines, in
	// lowercase hex.
	HeaderSHA256 string `json:"header_sha256"`
	// End is where the body ends when the header could not say (zero
	// otherwise).
	End Position `json:"end,omitzero"`
	// BaseWALEnd is the base slot's WAL end, when the header has a Base.
	BaseWALEnd Position `json:"base_wal_end,omitzero"`
}

// Link identifies the whole envelope, header and body: the SHA-256 of the
// header's and the body's SHA-256 digests, in lowercase hex. The next
// envelope of a chain records it as its Previous.
func (t EnvelopeTrailer) Link() string {
	h, errH := hex.DecodeString(t.HeaderSHA256)
	b, errB := hex.DecodeString(t.BodySHA256)
	if errH != nil || errB != nil {
		return ""
	}
	sum := sha256.Sum256(append(h, b...))
	return hex.EncodeToString(sum[:])
}

// marshal encodes the trailer line: JSON, a space, its CRC-32C, "\n".
func (t EnvelopeTrailer) marshal() []byte {
	js, _ := json.Marshal(t) // cannot fail: plain fields
	line := append(js, ' ')
	line = fmt.Appendf(line, "%08x\n", crc32.Checksum(js, castagnoli))
	return line
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Errors of envelopes; an [*EnvelopeError] wraps one of them (or
// [ErrUnsupportedVersion]). Branch with [errors.Is].
var (
	// ErrNotEnvelope means the stream does not start like an envelope.
	ErrNotEnvelope = errors.New("not a siphon envelope")
	// ErrEnvelopeTruncated means the stream ends before the envelope does:
	// it was cut short. It wraps [io.ErrUnexpectedEOF].
	ErrEnvelopeTruncated = fmt.Errorf("envelope cut short: %w", io.ErrUnexpectedEOF)
	// ErrEnvelopeCorrupt means the envelope's bytes changed since it was
	// written: a checksum, length or framing does not match.
	ErrEnvelopeCorrupt = errors.New("envelope corrupted")
	// ErrEnvelopeHeader means the header is not valid: malformed JSON, an
	// unknown kind, a missing field.
	ErrEnvelopeHeader = errors.New("invalid envelope header")
)

// EnvelopeError reports what is wrong with an envelope and where.
type EnvelopeError struct {
	// Offset is the byte offset in the stream where the problem is: the
	// start of the line, field or chunk concerned.
	Offset int64
	// Problem says what is wrong, and what was expected.
	Problem string
	// Err is one of the envelope sentinel errors.
	Err error
}

// Error names the offset and the problem, for example "canonical:
// envelope, byte 1234: chunk of 262144 bytes (body bytes 0 to 262143)
// fails its CRC-32C check: envelope corrupted".
func (e *EnvelopeError) Error() string {
	return "canonical: envelope, byte " + strconv.FormatInt(e.Offset, 10) + ": " + e.Problem + ": " + e.Err.Error()
}

// Unwrap returns Err.
func (e *EnvelopeError) Unwrap() error { return e.Err }

// EnvelopeWriter writes an envelope: the header at once, then the body as
// it is written, then the trailer on Close. It holds at most one chunk
// (256 KiB) of the body. It is not safe for concurrent use.
type EnvelopeWriter struct {
	w       io.Writer
	frame   []byte // length, chunk data, room for the CRC
	chunk   int    // body bytes per chunk
	header  hash.Hash
	body    hash.Hash
	bytes   int64
	trailer EnvelopeTrailer
	closed  bool
	err     error
}

// NewEnvelopeWriter checks h and writes the magic and header lines to w.
// Write the body to the returned writer, then Close it. A header whose
// Created is zero gets the current time.
func NewEnvelopeWriter(w io.Writer, h EnvelopeHeader) (*EnvelopeWriter, error) {
	if err := h.validate(); err != nil {
		return nil, fmt.Errorf("canonical: write envelope: %w: %v", ErrEnvelopeHeader, err)
	}
	if h.Created.IsZero() {
		h.Created = time.Now()
	}
	h.Created = h.Created.UTC()
	js, err := json.Marshal(h)
	if err != nil {
		return nil, fmt.Errorf("canonical: write envelope: %w", err)
	}
	lines := append([]byte(EnvelopeMagic+strconv.Itoa(EnvelopeVersion)+"\n"), js...)
	lines = append(lines, '\n')
	ew := &EnvelopeWriter{w: w, chunk: envelopeChunk, frame: make([]byte, 4, 4+envelopeChunk+4), header: sha256.New(), body: sha256.New()}
	ew.header.Write(lines)
	if _, err := w.Write(lines); err != nil {
		return nil, fmt.Errorf("canonical: write envelope header: %w", err)
	}
	return ew, nil
}

// Write adds p to the body.
func (e *EnvelopeWriter) Write(p []byte) (int, error) {
	if e.err != nil {
		return 0, e.err
	}
	if e.closed {
		return 0, errors.New("canonical: write to a closed envelope")
	}
	n := 0
	for len(p) > 0 {
		k := min(len(p), 4+e.chunk-len(e.frame))
		e.frame = append(e.frame, p[:k]...)
		p, n = p[k:], n+k
		if len(e.frame) == 4+e.chunk {
			if err := e.flush(); err != nil {
				return n, err
			}
		}
	}
	return n, nil
}

// flush writes the pending chunk, if any.
func (e *EnvelopeWriter) flush() error {
	data := e.frame[4:]
	if len(data) == 0 {
		return nil
	}
	e.body.Write(data)
	e.bytes += int64(len(data))
	binary.BigEndian.PutUint32(e.frame[:4], uint32(len(data)))
	e.frame = binary.BigEndian.AppendUint32(e.frame, crc32.Checksum(data, castagnoli))
	if _, err := e.w.Write(e.frame); err != nil {
		e.err = fmt.Errorf("canonical: write envelope body: %w", err)
		return e.err
	}
	e.frame = e.frame[:4]
	return nil
}

// SetEnd records where the body ends, for a header that could not say
// (an incremental learns it at the end). Call it before Close.
func (e *EnvelopeWriter) SetEnd(end Position) { e.trailer.End = end }

// SetBaseWALEnd records the base slot's WAL end. Call it before Close.
func (e *EnvelopeWriter) SetBaseWALEnd(end Position) { e.trailer.BaseWALEnd = end }

// Close writes the last chunk, the end marker and the trailer. It does not
// close the underlying writer. Calling it again does nothing.
func (e *EnvelopeWriter) Close() error {
	if e.err != nil || e.closed {
		return e.err
	}
	if err := e.flush(); err != nil {
		return err
	}
	e.closed = true
	e.trailer.BodyBytes = e.bytes
	e.trailer.BodySHA256 = hex.EncodeToString(e.body.Sum(nil))
	e.trailer.HeaderSHA256 = hex.EncodeToString(e.header.Sum(nil))
	out := append([]byte{0, 0, 0, 0}, e.trailer.marshal()...)
	if _, err := e.w.Write(out); err != nil {
		e.err = fmt.Errorf("canonical: write envelope trailer: %w", err)
	}
	return e.err
}

// Trailer returns the trailer Close wrote.
func (e *EnvelopeWriter) Trailer() EnvelopeTrailer { return e.trailer }

// Written returns how many body bytes were written so far.
func (e *EnvelopeWriter) Written() int64 { return e.bytes + int64(len(e.frame)-4) }
