package repository

// A base backup's envelope (canonical's format, see its documentation)
// is split as siphon's Backup writes it: the magic and header lines and
// the trailer go to the manifest, the body to the object, so that the
// object is pg_dump's archive alone. The framing is checked as it passes
// (every chunk's CRC-32C, the trailer's, the body's length, nothing after
// the trailer); the body's SHA-256, which only guards the bytes between
// siphon's writer and this one in memory, is checked when the link is
// read back (a restore verifies the envelope whole before it applies it).

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"

	"github.com/siphondb/siphon/canonical"
)

// The limits of canonical's envelope reader.
const (
	maxEnvelopeHead    = 1<<20 + 64
	maxEnvelopeTrailer = 4 << 10
	maxEnvelopeChunk   = 1 << 20
)

// envelopeSplitter is an io.Writer that takes an envelope and writes its
// body to body.
type envelopeSplitter struct {
	body    io.Writer
	state   int
	head    []byte
	lines   int
	header  canonical.EnvelopeHeader
	word    []byte // a length or a CRC being read
	left    int    // body bytes left in the current chunk
	crc     uint32
	bytes   int64
	line    []byte
	trailer canonical.EnvelopeTrailer
	err     error
}

const (
	splitHead = iota
	splitLength
	splitData
	splitCRC
	splitTrailer
	splitDone
)

func newEnvelopeSplitter(body io.Writer) *envelopeSplitter {
	return &envelopeSplitter{body: body}
}

func (s *envelopeSplitter) Write(p []byte) (int, error) {
	if s.err != nil {
		return 0, s.err
	}
	n := len(p)
	for len(p) > 0 && s.err == nil {
		p = s.step(p)
	}
	if s.err != nil {
		return 0, s.err
	}
	return n, nil
}

// step consumes what it can of p in the current state.
func (s *envelopeSplitter) step(p []byte) []byte {
	switch s.state {
	case splitHead:
		return s.takeHead(p)
	case splitLength, splitCRC:
		k := min(4-len(s.word), len(p))
		s.word = append(s.word, p[:k]...)
		if len(s.word) == 4 {
			s.endWord()
		}
		return p[k:]
	case splitData:
		k := min(s.left, len(p))
		if _, err := s.body.Write(p[:k]); err != nil {
			s.err = err
			return nil
		}
		s.crc = crc32.Update(s.crc, castagnoli, p[:k])
		s.left -= k
		s.bytes += int64(k)
		if s.left == 0 {
			s.state = splitCRC
		}
		return p[k:]
	case splitTrailer:
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			s.line = append(s.line, p...)
			s.checkLen(len(s.line), maxEnvelopeTrailer, "the trailer line")
			return nil
		}
		s.line = append(s.line, p[:i]...)
		s.err = s.readTrailer()
		s.state = splitDone
		return p[i+1:]
	}
	s.err = errors.New("the backup wrote past its envelope's trailer")
	return nil
}

// takeHead keeps the magic and header lines.
func (s *envelopeSplitter) takeHead(p []byte) []byte {
	for i, c := range p {
		if c != '\n' {
			continue
		}
		if s.lines++; s.lines < 2 {
			continue
		}
		s.head = append(s.head, p[:i+1]...)
		er := canonical.NewEnvelopeReader(bytes.NewReader(s.head))
		h, err := er.Header()
		switch {
		case err != nil:
			s.err = err
		case h.Kind != canonical.KindDump:
			s.err = fmt.Errorf("the base backup is a %s, not a dump", h.Kind)
		}
		s.header, s.state = h, splitLength
		return p[i+1:]
	}
	s.head = append(s.head, p...)
	s.checkLen(len(s.head), maxEnvelopeHead, "the magic and header lines")
	return nil
}

// endWord acts on a chunk length or a chunk's CRC-32C.
func (s *envelopeSplitter) endWord() {
	v := binary.BigEndian.Uint32(s.word)
	s.word = s.word[:0]
	if s.state == splitCRC {
		if v != s.crc {
			s.err = fmt.Errorf("the envelope's chunk ending at body byte %d fails its CRC-32C check", s.bytes)
		}
		s.state = splitLength
		return
	}
	switch {
	case v == 0:
		s.state = splitTrailer
	case v > maxEnvelopeChunk:
		s.err = fmt.Errorf("the envelope has a chunk of %d bytes, more than %d", v, maxEnvelopeChunk)
	default:
		s.left, s.crc, s.state = int(v), 0, splitData
	}
}

// readTrailer parses and checks the trailer line.
func (s *envelopeSplitter) readTrailer() error {
	js, sum := s.line, []byte(nil)
	if i := bytes.LastIndexByte(s.line, ' '); i >= 0 {
		js, sum = s.line[:i], s.line[i+1:]
	}
	if want := fmt.Sprintf("%08x", crc32.Checksum(js, castagnoli)); string(sum) != want {
		return errors.New("the envelope's trailer line fails its CRC-32C check")
	}
	if err := json.Unmarshal(js, &s.trailer); err != nil {
		return fmt.Errorf("the envelope's trailer does not decode: %w", err)
	}
	if s.trailer.BodyBytes != s.bytes {
		return fmt.Errorf("the envelope's trailer says its body has %d bytes; it has %d", s.trailer.BodyBytes, s.bytes)
	}
	return nil
}

func (s *envelopeSplitter) checkLen(n, limit int, what string) {
	if n > limit {
		s.err = fmt.Errorf("%s of the envelope are longer than %d bytes", what, limit)
	}
}

// finish returns an error unless the whole envelope was written.
func (s *envelopeSplitter) finish() error {
	if s.err != nil {
		return s.err
	}
	if s.state != splitDone {
		return errors.New("the base backup's envelope ended before its trailer")
	}
	return nil
}

// split returns what the splitter kept of a whole envelope.
func (s *envelopeSplitter) split() (*split, error) {
	if err := s.finish(); err != nil {
		return nil, err
	}
	sp := &split{head: s.head, header: s.header, trailer: s.trailer}
	if b := s.header.Base; b != nil {
		sp.base = &canonical.EnvelopeBase{Slot: b.Slot, WALStart: b.WALStart, WALEnd: s.trailer.BaseWALEnd}
	}
	return sp, nil
}
