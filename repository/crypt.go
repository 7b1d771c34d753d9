package repository

// Encryption: every object of a keyed repository is sealed with AES-256-GCM
// in segments, so that a dump of any size streams through in bounded
// memory and a reader hands on only segments that authenticated.
//
// An encrypted object, format 1, byte by byte:
//
//	magic         8 bytes "SPHXENC1"
//	key id        8 bytes: the first 8 bytes of HMAC-SHA-256(master key,
//	              "siphon key id") (canonical.KeyID of the master key)
//	salt          32 random bytes, new for every object
//	segment size  4 bytes big-endian: plaintext bytes per segment
//	segments      each: AES-256-GCM(object key, nonce, plaintext, AD) with
//	              its 16-byte tag; every segment holds segment-size bytes
//	              but the last, which holds 0 to segment-size bytes
//
// object key = HKDF-SHA-256(secret: the master key's object (or manifest)
// subkey, salt, info "siphon repository v1 object"), 32 bytes; nonce = 7
// zero bytes, the segment's number (from 0) as 4 bytes big-endian, and 1
// for the last segment, 0 for the others; AD = the 52 header bytes and the
// object's key from "chains/" on. So a changed byte fails its segment, a
// cut object fails (its last segment was sealed as not last), an object
// moved to another name or chain fails its first segment, and a manifest
// cannot pass for a link (they use different subkeys).

import (
	"bufio"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"

	"github.com/siphondb/siphon/canonical"
)

const (
	encMagic      = "SPHXENC1"
	encHeaderSize = 8 + 8 + 32 + 4
	segmentSize   = 1 << 20
	tagSize       = 16
	// maxSegment bounds the segment size a reader accepts.
	maxSegment = 16 << 20
)

// The HKDF info strings of the subkeys derived from a master key.
const (
	infoObject   = "siphon repository v1 object encryption"
	infoManifest = "siphon repository v1 manifest encryption"
	infoStream   = "siphon repository v1 canonical stream key"
	infoPerObj   = "siphon repository v1 object"
)

// key is one master key's subkeys.
type key struct {
	id       [8]byte
	object   []byte // seals links and verification records
	manifest []byte // seals manifests
	stream   []byte // the canonical stream key (siphon.WithStreamKey)
}

// keyring holds the current key (first) and the previous ones.
type keyring struct {
	keys []*key
}

// newKeyring derives the subkeys of each master key.
func newKeyring(masters [][]byte) (*keyring, error) {
	kr := &keyring{}
	for _, m := range masters {
		k := &key{}
		idHex := canonical.KeyID(m)
		if _, err := hex.Decode(k.id[:], []byte(idHex)); err != nil {
			return nil, fmt.Errorf("key id: %w", err)
		}
		var err error
		if k.object, err = hkdf.Key(sha256.New, m, nil, infoObject, 32); err != nil {
			return nil, err
		}
		if k.manifest, err = hkdf.Key(sha256.New, m, nil, infoManifest, 32); err != nil {
			return nil, err
		}
		if k.stream, err = hkdf.Key(sha256.New, m, nil, infoStream, 32); err != nil {
			return nil, err
		}
		kr.keys = append(kr.keys, k)
	}
	return kr, nil
}

// current returns the key new objects are sealed with (nil: none).
func (kr *keyring) current() *key {
	if kr == nil || len(kr.keys) == 0 {
		return nil
	}
	return kr.keys[0]
}

// byID returns the key with id.
func (kr *keyring) byID(id [8]byte) *key {
	if kr == nil {
		return nil
	}
	for _, k := range kr.keys {
		if k.id == id {
			return k
		}
	}
	return nil
}

// streamKeys returns the canonical stream keys, the current one first.
func (kr *keyring) streamKeys() [][]byte {
	if kr == nil {
		return nil
	}
	var out [][]byte
	for _, k := range kr.keys {
		out = append(out, k.stream)
	}
	return out
}

// subkeyRole says which subkey seals an object.
type subkeyRole int

const (
	roleObject subkeyRole = iota
	roleManifest
)

func (k *key) subkey(role subkeyRole) []byte {
	if role == roleManifest {
		return k.manifest
	}
	return k.object
}

// objectAEAD derives the object key of salt and returns its AEAD.
func objectAEAD(subkey, salt []byte) (cipher.AEAD, error) {
	ok, err := hkdf.Key(sha256.New, subkey, salt, infoPerObj, 32)
	if err != nil {
		return nil, err
	}
	block, err := aes.NewCipher(ok)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(block)
}

// segmentNonce returns the nonce of segment n.
func segmentNonce(dst []byte, n uint32, last bool) []byte {
	dst = dst[:12]
	clear(dst)
	binary.BigEndian.PutUint32(dst[7:11], n)
	if last {
		dst[11] = 1
	}
	return dst
}

// sealWriter encrypts what is written to it into w, a segment at a time.
// Close seals the last segment; it does not close w.
type sealWriter struct {
	w      io.Writer
	aead   cipher.AEAD
	ad     []byte
	buf    []byte // plaintext of the segment being filled
	out    []byte
	nonce  [12]byte
	n      uint32
	closed bool
	err    error
}

// newSealWriter writes the header of an object named name, sealed with
// k's subkey for role, to w.
func newSealWriter(w io.Writer, k *key, role subkeyRole, name string) (*sealWriter, error) {
	header := make([]byte, 0, encHeaderSize)
	header = append(header, encMagic...)
	header = append(header, k.id[:]...)
	salt := make([]byte, 32)
	if _, err := rand.Read(salt); err != nil {
		return nil, err
	}
	header = append(header, salt...)
	header = binary.BigEndian.AppendUint32(header, segmentSize)
	aead, err := objectAEAD(k.subkey(role), salt)
	if err != nil {
		return nil, err
	}
	if _, err := w.Write(header); err != nil {
		return nil, err
	}
	return &sealWriter{
		w: w, aead: aead, ad: append(header, name...),
		buf: make([]byte, 0, segmentSize), out: make([]byte, 0, segmentSize+tagSize),
	}, nil
}

func (s *sealWriter) Write(p []byte) (int, error) {
	if s.err != nil {
		return 0, s.err
	}
	written := 0
	for len(p) > 0 {
		// A full segment is sealed only once more comes: the last one is
		// sealed as last by Close.
		if len(s.buf) == segmentSize {
			if err := s.seal(false); err != nil {
				return written, err
			}
		}
		k := min(len(p), segmentSize-len(s.buf))
		s.buf = append(s.buf, p[:k]...)
		p, written = p[k:], written+k
	}
	return written, nil
}

func (s *sealWriter) seal(last bool) error {
	s.out = s.aead.Seal(s.out[:0], segmentNonce(s.nonce[:], s.n, last), s.buf, s.ad)
	s.n++
	s.buf = s.buf[:0]
	if _, err := s.w.Write(s.out); err != nil {
		s.err = err
		return err
	}
	return nil
}

// Close seals the last segment.
func (s *sealWriter) Close() error {
	if s.closed || s.err != nil {
		return s.err
	}
	s.closed = true
	return s.seal(true)
}

// openReader decrypts an object read from r, a segment at a time, and
// returns only segments that authenticated; its Read returns io.EOF only
// after the last segment authenticated as last and nothing followed it.
type openReader struct {
	r      *bufio.Reader
	name   string
	aead   cipher.AEAD
	ad     []byte
	seg    int
	in     []byte
	plain  []byte // decrypted bytes not yet returned
	nonce  [12]byte
	n      uint32
	done   bool
	err    error
	header [encHeaderSize]byte
}

// readEncHeader reads an object's header from r and returns it with the
// key it names, looked up in kr; errors name the object.
func readEncHeader(r io.Reader, kr *keyring, name string) (header [encHeaderSize]byte, k *key, err error) {
	if _, err := io.ReadFull(r, header[:]); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return header, nil, &IntegrityError{Object: name, Problem: "it is shorter than an encrypted object's header"}
		}
		return header, nil, err
	}
	if string(header[:8]) != encMagic {
		return header, nil, &IntegrityError{Object: name,
			Problem: "it is not encrypted (it does not start like an encrypted object), and every object of a repository opened WithKey is: someone without the key wrote it, or the repository was written without a key (open it without WithKey then)"}
	}
	var id [8]byte
	copy(id[:], header[8:16])
	if kr.current() == nil {
		return header, nil, fmt.Errorf("%w: %s is encrypted with key %x", ErrNeedsKey, name, id)
	}
	if k = kr.byID(id); k == nil {
		return header, nil, &IntegrityError{Object: name,
			Problem: fmt.Sprintf("it is encrypted with key %x, which is not one of this repository's keys (give it to WithKey as a previous key if it is yours)", id)}
	}
	return header, k, nil
}

// newOpenReader reads the header of the object name from r and returns a
// reader of its plaintext.
func newOpenReader(r io.Reader, kr *keyring, role subkeyRole, name string) (*openReader, error) {
	header, k, err := readEncHeader(r, kr, name)
	if err != nil {
		return nil, err
	}
	seg := int(binary.BigEndian.Uint32(header[48:52]))
	if seg < 1 || seg > maxSegment {
		return nil, &IntegrityError{Object: name, Problem: fmt.Sprintf("its header gives a segment size of %d bytes", seg)}
	}
	aead, err := objectAEAD(k.subkey(role), header[16:48])
	if err != nil {
		return nil, err
	}
	o := &openReader{r: bufio.NewReaderSize(r, 64<<10), name: name, aead: aead, seg: seg, header: header}
	o.ad = append(append([]byte(nil), header[:]...), name...)
	o.in = make([]byte, seg+tagSize)
	return o, nil
}

func (o *openReader) Read(p []byte) (int, error) {
	for len(o.plain) == 0 {
		if o.err != nil {
			return 0, o.err
		}
		if o.done {
			return 0, io.EOF
		}
		o.err = o.next()
	}
	n := copy(p, o.plain)
	o.plain = o.plain[n:]
	return n, nil
}

// next reads, authenticates and decrypts the next segment.
func (o *openReader) next() error {
	n, err := io.ReadFull(o.r, o.in)
	last := false
	switch {
	case errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF):
		last = true
	case err != nil:
		return err
	default:
		if _, perr := o.r.Peek(1); errors.Is(perr, io.EOF) {
			last = true
		} else if perr != nil {
			return perr
		}
	}
	if n < tagSize {
		return &IntegrityError{Object: o.name, Problem: fmt.Sprintf("it ends inside segment %d: it was cut short", o.n)}
	}
	plain, err := o.aead.Open(o.in[:0], segmentNonce(o.nonce[:], o.n, last), o.in[:n], o.ad)
	if err != nil {
		problem := fmt.Sprintf("segment %d fails authentication: it was changed, moved from another object or chain, or encrypted with another key", o.n)
		if last {
			problem = fmt.Sprintf("segment %d fails authentication as the last segment: the object was cut short, changed, or moved from another object or chain", o.n)
		}
		return &IntegrityError{Object: o.name, Problem: problem}
	}
	o.n++
	o.plain, o.done = plain, last
	return nil
}

// Decrypt writes the plaintext of an encrypted object of a repository to
// dst: what a person restoring by hand needs before pg_restore (a base
// backup's object decrypts to pg_dump's archive) or zstd -d (an
// incremental's decrypts to zstd-compressed JSONL). name is the object's
// key from "chains/" on, as the bucket lists it under the repository's
// prefix (the name is part of what is authenticated); keys are the
// repository's master keys, the one it was written with among them.
// Nothing is written to dst of a segment that does not authenticate; an
// object cut short is an *IntegrityError at its end, after the segments
// before the cut were written: remove dst on any error. It reads links and
// verification records; manifests, sealed with another subkey, are read
// with Repository.Chains.
func Decrypt(dst io.Writer, src io.Reader, name string, keys ...[]byte) error {
	for i, k := range keys {
		if len(k) < canonical.MinKeyBytes {
			return &OptionError{Option: "Decrypt", Problem: fmt.Sprintf("key %d has %d bytes", i+1, len(k)), Fix: "give the repository's keys"}
		}
	}
	if len(keys) == 0 {
		return &OptionError{Option: "Decrypt", Problem: "no key given", Fix: "give the repository's key (and previous keys)"}
	}
	kr, err := newKeyring(keys)
	if err != nil {
		return errorf("repository: decrypt %s: %w", name, err)
	}
	r, err := newOpenReader(src, kr, roleObject, objectName(name))
	if err != nil {
		return errorf("repository: decrypt %s: %w", name, err)
	}
	if _, err := io.Copy(dst, r); err != nil {
		return errorf("repository: decrypt %s: %w", name, err)
	}
	return nil
}
