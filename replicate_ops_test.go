package siphon_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/siphondb/siphon"
	"github.com/siphondb/siphon/canonical"
)

// Operating a live migration: its progress while the snapshot copies and
// while the target falls behind, its cutover, its metrics.

// progressLog keeps Replicate's reports.
type progressLog struct {
	mu      sync.Mutex
	reports []siphon.ReplicateProgress
}

func (l *progressLog) add(p siphon.ReplicateProgress) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.reports = append(l.reports, p)
}

// find returns the last report that satisfies ok.
func (l *progressLog) find(ok func(siphon.ReplicateProgress) bool) (siphon.ReplicateProgress, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i := len(l.reports) - 1; i >= 0; i-- {
		if ok(l.reports[i]) {
			return l.reports[i], true
		}
	}
	return siphon.ReplicateProgress{}, false
}

// lockTable holds a SHARE lock on table in a transaction of a session of
// its own until the returned function is called: whatever the target
// writes to it waits. (Not ACCESS EXCLUSIVE, which takes a transaction ID
// to be logged for standbys, and a transaction ID that stays open makes
// the source's slot creation wait: the test shares one server.)
func lockTable(t *testing.T, dsn, table string) (release func()) {
	t.Helper()
	conn := connectOrFail(t, dsn)
	execSQL(t, conn, "BEGIN", "LOCK TABLE "+table+" IN SHARE MODE")
	var once sync.Once
	release = func() { once.Do(func() { execSQL(t, conn, "COMMIT") }) }
	t.Cleanup(release)
	return release
}

// TestLiveMigrationCutover migrates the shop (foreign keys, partitions, a
// keyless audit table, identity columns, triggers) while it is written
// to: Replicate with an initial snapshot reports the copy while it runs
// (held back by a lock on the target, so that reports come), then lag in
// time and bytes while the target is held back again, and nothing once it
// caught up; a deploy adds a column, an index and large values; the
// application stops writing, and Cutover replicates the rest, sets the
// sequences and finds every table equal, by count and by content. A write on the target afterwards shows as a difference.
func TestLiveMigrationCutover(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	src, c, slot := realShopSource(t)
	systemID := systemIdentifier(t, src)
	dstDSN, dst := realShopTarget(t)
	target := connect(t, dstDSN)
	forgetAppliedPosition(t, dstDSN, systemID, slot)

	require.NoError(t, c.InstallSchemaCapture(ctx)) // the deploy below adds a column with a default
	var log progressLog
	hold := lockTable(t, dstDSN, "customers")
	run := startReplicate(t, c, target, siphon.ReplicateOptions{Snapshot: true, ProgressInterval: 20 * time.Millisecond, Progress: log.add})
	waitLocked(t, dst, "the apply", "customers")
	waitFor(t, "a report of the copy", func() bool {
		_, ok := log.find(func(p siphon.ReplicateProgress) bool {
			return p.Phase == siphon.ReplicateCopying && p.Snapshot.Tables > 0 && p.Snapshot.EstimatedBytes > 0
		})
		return ok
	})
	hold()
	waitApplied(t, target, systemID, slot, 1, run)
	var copied siphon.ReplicateProgress
	waitFor(t, "a report of the stream", func() bool {
		var ok bool
		copied, ok = log.find(func(p siphon.ReplicateProgress) bool { return p.Phase == siphon.ReplicateStreaming })
		return ok
	})
	assert.Equal(t, copied.Snapshot.Tables, copied.Snapshot.TablesDone, "the snapshot's report stays with the stream's: %+v", copied.Snapshot)
	assert.Positive(t, copied.Snapshot.Rows)

	// Held back while the source writes: lag in time and bytes.
	hold = lockTable(t, dstDSN, "customers")
	realShopRound(t, src, 2)
	waitLocked(t, dst, "the apply", "customers")
	behind := time.Now()
	waitFor(t, "a report of the lag", func() bool {
		_, ok := log.find(func(p siphon.ReplicateProgress) bool {
			return p.Lag > 0 && p.LagBytes > 0 && p.RetainedWAL > 0 && p.Received > p.Applied
		})
		return ok
	})
	hold()
	waitApplied(t, target, systemID, slot, sourceMark(t, src), run)
	waitFor(t, "a report of no lag", func() bool {
		_, ok := log.find(func(p siphon.ReplicateProgress) bool {
			return p.Lag == 0 && p.LagBytes == 0 && p.LastCommit.After(behind.Add(-time.Minute))
		})
		return ok
	})

	// A deploy while Replicate runs: a column with a default, an index, and
	// large values (stored out of line, then left unchanged by updates).
	execSQL(t, src, `ALTER TABLE customers ADD COLUMN tier text NOT NULL DEFAULT 'basic'`,
		`CREATE INDEX orders_by_status ON orders (status)`,
		`ALTER TABLE products ADD COLUMN manual text`,
		`UPDATE products SET manual = (SELECT string_agg(md5(products.id::text || g::text), '') FROM generate_series(1, 300) g) WHERE id % 3 = 0`,
		`UPDATE products SET price = price + 2 WHERE id % 3 = 0`,
		`UPDATE customers SET tier = 'gold' WHERE id % 5 = 0`)
	realShopRound(t, src, 3) // the last writes, then the application stops
	_, err := run.stop()
	require.NoError(t, err)
	rep, err := c.Cutover(ctx, target, siphon.CutoverOptions{Contents: true})
	require.NoError(t, err)
	assert.True(t, rep.OK, "%v", rep.Problems)
	assert.LessOrEqual(t, rep.Applied, rep.Position)
	assert.Len(t, rep.Tables, len(userTables(t, src)))
	for _, tc := range rep.Tables {
		assert.True(t, tc.Match, "%+v", tc)
		assert.NotEmpty(t, tc.SourceSum)
	}
	assertSameAsSource(t, src, dst, "after the cutover")
	for _, seq := range []string{"customers_id_seq", "products_id_seq"} {
		var srcLast, dstLast int64
		require.NoError(t, src.QueryRow(ctx, "SELECT last_value FROM "+seq).Scan(&srcLast))
		require.NoError(t, dst.QueryRow(ctx, "SELECT last_value FROM "+seq).Scan(&dstLast))
		assert.GreaterOrEqual(t, dstLast, srcLast, "%s: the target's next value is past every one the source used", seq)
	}

	// The target is written to: the next cutover's check shows it.
	execSQL(t, dst, "DELETE FROM products WHERE id = (SELECT min(id) FROM products)")
	rep, err = c.Cutover(ctx, target, siphon.CutoverOptions{})
	require.NoError(t, err)
	assert.False(t, rep.OK)
	require.Len(t, rep.Problems, 1)
	assert.Contains(t, rep.Problems[0], "products")
	require.NoError(t, c.Detach(ctx))
}

// TestReplicateStopAt stops by itself at a Position on an idle source, and
// at once when the target holds it already; Cutover refuses while another
// Replicate of the Conn runs, saying how to go on.
func TestReplicateStopAt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srcDSN, src := newDatabase(t)
	execSQL(t, src, "CREATE TABLE t (id int PRIMARY KEY)")
	dstDSN, dst := newDatabase(t)
	execSQL(t, dst, "CREATE TABLE t (id int PRIMARY KEY)")
	c, slot, _ := streamConnAt(t, srcDSN)
	target := connect(t, dstDSN)
	forgetAppliedPosition(t, dstDSN, systemIdentifier(t, src), slot)
	execSQL(t, src, "INSERT INTO t VALUES (1)")
	stop := insertPosition(t, src)
	pos, err := c.Replicate(ctx, target, siphon.ReplicateOptions{StopAt: stop})
	require.NoError(t, err, "an idle source: the stream's keepalive passes the stop position")
	assert.Positive(t, pos)
	assert.Equal(t, 1, count(t, dst, "SELECT count(*) FROM t"))
	again, err := c.Replicate(ctx, target, siphon.ReplicateOptions{StopAt: stop})
	require.NoError(t, err)
	assert.Equal(t, pos, again, "the target holds it already")

	run := startReplicate(t, c, target, siphon.ReplicateOptions{})
	waitFor(t, "Replicate takes the slot", func() bool { return slotActive(t, srcDSN, slot) })
	_, err = c.Cutover(ctx, target, siphon.CutoverOptions{})
	require.ErrorIs(t, err, siphon.ErrAlreadyStreaming)
	assert.Contains(t, err.Error(), "stop the running Replicate")
	_, err = run.stop()
	require.NoError(t, err)
	require.NoError(t, target.WaitApplied(ctx, pos))
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, target.WaitApplied(short, pos+0x1000000), context.DeadlineExceeded, "a Position never applied")
}

// collected reads every metric of reader, by name.
func collected(t *testing.T, reader *sdkmetric.ManualReader) map[string]metricdata.Aggregation {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	out := map[string]metricdata.Aggregation{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			out[m.Name] = m.Data
		}
	}
	return out
}

// int64Value returns the value of a sum or gauge's data point that
// carries attr (any point when attr is empty).
func int64Value(t *testing.T, data metricdata.Aggregation, attr ...attribute.KeyValue) int64 {
	t.Helper()
	var points []metricdata.DataPoint[int64]
	switch d := data.(type) {
	case metricdata.Sum[int64]:
		points = d.DataPoints
	case metricdata.Gauge[int64]:
		points = d.DataPoints
	default:
		t.Fatalf("not an int64 sum or gauge: %T", data)
	}
	want := attribute.NewSet(attr...)
	for _, p := range points {
		if len(attr) == 0 || p.Attributes.Equals(&want) {
			return p.Value
		}
	}
	t.Fatalf("no data point with %v in %+v", attr, points)
	return 0
}

// TestMetrics reads a source's and a target's metrics with the SDK's
// manual reader: what a stream and an apply did, the slot's retained WAL,
// the duration of apply transactions, and the errors by type; a Conn
// without a provider costs nothing and fails nothing.
func TestMetrics(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srcDSN, src := newDatabase(t)
	execSQL(t, src, "CREATE TABLE t (id int PRIMARY KEY, v text)")
	dstDSN, dst := newDatabase(t)
	execSQL(t, dst, "CREATE TABLE t (id int PRIMARY KEY, v text)")
	reader := sdkmetric.NewManualReader()
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { provider.Shutdown(ctx) })
	metered := siphon.WithMeterProvider(provider)
	streamer, slot, start := streamConnAt(t, srcDSN, metered)
	replicator, replicaSlot, _ := streamConnAt(t, srcDSN, metered)
	target := connect(t, dstDSN, metered)
	forgetAppliedPosition(t, dstDSN, systemIdentifier(t, src), replicaSlot)

	execSQL(t, src, "INSERT INTO t SELECT g, 'v' FROM generate_series(1, 10) g", "UPDATE t SET v = 'w' WHERE id <= 3", "DELETE FROM t WHERE id = 10")
	emitMarker(t, src, "end")
	_, end := streamUntil(t, streamer, start, "end")
	m := collected(t, reader)
	source := attribute.String("db.namespace", dbName(t, src))
	onSlot := []attribute.KeyValue{source, attribute.String("siphon.slot", slot)}
	assert.EqualValues(t, 14, int64Value(t, m["siphon.stream.changes"], onSlot...), "10 inserts, 3 updates, a delete")
	assert.EqualValues(t, 3, int64Value(t, m["siphon.stream.transactions"], onSlot...))
	assert.EqualValues(t, 1, int64Value(t, m["siphon.stream.sessions"], onSlot...))
	assert.GreaterOrEqual(t, int64Value(t, m["siphon.slot.retained_wal"], onSlot...), int64(0))
	assert.Zero(t, int64Value(t, m["siphon.stream.lag"], onSlot...), "no stream runs")

	pos, err := replicator.Replicate(ctx, target, siphon.ReplicateOptions{StopAt: end})
	require.NoError(t, err)
	assert.Positive(t, pos)
	assert.Equal(t, 9, count(t, dst, "SELECT count(*) FROM t"))
	m = collected(t, reader)
	applied := attribute.String("db.namespace", dbName(t, dst))
	assert.EqualValues(t, 14, int64Value(t, m["siphon.apply.changes"], applied))
	assert.EqualValues(t, 3, int64Value(t, m["siphon.apply.transactions"], applied))
	assert.EqualValues(t, 14, int64Value(t, m["siphon.stream.changes"], source, attribute.String("siphon.slot", replicaSlot)), "Replicate's stream")
	hist, ok := m["siphon.apply.duration"].(metricdata.Histogram[float64])
	require.True(t, ok)
	require.NotEmpty(t, hist.DataPoints)
	assert.Positive(t, hist.DataPoints[0].Count)

	_, err = streamer.StreamChanges(ctx, start, func(canonical.Change) error { return nil })
	var gap *siphon.ResumeGapError
	require.ErrorAs(t, err, &gap)
	m = collected(t, reader)
	assert.EqualValues(t, 1, int64Value(t, m["siphon.errors"], source, attribute.String("error.type", "resume_gap")))

	plain := connect(t, dstDSN)
	require.NoError(t, plain.ApplyChange(ctx, canonical.Change{Op: canonical.OpBegin}), "no provider, no metrics, no failure")
	require.NoError(t, streamer.DropSlot(ctx, slot))
	require.NoError(t, replicator.DropSlot(ctx, replicaSlot))
}
