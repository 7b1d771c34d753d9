package repository

// Link objects: written as a stream (compressed, sealed, checksummed,
// uploaded in parts as it comes) and read back as one (downloaded,
// checked, opened, decompressed), never held whole in memory or in a file.

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"hash"
	"hash/crc32"
	"io"
	"sync"

	"github.com/klauspost/compress/zstd"
	"gocloud.dev/blob"

	"github.com/siphondb/siphon/canonical"
)

// objectWriter writes one link object: what is written to it is
// compressed (optionally), sealed (in a keyed repository), checksummed
// and uploaded as it comes. commit completes the object; abort leaves
// none.
type objectWriter struct {
	name   string
	kind   string
	bw     *blob.Writer
	cancel context.CancelFunc
	sum    hash.Hash
	stored int64
	seal   *sealWriter
	zw     *zstd.Encoder
	top    io.Writer
	plain  int64
	prog   *progressCounter
	pool   *sync.Pool // of zstd encoders, where zw goes back
	err    error
}

func (r *Repository) newObjectWriter(ctx context.Context, name, kind string, compress bool, prog *progressCounter) (*objectWriter, error) {
	wctx, cancel := context.WithCancel(ctx)
	bw, err := r.bucket.NewWriter(wctx, name, &blob.WriterOptions{ContentType: "application/octet-stream"})
	if err != nil {
		cancel()
		return nil, fmt.Errorf("write %s: %w", name, err)
	}
	ow := &objectWriter{name: name, kind: kind, bw: bw, cancel: cancel, prog: prog, pool: &r.encoders}
	if !r.Encrypted() {
		// An encrypted object's segments authenticate it; a plain one's
		// SHA-256 goes to the manifest.
		ow.sum = sha256.New()
	}
	var w io.Writer = storedWriter{ow}
	if k := r.keys.current(); k != nil {
		if ow.seal, err = newSealWriter(w, k, roleObject, name); err != nil {
			ow.abort()
			return nil, fmt.Errorf("write %s: %w", name, err)
		}
		w = ow.seal
	}
	if compress {
		if zw, ok := r.encoders.Get().(*zstd.Encoder); ok {
			zw.Reset(w)
			ow.zw = zw
		} else if ow.zw, err = zstd.NewWriter(w, zstd.WithEncoderLevel(r.opts.encoderLevel()), zstd.WithEncoderConcurrency(1)); err != nil {
			ow.abort()
			return nil, fmt.Errorf("write %s: %w", name, err)
		}
		w = ow.zw
	}
	ow.top = w
	return ow, nil
}

// storedWriter hashes, counts and uploads the object's stored bytes.
type storedWriter struct{ ow *objectWriter }

func (s storedWriter) Write(p []byte) (int, error) {
	n, err := s.ow.bw.Write(p)
	if s.ow.sum != nil {
		s.ow.sum.Write(p[:n])
	}
	s.ow.stored += int64(n)
	return n, err
}

func (ow *objectWriter) Write(p []byte) (int, error) {
	if ow.err != nil {
		return 0, ow.err
	}
	n, err := ow.top.Write(p)
	ow.plain += int64(n)
	ow.prog.add(n)
	if err != nil {
		ow.err = fmt.Errorf("write %s: %w", ow.name, err)
		return n, ow.err
	}
	return n, nil
}

// commit flushes the compressor and the last segment and completes the
// upload: only then does the object exist.
func (ow *objectWriter) commit() error {
	defer ow.cancel()
	if ow.err != nil {
		ow.abort()
		return ow.err
	}
	if ow.zw != nil {
		if err := ow.zw.Close(); err != nil {
			ow.abort()
			return fmt.Errorf("write %s: %w", ow.name, err)
		}
		ow.release()
	}
	if ow.seal != nil {
		if err := ow.seal.Close(); err != nil {
			ow.abort()
			return fmt.Errorf("write %s: %w", ow.name, err)
		}
	}
	if err := ow.bw.Close(); err != nil {
		return fmt.Errorf("write %s: %w", ow.name, err)
	}
	ow.prog.done()
	return nil
}

// abort cancels the upload: the object is not created.
func (ow *objectWriter) abort() {
	ow.cancel()
	_ = ow.bw.Close() // returns the cancellation
	if ow.zw != nil {
		_ = ow.zw.Close()
		ow.release()
	}
}

// release gives the compressor back to the pool, pointing at nothing.
func (ow *objectWriter) release() {
	ow.zw.Reset(nil)
	ow.pool.Put(ow.zw)
	ow.zw = nil
}

// checksum returns the stored bytes' SHA-256 ("" for an encrypted
// object).
func (ow *objectWriter) checksum() string {
	if ow.sum == nil {
		return ""
	}
	return hex.EncodeToString(ow.sum.Sum(nil))
}

// linkReader reads a link's plaintext from the bucket: a dump's envelope
// (the object's body framed again between the envelope's recorded header
// and trailer) or an incremental's JSONL. It is an io.ReadSeeker that seeks
// only to its start (to read the link again, which reopens the object) or
// to where it stands, which is all siphon's VerifyChain and RestoreChain
// need. Read returns io.EOF only once the object's stored size and SHA-256
// matched the manifest's and, in a keyed repository, every segment
// authenticated; anything else is an *IntegrityError naming the object.
type linkReader struct {
	r     *Repository
	ctx   context.Context
	chain string
	rec   linkRecord
	pos   int64
	cur   io.Reader
	br    *blob.Reader
	check *storedReader
	zr    *zstd.Decoder
	prog  *progressCounter
	err   error
}

func (r *Repository) newLinkReader(ctx context.Context, chain string, rec linkRecord) *linkReader {
	return &linkReader{r: r, ctx: ctx, chain: chain, rec: rec}
}

// open opens the object and builds the reading pipeline.
func (l *linkReader) open() error {
	if l.rec.Encrypted && !l.r.Encrypted() {
		return fmt.Errorf("%w: %s", ErrNeedsKey, l.rec.Object)
	}
	br, err := l.r.bucket.NewReader(l.ctx, l.rec.Object, nil)
	if err != nil {
		if isNotFound(err) {
			return &IntegrityError{Object: l.rec.Object, Problem: "the manifest lists it and the bucket does not hold it (deleted)"}
		}
		return fmt.Errorf("read %s: %w", l.rec.Object, err)
	}
	l.br = br
	l.check = &storedReader{r: br}
	if l.rec.SHA256 != "" || !l.r.Encrypted() {
		l.check.sum = sha256.New()
	}
	var src io.Reader = l.check
	if l.r.Encrypted() {
		or, err := newOpenReader(src, l.r.keys, roleObject, l.rec.Object)
		if err != nil {
			l.closeCurrent()
			return err
		}
		src = or
	}
	if l.rec.Compression == "zstd" {
		zr, ok := l.r.decoders.Get().(*zstd.Decoder)
		if ok {
			err = zr.Reset(src)
		} else {
			zr, err = zstd.NewReader(src, zstd.WithDecoderConcurrency(1))
		}
		if err != nil {
			l.closeCurrent()
			return fmt.Errorf("read %s: %w", l.rec.Object, err)
		}
		l.zr, src = zr, zr
	}
	// The stored bytes are checked as soon as the plaintext ends, before
	// a dump's trailer is framed: siphon, reading the envelope, never sees
	// it end on bytes the manifest does not vouch for.
	src = &checkAtEOF{r: src, check: l.verifyStored}
	if l.rec.Envelope != nil {
		src = newEnvelopeFramer(src, l.rec.Envelope)
	}
	l.cur = src
	if l.r.in.progress != nil {
		l.prog = &progressCounter{in: l.r.in, p: Progress{Op: "download", Chain: l.chain, Link: l.rec.N, Object: l.rec.Object, EstimatedBytes: l.rec.Bytes}}
	}
	return nil
}

func (l *linkReader) Read(p []byte) (int, error) {
	if l.err != nil {
		return 0, l.err
	}
	if l.cur == nil {
		if err := l.open(); err != nil {
			l.err = err
			return 0, err
		}
	}
	n, err := l.cur.Read(p)
	l.pos += int64(n)
	l.prog.add(n)
	if err == io.EOF {
		err = l.finish()
	}
	if err != nil {
		if err != io.EOF {
			l.err = l.named(err)
			err = l.err
		}
		return n, err
	}
	return n, nil
}

// named gives a zstd error, whose cause can only be a changed object in
// an unencrypted repository, the object's name.
func (l *linkReader) named(err error) error {
	if _, ok := err.(*IntegrityError); ok {
		return err
	}
	if l.zr != nil && l.check != nil && (l.check.err == nil || l.check.err == io.EOF) {
		return &IntegrityError{Object: l.rec.Object, Problem: fmt.Sprintf("it does not decompress: %v", err)}
	}
	return err
}

// verifyStored checks the stored bytes against the manifest once the
// plaintext ended.
func (l *linkReader) verifyStored() error {
	if _, err := io.Copy(io.Discard, l.check); err != nil {
		return err
	}
	if l.check.n != l.rec.StoredBytes {
		return &IntegrityError{Object: l.rec.Object, Problem: fmt.Sprintf("it holds %d bytes; the manifest says %d (cut short, extended, or swapped with another object)", l.check.n, l.rec.StoredBytes)}
	}
	if l.check.sum == nil {
		return nil // every segment authenticated
	}
	switch got := hex.EncodeToString(l.check.sum.Sum(nil)); {
	case got != l.rec.SHA256:
		return &IntegrityError{Object: l.rec.Object, Problem: fmt.Sprintf("its SHA-256 is %s; the manifest says %s (changed, or swapped with another object)", got, l.rec.SHA256)}
	}
	return nil
}

// finish records a link read whole and returns io.EOF.
func (l *linkReader) finish() error {
	l.r.in.download(l.ctx, linkKind(l.rec.Kind), l.check.n)
	l.prog.done()
	l.closeCurrent()
	return io.EOF
}

// Seek seeks to the start (offset 0 from io.SeekStart, which reopens the
// object) or where the reader stands (offset 0 from io.SeekCurrent, or
// the current offset from io.SeekStart). Anything else returns
// ErrUnsupportedSeek.
func (l *linkReader) Seek(offset int64, whence int) (int64, error) {
	switch {
	case whence == io.SeekCurrent && offset == 0, whence == io.SeekStart && offset == l.pos:
		return l.pos, nil
	case whence == io.SeekStart && offset == 0:
		l.closeCurrent()
		l.pos, l.err = 0, nil
		return 0, nil
	}
	return l.pos, fmt.Errorf("%w: %s, seek to %d from %d", ErrUnsupportedSeek, l.rec.Object, offset, whence)
}

// Close closes the object being read.
func (l *linkReader) Close() error {
	l.closeCurrent()
	return nil
}

func (l *linkReader) closeCurrent() {
	if l.zr != nil {
		_ = l.zr.Reset(nil)
		l.r.decoders.Put(l.zr)
		l.zr = nil
	}
	if l.br != nil {
		_ = l.br.Close()
		l.br = nil
	}
	l.cur, l.check, l.prog = nil, nil, nil
}

// checkAtEOF runs check when r ends, and returns its error instead of
// io.EOF.
type checkAtEOF struct {
	r     io.Reader
	check func() error
}

func (c *checkAtEOF) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	if err == io.EOF {
		if cerr := c.check(); cerr != nil {
			return n, cerr
		}
	}
	return n, err
}

// storedReader hashes and counts the stored bytes read.
type storedReader struct {
	r   io.Reader
	sum hash.Hash
	n   int64
	err error // the last error of r
}

func (s *storedReader) Read(p []byte) (int, error) {
	n, err := s.r.Read(p)
	if s.sum != nil {
		s.sum.Write(p[:n])
	}
	s.n += int64(n)
	if err != nil {
		s.err = err
	}
	return n, err
}

// linkKind is a link's object kind, for metrics.
func linkKind(k canonical.Kind) string {
	if k == canonical.KindDump {
		return kindDump
	}
	return kindIncremental
}

// envelopeFramer frames a dump's body again as the envelope it came in:
// the recorded magic and header lines, the body in chunks with their
// CRC-32C, the end marker and the trailer (see canonical's envelope
// format). Its Link is the original's: it depends only on the header's
// and the body's SHA-256.
type envelopeFramer struct {
	body    io.Reader
	head    []byte
	tail    []byte
	frame   []byte
	out     []byte
	started bool
	ended   bool
}

// frameChunk is the body bytes per chunk, as canonical's writer uses.
const frameChunk = 256 << 10

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func newEnvelopeFramer(body io.Reader, rec *envelopeRecord) *envelopeFramer {
	js, _ := json.Marshal(rec.Trailer) // plain fields: cannot fail
	tail := append([]byte{0, 0, 0, 0}, js...)
	tail = fmt.Appendf(tail, " %08x\n", crc32.Checksum(js, castagnoli))
	return &envelopeFramer{body: body, head: []byte(rec.Head), tail: tail, frame: make([]byte, 4+frameChunk+4)}
}

func (f *envelopeFramer) Read(p []byte) (int, error) {
	for len(f.out) == 0 {
		switch {
		case !f.started:
			f.started, f.out = true, f.head
		case !f.ended:
			n, err := io.ReadFull(f.body, f.frame[4:4+frameChunk])
			if err == io.EOF || err == io.ErrUnexpectedEOF {
				f.ended = true
			} else if err != nil {
				return 0, err
			}
			if n > 0 {
				binary.BigEndian.PutUint32(f.frame[:4], uint32(n))
				binary.BigEndian.PutUint32(f.frame[4+n:], crc32.Checksum(f.frame[4:4+n], castagnoli))
				f.out = f.frame[:4+n+4]
			}
		case f.tail != nil:
			f.out, f.tail = f.tail, nil
		default:
			return 0, io.EOF
		}
	}
	n := copy(p, f.out)
	f.out = f.out[n:]
	return n, nil
}
