package repository

import (
	"context"
	"errors"
	"io"
	"time"

	"github.com/siphondb/siphon/canonical"
)

// SetBeforeManifest makes r call f before it writes a manifest generation
// (tests only).
func SetBeforeManifest(r *Repository, f func(chain string, gen int)) { r.beforeManifest = f }

// Writer returns the id r writes in its manifests (tests only).
func Writer(r *Repository) string { return r.writer }

// BenchLink is a link written through the upload path without a source,
// for benchmarks.
type BenchLink struct {
	r   *Repository
	rec linkRecord
}

// UploadLink writes plain (a dump's envelope, or an incremental's JSONL)
// through the repository's upload path, as StartChain and AddLink do once
// siphon hands them the bytes (tests only).
func UploadLink(ctx context.Context, r *Repository, dump bool, plain io.Reader) (*BenchLink, error) {
	id := newChainID(time.Now())
	if dump {
		name := linkObjectName(id, 1, canonical.KindDump, canonical.BodyPgDumpCustom, false, r.Encrypted())
		ow, err := r.newObjectWriter(ctx, name, kindDump, false, nil)
		if err != nil {
			return nil, err
		}
		es := newEnvelopeSplitter(ow)
		_, err = io.Copy(es, plain)
		s, serr := es.split()
		if err = errors.Join(err, serr); err != nil {
			ow.abort()
			return nil, err
		}
		if err := ow.commit(); err != nil {
			return nil, err
		}
		return &BenchLink{r: r, rec: linkRecord{N: 1, Kind: canonical.KindDump, Object: name, Encrypted: r.Encrypted(),
			StoredBytes: ow.stored, SHA256: ow.checksum(), Bytes: ow.plain, Envelope: &envelopeRecord{Head: string(s.head), Trailer: s.trailer}}}, nil
	}
	name := linkObjectName(id, 2, canonical.KindIncremental, canonical.BodyJSONL, true, r.Encrypted())
	ow, err := r.newObjectWriter(ctx, name, kindIncremental, true, nil)
	if err != nil {
		return nil, err
	}
	if _, err := io.Copy(tapWriter{scan: newJSONLScanner(nil), obj: ow}, plain); err != nil {
		ow.abort()
		return nil, err
	}
	if err := ow.commit(); err != nil {
		return nil, err
	}
	return &BenchLink{r: r, rec: linkRecord{N: 2, Kind: canonical.KindIncremental, Object: name, Encrypted: r.Encrypted(), Compression: "zstd",
		StoredBytes: ow.stored, SHA256: ow.checksum(), Bytes: ow.plain}}, nil
}

// Open reads the link back through the download path.
func (b *BenchLink) Open(ctx context.Context) io.ReadCloser {
	return b.r.newLinkReader(ctx, "bench", b.rec)
}

// Object is the link's key.
func (b *BenchLink) Object() string { return b.rec.Object }

// StoredBytes is the link's size in the bucket.
func (b *BenchLink) StoredBytes() int64 { return b.rec.StoredBytes }
