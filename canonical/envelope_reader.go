package canonical

import (
	"bufio"
	"bytes"
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
)

// EnvelopeReader reads an envelope: [EnvelopeReader.Header] returns the
// header, and Read returns the body, one verified chunk at a time. Read
// returns [io.EOF] only once the trailer is read and the body's length and
// SHA-256, the header's SHA-256 and the stream's end all check out; any
// problem before that is an [*EnvelopeError] naming its byte offset. Only
// io.EOF says the body was whole: a consumer must not act on what it read
// before seeing it. Errors are final. Errors of the underlying reader are
// returned wrapped, not as an EnvelopeError.
//
// The reader holds one chunk (at most 1 MiB) and the header line (at most
// 1 MiB). It is not safe for concurrent use.
type EnvelopeReader struct {
	r   *bufio.Reader
	off int64 // bytes consumed from r

	header     EnvelopeHeader
	haveHeader bool
	headerHash hash.Hash

	body      hash.Hash
	bodyStart int64
	bodyBytes int64
	buf       []byte
	pending   []byte // verified body bytes not yet returned

	trailer EnvelopeTrailer
	done    bool
	err     error
}

// NewEnvelopeReader returns a reader of the envelope r holds.
func NewEnvelopeReader(r io.Reader) *EnvelopeReader {
	return &EnvelopeReader{r: bufio.NewReaderSize(r, 64<<10), headerHash: sha256.New(), body: sha256.New()}
}

// Header reads the magic and header lines, if not read yet, and returns
// the header. An envelope of another format version is an error wrapping
// [ErrUnsupportedVersion]; the header is checked again against the
// trailer's SHA-256 at the end of the body.
func (e *EnvelopeReader) Header() (EnvelopeHeader, error) {
	if e.haveHeader {
		return e.header, nil
	}
	if e.err != nil {
		return EnvelopeHeader{}, e.err
	}
	if err := e.readMagic(); err != nil {
		return EnvelopeHeader{}, err
	}
	if err := e.readHeader(); err != nil {
		return EnvelopeHeader{}, err
	}
	e.haveHeader = true
	e.bodyStart = e.off
	return e.header, nil
}

// Read reads body bytes into p. See [EnvelopeReader] for what io.EOF
// means.
func (e *EnvelopeReader) Read(p []byte) (int, error) {
	if _, err := e.Header(); err != nil {
		return 0, err
	}
	for len(e.pending) == 0 {
		switch {
		case e.done:
			return 0, io.EOF
		case e.err != nil:
			return 0, e.err
		}
		if err := e.nextChunk(); err != nil {
			return 0, err
		}
	}
	n := copy(p, e.pending)
	e.pending = e.pending[n:]
	return n, nil
}

// Trailer returns the trailer, once Read has returned io.EOF.
func (e *EnvelopeReader) Trailer() (EnvelopeTrailer, error) {
	if !e.done {
		return EnvelopeTrailer{}, errors.New("canonical: the envelope's trailer is known once its body is read to io.EOF")
	}
	return e.trailer, nil
}

// Offset returns how many bytes of the stream were consumed so far; after
// io.EOF, the envelope's size.
func (e *EnvelopeReader) Offset() int64 { return e.off }

// BodyOffset returns the offset of the body's first chunk (0 before the
// header is read).
func (e *EnvelopeReader) BodyOffset() int64 { return e.bodyStart }

// fail records an *EnvelopeError at offset at and returns it.
func (e *EnvelopeReader) fail(at int64, sentinel error, format string, args ...any) error {
	e.err = &EnvelopeError{Offset: at, Problem: fmt.Sprintf(format, args...), Err: sentinel}
	return e.err
}

// readErr turns a read error into the reader's error: a stream that ends
// is cut short (what was expected there is said by want); anything else
// is the underlying reader's error.
func (e *EnvelopeReader) readErr(err error, want string) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return e.fail(e.off, ErrEnvelopeTruncated, "the stream ends where %s was expected", want)
	}
	e.err = fmt.Errorf("canonical: read envelope at byte %d: %w", e.off, err)
	return e.err
}

func (e *EnvelopeReader) readFull(p []byte, want string) error {
	n, err := io.ReadFull(e.r, p)
	e.off += int64(n)
	if err != nil {
		return e.readErr(err, want)
	}
	return nil
}

// readMagic reads "siphon-envelope/<version>\n".
func (e *EnvelopeReader) readMagic() error {
	start, err := e.r.Peek(len(EnvelopeMagic))
	if !bytes.HasPrefix(start, []byte(EnvelopeMagic)) {
		if len(start) > 0 && !bytes.HasPrefix([]byte(EnvelopeMagic), start) {
			return e.fail(0, ErrNotEnvelope, "the stream starts with %s", describeStart(start))
		}
		return e.readErr(err, "the magic line "+strconv.Quote(EnvelopeMagic+"1"))
	}
	line, err := e.readLine(len(EnvelopeMagic)+10, "the end of the magic line")
	if err != nil {
		return err
	}
	digits := line[len(EnvelopeMagic):]
	version, convErr := strconv.Atoi(string(digits))
	if convErr != nil || len(digits) == 0 || digits[0] < '0' || digits[0] > '9' {
		return e.fail(0, ErrNotEnvelope, "the magic line %q does not end in a format version number", line)
	}
	if version != EnvelopeVersion {
		return e.fail(int64(len(EnvelopeMagic)), ErrUnsupportedVersion,
			"envelope format version %d; this siphon reads version %d: read it with a siphon release that knows version %d",
			version, EnvelopeVersion, version)
	}
	return nil
}

// describeStart says what a stream that is not an envelope looks like.
func describeStart(b []byte) string {
	switch {
	case bytes.HasPrefix(b, []byte("PGDMP")):
		return `"PGDMP": it is a bare pg_dump archive (give it to pg_restore), not an envelope`
	case bytes.HasPrefix(b, []byte("{")):
		return `"{": it looks like a bare JSONL stream, not an envelope`
	}
	return fmt.Sprintf("%q instead of %q", b, EnvelopeMagic)
}

// readLine reads one line of at most limit bytes, newline excluded, and
// adds it to the header hash until the body starts.
func (e *EnvelopeReader) readLine(limit int, want string) ([]byte, error) {
	var line []byte
	for {
		frag, err := e.r.ReadSlice('\n')
		line = append(line, frag...)
		e.off += int64(len(frag))
		if len(line) > limit+1 || len(line) == limit+1 && line[limit] != '\n' {
			return nil, e.fail(e.off-int64(len(line)), ErrEnvelopeCorrupt, "a line longer than %d bytes where %s was expected", limit, want)
		}
		if err == nil {
			if !e.haveHeader {
				e.headerHash.Write(line)
			}
			return line[:len(line)-1], nil
		}
		if !errors.Is(err, bufio.ErrBufferFull) {
			return nil, e.readErr(err, want)
		}
	}
}

// readHeader reads and checks the header line.
func (e *EnvelopeReader) readHeader() error {
	at := e.off
	line, err := e.readLine(maxHeaderLine, "the header line")
	if err != nil {
		return err
	}
	var h EnvelopeHeader
	if err := json.Unmarshal(line, &h); err != nil {
		var syntax *json.SyntaxError
		if errors.As(err, &syntax) {
			return e.fail(at+max(syntax.Offset-1, 0), ErrEnvelopeHeader, "the header is not valid JSON: %v", err)
		}
		return e.fail(at, ErrEnvelopeHeader, "the header does not decode: %v", err)
	}
	if err := h.validate(); err != nil {
		return e.fail(at, ErrEnvelopeHeader, "%v", err)
	}
	e.header = h
	return nil
}

// nextChunk reads and verifies the next chunk, or the end marker and the
// trailer.
func (e *EnvelopeReader) nextChunk() error {
	at := e.off
	var word [4]byte
	if err := e.readFull(word[:], "a chunk length or the end marker"); err != nil {
		return err
	}
	n := binary.BigEndian.Uint32(word[:])
	if n == 0 {
		return e.readTrailer()
	}
	if n > maxChunk {
		return e.fail(at, ErrEnvelopeCorrupt, "a chunk length of %d bytes, more than the %d allowed", n, maxChunk)
	}
	if cap(e.buf) < int(n) {
		e.buf = make([]byte, max(int(n), envelopeChunk))
	}
	data := e.buf[:n]
	if err := e.readFull(data, fmt.Sprintf("the rest of the %d-byte chunk that starts at byte %d", n, at)); err != nil {
		return err
	}
	if err := e.readFull(word[:], fmt.Sprintf("the CRC-32C of the chunk that starts at byte %d", at)); err != nil {
		return err
	}
	if crc32.Checksum(data, castagnoli) != binary.BigEndian.Uint32(word[:]) {
		return e.fail(at, ErrEnvelopeCorrupt, "the chunk of %d bytes here (body bytes %d to %d) fails its CRC-32C check",
			n, e.bodyBytes, e.bodyBytes+int64(n)-1)
	}
	e.body.Write(data)
	e.bodyBytes += int64(n)
	e.pending = data
	return nil
}

// readTrailer reads the trailer line, checks it against what was read,
// and checks that the stream ends there.
func (e *EnvelopeReader) readTrailer() error {
	at := e.off
	line, err := e.readLine(maxTrailerLine, "the trailer line")
	if err != nil {
		return err
	}
	js, sum := line, []byte(nil)
	if i := bytes.LastIndexByte(line, ' '); i >= 0 {
		js, sum = line[:i], line[i+1:]
	}
	want := fmt.Sprintf("%08x", crc32.Checksum(js, castagnoli))
	if string(sum) != want {
		return e.fail(at, ErrEnvelopeCorrupt, "the trailer line fails its CRC-32C check (it ends in %q, the line's CRC-32C is %s)", sum, want)
	}
	var t EnvelopeTrailer
	if err := json.Unmarshal(js, &t); err != nil {
		return e.fail(at, ErrEnvelopeCorrupt, "the trailer does not decode: %v", err)
	}
	if err := e.checkTrailer(at, t); err != nil {
		return err
	}
	if _, err := e.r.ReadByte(); err == nil {
		return e.fail(e.off, ErrEnvelopeCorrupt, "data follows the trailer, where the stream should end")
	} else if !errors.Is(err, io.EOF) {
		return e.readErr(err, "the end of the stream")
	}
	e.trailer = t
	e.done = true
	return nil
}

// checkTrailer compares the trailer with the header and body read.
func (e *EnvelopeReader) checkTrailer(at int64, t EnvelopeTrailer) error {
	if t.BodyBytes != e.bodyBytes {
		return e.fail(at, ErrEnvelopeCorrupt, "the trailer says the body has %d bytes; it has %d", t.BodyBytes, e.bodyBytes)
	}
	if got := hex.EncodeToString(e.body.Sum(nil)); t.BodySHA256 != got {
		return e.fail(at, ErrEnvelopeCorrupt, "the body's SHA-256 is %s; the trailer says %s", got, t.BodySHA256)
	}
	if got := hex.EncodeToString(e.headerHash.Sum(nil)); t.HeaderSHA256 != got {
		return e.fail(at, ErrEnvelopeCorrupt, "the magic and header lines' SHA-256 is %s; the trailer says %s (the header changed since it was written)", got, t.HeaderSHA256)
	}
	h := e.header
	if !t.End.IsZero() && (!h.End.IsZero() && t.End != h.End || t.End < h.Start) {
		return e.fail(at, ErrEnvelopeCorrupt, "the trailer's end %v does not fit the header's start %v and end %v", t.End, h.Start, h.End)
	}
	return nil
}
