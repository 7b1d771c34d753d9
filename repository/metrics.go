package repository

// Metrics (OpenTelemetry) and progress reports.

import (
	"context"
	"errors"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// The instruments' names; see the package documentation, "Metrics".
const (
	meterName          = "github.com/siphondb/siphon/repository"
	metricUploaded     = "siphon.repository.uploaded"
	metricDownloaded   = "siphon.repository.downloaded"
	metricObjects      = "siphon.repository.objects"
	metricDuration     = "siphon.repository.duration"
	metricErrors       = "siphon.repository.errors"
	progressEveryBytes = 1 << 20
)

// Progress reports how far an upload or a download of one object has
// come.
type Progress struct {
	// Op is "upload" (StartChain, AddLink) or "download" (Verify, Restore,
	// OpenLink).
	Op string
	// Chain and Link say which link (Link 1 is the base backup).
	Chain string
	Link  int
	// Object is the object's key.
	Object string
	// Bytes counts the plaintext bytes done (a dump's body, an
	// incremental's JSONL). EstimatedBytes is their total when known: the
	// manifest's size for a download, the previous base's for the upload
	// of a base, 0 (unknown) for an incremental's upload.
	Bytes, EstimatedBytes int64
	// Done is true on the object's last report.
	Done bool
}

// instruments are the repository's metrics.
type instruments struct {
	uploaded, downloaded, objects, errors metric.Int64Counter
	duration                              metric.Float64Histogram

	progressMu sync.Mutex
	progress   func(Progress)
}

func newInstruments(p metric.MeterProvider, progress func(Progress)) (*instruments, error) {
	m := p.Meter(meterName)
	in := &instruments{progress: progress}
	var err, e error
	in.uploaded, e = m.Int64Counter(metricUploaded, metric.WithUnit("By"),
		metric.WithDescription("Bytes written to the bucket, as stored (compressed, encrypted), by object kind."))
	err = errors.Join(err, e)
	in.downloaded, e = m.Int64Counter(metricDownloaded, metric.WithUnit("By"),
		metric.WithDescription("Bytes read from the bucket, as stored, by object kind."))
	err = errors.Join(err, e)
	in.objects, e = m.Int64Counter(metricObjects, metric.WithUnit("{object}"),
		metric.WithDescription("Objects written, read and deleted, by operation and object kind."))
	err = errors.Join(err, e)
	in.errors, e = m.Int64Counter(metricErrors, metric.WithUnit("{error}"),
		metric.WithDescription("Calls that failed, by call and error kind."))
	err = errors.Join(err, e)
	in.duration, e = m.Float64Histogram(metricDuration, metric.WithUnit("s"),
		metric.WithDescription("How long each call took, by call and outcome."))
	err = errors.Join(err, e)
	return in, err
}

// object kinds, the "kind" attribute.
const (
	kindDump        = "dump"
	kindIncremental = "incremental"
	kindManifest    = "manifest"
	kindRecord      = "record"
)

func (in *instruments) upload(ctx context.Context, kind string, bytes int64) {
	in.uploaded.Add(ctx, bytes, metric.WithAttributes(attribute.String("kind", kind)))
	in.objects.Add(ctx, 1, metric.WithAttributes(attribute.String("op", "upload"), attribute.String("kind", kind)))
}

func (in *instruments) download(ctx context.Context, kind string, bytes int64) {
	in.downloaded.Add(ctx, bytes, metric.WithAttributes(attribute.String("kind", kind)))
	in.objects.Add(ctx, 1, metric.WithAttributes(attribute.String("op", "download"), attribute.String("kind", kind)))
}

func (in *instruments) deleted(ctx context.Context, n int) {
	in.objects.Add(ctx, int64(n), metric.WithAttributes(attribute.String("op", "delete")))
}

// call starts timing a call; the returned function records its duration
// and, for an error, its kind. Give it the call's final error.
func (in *instruments) call(ctx context.Context, name string) func(err error) {
	began := time.Now()
	return func(err error) {
		outcome := "ok"
		if err != nil {
			outcome = "error"
			in.errors.Add(context.WithoutCancel(ctx), 1, metric.WithAttributes(attribute.String("call", name), attribute.String("kind", errorKind(err))))
		}
		in.duration.Record(context.WithoutCancel(ctx), time.Since(began).Seconds(),
			metric.WithAttributes(attribute.String("call", name), attribute.String("outcome", outcome)))
	}
}

// errorKind classifies an error for the errors metric.
func errorKind(err error) string {
	var (
		integrity *IntegrityError
		conflict  *ConflictError
		mismatch  *MismatchError
		option    *OptionError
	)
	switch {
	case errors.As(err, &integrity):
		return "integrity"
	case errors.As(err, &conflict):
		return "conflict"
	case errors.As(err, &mismatch):
		return "mismatch"
	case errors.As(err, &option):
		return "option"
	case errors.Is(err, ErrNoChain):
		return "no_chain"
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return "canceled"
	}
	return "other"
}

// report calls the progress function, one call at a time.
func (in *instruments) report(p Progress) {
	if in.progress == nil {
		return
	}
	in.progressMu.Lock()
	defer in.progressMu.Unlock()
	in.progress(p)
}

// progressCounter reports a stream's progress about every MiB.
type progressCounter struct {
	in       *instruments
	p        Progress
	reported int64
}

func (c *progressCounter) add(n int) {
	if c == nil {
		return
	}
	c.p.Bytes += int64(n)
	if c.in.progress != nil && c.p.Bytes-c.reported >= progressEveryBytes {
		c.reported = c.p.Bytes
		c.in.report(c.p)
	}
}

func (c *progressCounter) done() {
	if c == nil {
		return
	}
	c.p.Done = true
	c.in.report(c.p)
}
