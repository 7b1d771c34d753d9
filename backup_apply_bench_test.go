package siphon_test

import (
	"bytes"
	"context"
	"testing"
	"time"
)

// BenchmarkBackupThenApply compares the backup path with a native
// subscription on the standard stream workload (see bench_data_test.go):
// BackupIncremental of a fresh copy of the slot into memory, then
// ConsumeCanonical of it into a fresh target holding the empty standard
// table, one after the other, against BenchmarkReplicate's subscription
// from another copy of the slot into another fresh target, the targets on
// a server of their own (see newReplicaBench). Each target is checked
// equal to the source afterwards.
//
// "backup_then_apply" measures it alone (changes/s, and the share of its
// time the backup took, backup_pct); "ratio" runs it and the faster of the
// subscription's text and binary configurations on each iteration, in
// alternating order, and reports the median and lowest of its speed over
// the subscription's (x_subscription, target at least 1.0).
func BenchmarkBackupThenApply(b *testing.B) {
	r := newReplicaBench(b, standardWorkload(b))
	changes := float64(r.src.work.changes())
	// One buffer for every iteration, grown before them: a new one would
	// have this process fault in and clear its pages each time, which took
	// longer here than the encoding.
	var stream bytes.Buffer
	r.backupThenApply(b, &stream)
	b.Run("backup_then_apply", func(b *testing.B) {
		var took, backup time.Duration
		for b.Loop() {
			all, part := r.backupThenApply(b, &stream)
			took, backup = took+all, backup+part
		}
		b.ReportMetric(changes*float64(b.N)/took.Seconds(), "changes/s")
		b.ReportMetric(100*backup.Seconds()/took.Seconds(), "backup_pct")
		b.ReportMetric(0, "ns/op")
	})
	b.Run("ratio", func(b *testing.B) {
		fastest := r.fastestSubscription(b)
		ours := func() time.Duration {
			took, _ := r.backupThenApply(b, &stream)
			return took
		}
		theirs := func() time.Duration {
			took := fastest.run()
			b.Logf("subscription %v", took)
			return took
		}
		sideBySide(b, "x_subscription", true, 0, ours, theirs)
		fastest.report(b)
	})
}

// backupThenApply takes an incremental backup of a fresh copy of the slot
// into stream and consumes it into a fresh target, and returns the time
// both took and the time the backup took.
func (r *replicaBench) backupThenApply(b *testing.B, stream *bytes.Buffer) (took, backup time.Duration) {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	dsn, admin, drop := r.target(b)
	defer drop()
	b.StopTimer()
	slot, src, target, closeConns := r.siphonEnds(ctx, b, dsn)
	defer closeConns()
	stream.Reset()
	b.StartTimer()

	began := time.Now()
	if _, err := src.BackupIncremental(ctx, 0, stream); err != nil {
		b.Fatalf("BackupIncremental: %v", err)
	}
	backup = time.Since(began)
	watch := watchTarget(dsn, admin)
	client0 := selfSched()
	if err := target.ConsumeCanonical(ctx, stream); err != nil {
		b.Fatalf("ConsumeCanonical: %v", err)
	}
	took = time.Since(began)
	client := selfSched().minus(client0)
	server, _ := watch()
	apply := took - backup
	share := func(d time.Duration) float64 { return 100 * d.Seconds() / apply.Seconds() }
	b.Logf("backup %v, apply %v (target backend %.0f%% of it on a CPU, %.0f%% runnable; this process %.0f%%)",
		backup, apply, share(server.cpu), share(server.wait), share(client.cpu))

	r.checkApplied(ctx, b, admin, target, slot, "BackupIncremental then ConsumeCanonical")
	return took, backup
}
