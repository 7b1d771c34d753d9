package siphon

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"

	"github.com/siphondb/siphon/canonical"
	"github.com/siphondb/siphon/internal/pgerr"
)

// Metrics, through OpenTelemetry's metric API (WithMeterProvider). The hot
// paths (each change streamed or applied) only add to the atomics of
// connStats; the meter reads them when it collects, so a Conn without a
// provider, or one whose exporter collects every minute, pays for an
// atomic add per change and nothing more.

// meterName is the instrumentation scope of siphon's instruments.
const meterName = "github.com/siphondb/siphon"

// connStats is what a Conn's calls did, for its metrics.
type connStats struct {
	streamChanges, streamTransactions atomic.Int64
	streamSessions                    atomic.Int64
	applyChanges, applyTransactions   atomic.Int64
	// streaming: a stream reads the slot now; serverEnd is the server's
	// WAL end as its last keepalive said, acked the position it
	// acknowledged.
	streaming         atomic.Bool
	serverEnd, acked  atomic.Uint64
	lastCommit        atomic.Int64 // the source commit time of the last transaction streamed, Unix nanoseconds
	lastReceived      atomic.Int64 // when the stream last received a transaction, Unix nanoseconds
	replicaReceived   atomic.Uint64
	replicaApplied    atomic.Uint64
	replicaRunning    atomic.Bool
	replicaLastCommit atomic.Int64 // the source commit time of the last transaction applied, Unix nanoseconds
}

// lagIdle is how long a stream receives no transaction before its lag in
// time reads 0: a stream behind the source receives them back to back.
const lagIdle = time.Second

// streamLag returns how far the stream is behind the server, in bytes of
// WAL and in time since the source committed the last transaction it
// delivered: 0 and 0 when no stream runs, and no time lag once no
// transaction arrived for lagIdle (all the source sent was delivered).
func (s *connStats) streamLag(now time.Time) (bytes int64, seconds float64) {
	if !s.streaming.Load() {
		return 0, 0
	}
	end, acked := s.serverEnd.Load(), s.acked.Load()
	if end > acked {
		bytes = int64(end - acked)
	}
	idle := now.Sub(time.Unix(0, s.lastReceived.Load())) > lagIdle
	if commit := s.lastCommit.Load(); commit != 0 && !idle {
		seconds = max(0, now.Sub(time.Unix(0, commit)).Seconds())
	}
	return bytes, seconds
}

// replicaLag returns how far Replicate's target is behind what it
// received: bytes of the source's WAL, and the time since the source
// committed the last transaction the target applied, while the target
// has not applied all it received.
func (s *connStats) replicaLag(now time.Time) (bytes int64, seconds float64) {
	received, applied := s.replicaReceived.Load(), s.replicaApplied.Load()
	if !s.replicaRunning.Load() || received <= applied {
		return 0, 0
	}
	if commit := s.replicaLastCommit.Load(); commit != 0 {
		seconds = max(0, now.Sub(time.Unix(0, commit)).Seconds())
	}
	return int64(received - applied), seconds
}

// meters are a Conn's instruments.
type meters struct {
	applyDuration metric.Float64Histogram
	errors        metric.Int64Counter
	registration  metric.Registration
	database      attribute.KeyValue // db.namespace: the Conn's database
}

// newMeters makes c's instruments on mp and registers the callback that
// observes c's stats. A nil mp is OpenTelemetry's no-op provider.
func newMeters(c *Conn, mp metric.MeterProvider) (*meters, error) {
	if mp == nil {
		mp = noop.NewMeterProvider()
	}
	m := mp.Meter(meterName)
	var err error
	gauge := func(name, unit, desc string) metric.Int64ObservableGauge {
		g, e := m.Int64ObservableGauge(name, metric.WithUnit(unit), metric.WithDescription(desc))
		err = errors.Join(err, e)
		return g
	}
	seconds := func(name, desc string) metric.Float64ObservableGauge {
		g, e := m.Float64ObservableGauge(name, metric.WithUnit("s"), metric.WithDescription(desc))
		err = errors.Join(err, e)
		return g
	}
	counter := func(name, unit, desc string) metric.Int64ObservableCounter {
		o, e := m.Int64ObservableCounter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		err = errors.Join(err, e)
		return o
	}
	streamChanges := counter("siphon.stream.changes", "{change}", "Row changes and schema changes the change stream delivered.")
	streamTx := counter("siphon.stream.transactions", "{transaction}", "Transactions the change stream delivered.")
	sessions := counter("siphon.stream.sessions", "{session}", "Replication sessions started: more than one per running stream means it reconnected.")
	streamLag := gauge("siphon.stream.lag", "By", "WAL between the server's end and the position the stream acknowledged, while a stream runs.")
	streamLagTime := seconds("siphon.stream.lag.time", "Time since the source committed the last transaction the stream delivered, while transactions arrive; 0 after a second without one.")
	retained := gauge("siphon.slot.retained_wal", "By", "WAL the server keeps for a slot of siphon's: from its restart position to the server's end.")
	applyChanges := counter("siphon.apply.changes", "{change}", "Row changes and schema changes applied to the target.")
	applyTx := counter("siphon.apply.transactions", "{transaction}", "Source transactions applied to the target.")
	applyLag := gauge("siphon.apply.lag", "By", "WAL of the source between what Replicate received and what the target applied.")
	applyLagTime := seconds("siphon.apply.lag.time", "Time since the source committed the last transaction Replicate applied, while the target has not applied all it received.")
	out := &meters{}
	var e error
	out.applyDuration, e = m.Float64Histogram("siphon.apply.duration", metric.WithUnit("s"),
		metric.WithDescription("Time to apply one target transaction (one or more source transactions), from its first statement to its commit."))
	err = errors.Join(err, e)
	out.errors, e = m.Int64Counter("siphon.errors", metric.WithUnit("{error}"),
		metric.WithDescription("Errors siphon's calls returned, by error.type."))
	err = errors.Join(err, e)
	if err != nil {
		return nil, err
	}
	database := attribute.String("db.namespace", c.config.Database)
	slot := metric.WithAttributes(database, attribute.String("siphon.slot", c.opts.slot))
	db := metric.WithAttributes(database)
	out.database = database
	s := &c.stats
	out.registration, err = m.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		now := time.Now()
		o.ObserveInt64(streamChanges, s.streamChanges.Load(), slot)
		o.ObserveInt64(streamTx, s.streamTransactions.Load(), slot)
		o.ObserveInt64(sessions, s.streamSessions.Load(), slot)
		lagBytes, lagSeconds := s.streamLag(now)
		o.ObserveInt64(streamLag, lagBytes, slot)
		o.ObserveFloat64(streamLagTime, lagSeconds, slot)
		o.ObserveInt64(applyChanges, s.applyChanges.Load(), db)
		o.ObserveInt64(applyTx, s.applyTransactions.Load(), db)
		lagBytes, lagSeconds = s.replicaLag(now)
		o.ObserveInt64(applyLag, lagBytes, slot)
		o.ObserveFloat64(applyLagTime, lagSeconds, slot)
		if s.streamSessions.Load() > 0 || c.opts.source {
			c.observeRetainedWAL(ctx, o, retained, database)
		}
		return nil
	}, streamChanges, streamTx, sessions, streamLag, streamLagTime, retained, applyChanges, applyTx, applyLag, applyLagTime)
	if err != nil {
		return nil, err
	}
	return out, nil
}

// observeRetainedWAL observes the WAL the server keeps for the Conn's slot
// and siphon's base slots. It asks the server, bounded by a short timeout:
// a collection must not hang on an unreachable server.
func (c *Conn) observeRetainedWAL(ctx context.Context, o metric.Observer, g metric.Int64ObservableGauge, database attribute.KeyValue) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	rows, err := c.pool.Query(ctx, `SELECT slot_name::text, coalesce(pg_catalog.pg_wal_lsn_diff(
		  CASE WHEN pg_catalog.pg_is_in_recovery() THEN pg_catalog.pg_last_wal_receive_lsn() ELSE pg_catalog.pg_current_wal_insert_lsn() END, restart_lsn), 0)::int8
		FROM pg_replication_slots WHERE slot_name = $1 OR slot_name ~ $2`, c.opts.slot, anyBaseSlotPattern.String())
	if err != nil {
		return
	}
	defer rows.Close()
	for rows.Next() {
		var name string
		var bytes int64
		if rows.Scan(&name, &bytes) == nil {
			o.ObserveInt64(g, bytes, metric.WithAttributes(database, attribute.String("siphon.slot", name)))
		}
	}
}

// recordApplied counts a target transaction that applied txs source
// transactions and changes changes, begun at began.
func (c *Conn) recordApplied(ctx context.Context, txs, changes int, began time.Time) {
	c.stats.applyTransactions.Add(int64(txs))
	c.stats.applyChanges.Add(int64(changes))
	if c.meters != nil {
		c.meters.applyDuration.Record(context.WithoutCancel(ctx), time.Since(began).Seconds(), metric.WithAttributes(c.meters.database))
	}
}

// close unregisters the callback: a closed Conn observes nothing.
func (m *meters) close() {
	if m != nil && m.registration != nil {
		m.registration.Unregister()
	}
}

// countError counts err, unless it is nil or the normal stop of a
// cancelled ctx, under its error.type.
func (c *Conn) countError(ctx context.Context, err error) {
	if err == nil || c.meters == nil {
		return
	}
	c.meters.errors.Add(context.WithoutCancel(ctx), 1, metric.WithAttributes(c.meters.database, attribute.String("error.type", errorType(err))))
}

// errorType names the kind of err for the siphon.errors counter: one of a
// small, fixed set, so that the metric's cardinality stays bounded.
func errorType(err error) string {
	var (
		interrupted *StreamInterruptedError
		gap         *ResumeGapError
		applyGap    *ApplyGapError
		schema      *SchemaChangeError
		untrusted   *UntrustedSchemaChangeError
		incompat    *SchemaIncompatibleError
		blocked     *SlotBlockedError
		option      *OptionError
		preflight   *PreflightError
		chain       *ChainError
	)
	switch {
	case errors.As(err, &interrupted), isInterruption(err):
		return "interrupted"
	case errors.As(err, &gap):
		return "resume_gap"
	case errors.As(err, &applyGap):
		return "apply_gap"
	case errors.As(err, &untrusted), errors.Is(err, ErrUnauthenticatedSchemaChange):
		return "untrusted_schema_change"
	case errors.As(err, &schema), errors.As(err, &incompat):
		return "schema_change"
	case errors.Is(err, ErrSlotInUse), errors.As(err, &blocked), errors.Is(err, ErrApplyInProgress), errors.Is(err, ErrAlreadyStreaming):
		return "busy"
	case errors.Is(err, canonical.ErrChecksum), errors.Is(err, canonical.ErrAuthentication), errors.As(err, &chain):
		return "integrity"
	case errors.As(err, &option), errors.As(err, &preflight), errors.Is(err, ErrNilArgument):
		return "usage"
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return "deadline"
	case pgerr.Code(err) != "":
		return "server"
	}
	return "other"
}
