package repository

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"

	"gocloud.dev/blob"
	_ "gocloud.dev/blob/fileblob" // file:// buckets, the embedded default
	_ "gocloud.dev/blob/s3blob"   // s3:// buckets
	"gocloud.dev/gcerrors"

	"github.com/siphondb/siphon"
)

// Repository is a repository of backup chains in a bucket. It is safe for
// concurrent use; see ConflictError for two writers on one chain.
type Repository struct {
	bucket *blob.Bucket
	owned  bool // Close closes the bucket
	opts   options
	keys   *keyring // nil: not encrypted
	in     *instruments
	log    *slog.Logger
	// writer identifies this Repository value in the manifests it writes.
	writer string
	closed atomic.Bool
	// encoders and decoders are zstd's, kept between links: making one
	// allocates its window and tables.
	encoders, decoders sync.Pool

	// beforeManifest, when set (by tests), runs before a manifest
	// generation is written.
	beforeManifest func(chain string, gen int)
}

// Open opens the repository in the bucket bucketURL names, through
// gocloud.dev/blob's URLs: "file:///var/backups/siphon" (a local directory,
// created if missing with "?create_dir=true"), "s3://bucket?region=eu-west-1"
// (with "endpoint", "use_path_style=true", "disable_https=true" for
// S3-compatible servers, and the AWS SDK's usual credentials), and any
// scheme whose driver the program imports: "gs://bucket" after importing
// gocloud.dev/blob/gcsblob, "azblob://container" after importing
// gocloud.dev/blob/azureblob (a blank import each; this package imports
// only the file and S3 drivers, so that Google's and Azure's SDKs are
// not built into programs that need neither). A "prefix=backups/" query
// parameter puts the repository under a prefix of the bucket. Open checks
// the options before it opens the bucket, and returns an *OptionError for
// a bad one; it writes nothing. Close the Repository to close the bucket.
func Open(ctx context.Context, bucketURL string, opts ...Option) (*Repository, error) {
	o, err := collect(opts)
	if err != nil {
		return nil, err
	}
	b, err := blob.OpenBucket(ctx, bucketURL)
	if err != nil {
		return nil, errorf("repository: open bucket: %w", err)
	}
	r, err := newRepository(b, o)
	if err != nil {
		b.Close()
		return nil, err
	}
	r.owned = true
	return r, nil
}

// New returns the repository in bucket, the caller's: Close leaves it open.
// Use blob.PrefixedBucket for a repository under a prefix. Options are
// checked as by Open.
func New(bucket *blob.Bucket, opts ...Option) (*Repository, error) {
	if bucket == nil {
		return nil, errorf("repository: new: the bucket: %w", ErrNilArgument)
	}
	o, err := collect(opts)
	if err != nil {
		return nil, err
	}
	return newRepository(bucket, o)
}

func collect(opts []Option) (options, error) {
	o := defaultOptions()
	for _, opt := range opts {
		if opt == nil {
			return o, &OptionError{Option: "Option", Problem: "a nil Option", Fix: "leave it out"}
		}
		opt(&o)
	}
	return o, o.check()
}

func newRepository(b *blob.Bucket, o options) (*Repository, error) {
	r := &Repository{bucket: b, opts: o, log: o.logger, writer: token(10)}
	if len(o.keys) > 0 {
		kr, err := newKeyring(o.keys)
		if err != nil {
			return nil, errorf("repository: keys: %w", err)
		}
		r.keys = kr
	}
	in, err := newInstruments(o.meter, o.progress)
	if err != nil {
		return nil, errorf("repository: metrics: %w", err)
	}
	r.in = in
	return r, nil
}

// Close closes the bucket if Open opened it. It is safe to call more than
// once; calls after it return errors wrapping ErrClosed.
func (r *Repository) Close() error {
	if r.closed.Swap(true) || !r.owned {
		return nil
	}
	if err := r.bucket.Close(); err != nil {
		return errorf("repository: close bucket: %w", err)
	}
	return nil
}

// Encrypted reports whether the repository was opened WithKey.
func (r *Repository) Encrypted() bool { return r.keys.current() != nil }

// StreamKey returns the siphon option that gives a Conn the repository's
// canonical stream keys (siphon.WithStreamKey with the key derived from
// the current master key, and those of the previous ones): connect the
// source with it, so that the incrementals it writes are authenticated
// (Repository.AddLink refuses them otherwise), and the restore target, so
// that it applies their schema changes. For a repository without a key it
// returns siphon.WithStreamKey(nil), which Connect refuses: open the
// repository WithKey, or give your Conns a key of your own.
func (r *Repository) StreamKey() siphon.Option {
	keys := r.keys.streamKeys()
	if len(keys) == 0 {
		return siphon.WithStreamKey(nil)
	}
	return siphon.WithStreamKey(keys[0], keys[1:]...)
}

// use returns ErrClosed after Close.
func (r *Repository) use() error {
	if r.closed.Load() {
		return ErrClosed
	}
	return nil
}

// putSmall writes a small object (a manifest, a record) whole, sealed when
// the repository is encrypted. With ifNotExist, an existing object is
// left as it is and errAlreadyExists returned.
func (r *Repository) putSmall(ctx context.Context, name string, data []byte, role subkeyRole, kind string, ifNotExist bool) error {
	if k := r.keys.current(); k != nil {
		var sealed bytes.Buffer
		sw, err := newSealWriter(&sealed, k, role, name)
		if err == nil {
			_, err = sw.Write(data)
		}
		if err == nil {
			err = sw.Close()
		}
		if err != nil {
			return fmt.Errorf("seal %s: %w", name, err)
		}
		data = sealed.Bytes()
	}
	err := r.bucket.WriteAll(ctx, name, data, &blob.WriterOptions{ContentType: "application/octet-stream", IfNotExist: ifNotExist})
	if ifNotExist && gcerrors.Code(err) == gcerrors.FailedPrecondition {
		return errAlreadyExists
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", name, err)
	}
	r.in.upload(ctx, kind, int64(len(data)))
	return nil
}

// errAlreadyExists is putSmall's for an object that exists.
var errAlreadyExists = errors.New("object exists")

// getSmall reads a small object whole, opened when the repository is
// encrypted.
func (r *Repository) getSmall(ctx context.Context, name string, role subkeyRole, kind string, limit int64) ([]byte, error) {
	rd, err := r.bucket.NewReader(ctx, name, nil)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", name, err)
	}
	defer rd.Close()
	var src io.Reader = rd
	if r.Encrypted() {
		or, err := newOpenReader(rd, r.keys, role, name)
		if err != nil {
			return nil, err
		}
		src = or
	}
	data, err := readLimited(src, limit, name)
	if err != nil {
		return nil, err
	}
	if !r.Encrypted() && bytes.HasPrefix(data, []byte(encMagic)) {
		return nil, fmt.Errorf("%w: %s", ErrNeedsKey, name)
	}
	r.in.download(ctx, kind, rd.Size())
	return data, nil
}

// list returns the keys under prefix (with delimiter "/": the "folders"
// too, ending in "/").
func (r *Repository) list(ctx context.Context, prefix string, folders bool) ([]*blob.ListObject, error) {
	opts := &blob.ListOptions{Prefix: prefix}
	if folders {
		opts.Delimiter = "/"
	}
	it := r.bucket.List(opts)
	var out []*blob.ListObject
	for {
		obj, err := it.Next(ctx)
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("list %s: %w", prefix, err)
		}
		out = append(out, obj)
	}
}

// isNotFound reports whether err says an object does not exist.
func isNotFound(err error) bool { return gcerrors.Code(err) == gcerrors.NotFound }
