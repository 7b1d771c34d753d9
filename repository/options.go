package repository

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/klauspost/compress/zstd"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"

	"github.com/siphondb/siphon/canonical"
)

// Option says who a Repository is: what holds for its whole life and every
// call it makes (its key, its compression, where it reports). Options are
// functional options given to Open or New, as siphon.Connect takes them,
// so that a Repository and the Conns it works with are set up the same
// way; Open and New check them all and return an *OptionError saying how
// to fix a bad one before the bucket is touched. What one call does is
// that call's parameters and its ...Options struct (StartChainOptions,
// VerifyOptions, RestoreOptions, ExpireOptions), whose zero values are
// the defaults, as in the siphon package.
type Option func(*options)

type options struct {
	keys        [][]byte // the current key first, then previous ones
	level       int      // zstd level
	meter       metric.MeterProvider
	progress    func(Progress)
	logger      *slog.Logger
	keyProblem  string
	nilProvider bool
}

func defaultOptions() options {
	return options{
		level:  3,
		meter:  noop.NewMeterProvider(),
		logger: slog.New(warnAndAbove{}),
	}
}

// WithKey makes the repository encrypted and authenticated with key, a
// secret of at least 32 random bytes that only the user holds (never in
// the bucket). Every object written from then on (links and manifests) is
// encrypted with AES-256-GCM under a key derived from it, and bound to its
// name, so that a changed, cut, swapped or foreign object is refused,
// naming it; the derived stream key authenticates the canonical links (see
// Repository.StreamKey). Objects written with one of the previous keys
// are still read: rotate by opening with a new key and the old ones as
// previous, and drop an old key once Expire removed the chains written
// with it. Defaults to no key: objects are compressed and checksummed, not
// encrypted nor authenticated (see the package documentation, "Threat
// model").
func WithKey(key []byte, previous ...[]byte) Option {
	return func(o *options) {
		o.keys = nil
		o.keyProblem = ""
		for i, k := range append([][]byte{key}, previous...) {
			if len(k) < canonical.MinKeyBytes {
				o.keyProblem = fmt.Sprintf("key %d has %d bytes, fewer than %d", i+1, len(k), canonical.MinKeyBytes)
				return
			}
			o.keys = append(o.keys, append([]byte(nil), k...))
		}
	}
}

// WithCompressionLevel sets the zstd level of the canonical links (the
// incrementals' JSONL), as zstd's command line takes it: 1 to 22, mapped
// to the four speeds github.com/klauspost/compress/zstd implements (1:
// fastest, 2 to 5: default, 6 to 9: better, 10 and above: best). Base
// backups are stored as pg_dump compressed them (see
// siphon.BackupOptions.Compression). Defaults to 3.
func WithCompressionLevel(level int) Option {
	return func(o *options) { o.level = level }
}

// WithMeterProvider makes the repository record its metrics (bytes and
// objects uploaded and downloaded, call durations, errors by kind: see
// the package documentation, "Metrics") with meters of p. Defaults to a
// no-op provider: nothing is recorded.
func WithMeterProvider(p metric.MeterProvider) Option {
	return func(o *options) {
		o.meter, o.nilProvider = p, p == nil
	}
}

// WithProgress sets a function that receives the progress of uploads and
// downloads, about every MiB and at the end of each object (see
// Progress). It is called from one goroutine at a time and must return
// quickly. Defaults to none.
func WithProgress(f func(Progress)) Option {
	return func(o *options) { o.progress = f }
}

// WithLogger sets the logger for state changes (a chain started, a link
// added, a chain expired, a base slot dropped); the repository never logs
// per byte or per row. Defaults to a logger that passes Warn and above to
// slog.Default, and drops the rest.
func WithLogger(l *slog.Logger) Option {
	return func(o *options) { o.logger = l }
}

// check returns an *OptionError for the first bad option.
func (o *options) check() error {
	switch {
	case o.keyProblem != "":
		return &OptionError{Option: "WithKey", Problem: o.keyProblem,
			Fix: fmt.Sprintf("give keys of at least %d random bytes (crypto/rand), kept apart from the bucket", canonical.MinKeyBytes)}
	case o.level < 1 || o.level > 22:
		return &OptionError{Option: "WithCompressionLevel", Problem: fmt.Sprintf("level %d", o.level),
			Fix: "give a zstd level from 1 to 22, or leave the option out for 3"}
	case o.nilProvider:
		return &OptionError{Option: "WithMeterProvider", Problem: "the provider is nil",
			Fix: "pass a metric.MeterProvider, or leave the option out"}
	case o.logger == nil:
		return &OptionError{Option: "WithLogger", Problem: "the logger is nil", Fix: "pass a *slog.Logger, or leave the option out"}
	}
	return nil
}

// encoderLevel maps a zstd command-line level to the encoder's.
func (o *options) encoderLevel() zstd.EncoderLevel { return zstd.EncoderLevelFromZstd(o.level) }

// warnAndAbove is the default logger's handler: Warn and above go to
// slog.Default, the rest is dropped.
type warnAndAbove struct{ attrs []slog.Attr }

func (warnAndAbove) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }

func (h warnAndAbove) Handle(ctx context.Context, r slog.Record) error {
	r.AddAttrs(h.attrs...)
	return slog.Default().Handler().Handle(ctx, r)
}

func (h warnAndAbove) WithAttrs(attrs []slog.Attr) slog.Handler {
	return warnAndAbove{attrs: append(append([]slog.Attr(nil), h.attrs...), attrs...)}
}

func (h warnAndAbove) WithGroup(string) slog.Handler { return h }
