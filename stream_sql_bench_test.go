package siphon_test

import (
	"sort"
	"testing"
	"time"

	"github.com/siphondb/siphon"
)

// BenchmarkCatchUp measures the SQL catch-up of a backlog (the standard
// stream workload behind the slot) side by side, in one run, each on its
// own copy of the slot so that each decodes the same WAL: StreamChanges
// to a no-op emit (values decoded) with the catch-up ("catch_up"), the
// same through the walsender alone ("walsender"), and the server's own
// decode rate (count(*) over pg_logical_slot_peek_binary_changes,
// "server_decode"). "ratio" runs the three on each iteration, in rotating
// order, and reports the median and lowest of the catch-up's speed over
// the server's decode (x_server_decode, goal at least 0.8) and over the
// walsender's (x_walsender).
func BenchmarkCatchUp(b *testing.B) { benchCatchUp(b, standardWorkload(b)) }

// BenchmarkCatchUpHugeTransaction is BenchmarkCatchUp on one transaction
// of SIPHON_BENCH_HUGE_ROWS inserts (default 200000): the catch-up must be
// no slower than the walsender (x_walsender at least 1.0).
func BenchmarkCatchUpHugeTransaction(b *testing.B) { benchCatchUp(b, hugeTransaction(b)) }

func benchCatchUp(b *testing.B, work benchWorkload) {
	src := newBenchSource(b, work)
	changes := float64(src.work.changes())
	// Every backlog is caught up through the SQL interface, however
	// small (the default threshold is 4 MiB of WAL); the rest as by
	// default.
	catchUp := func(b *testing.B, slot string) streamRun {
		return src.siphonTuned(b, slot, func(c *siphon.Conn) {
			c.SetCatchUpForTest(siphon.CatchUpForTest{RedecodeRatio: siphon.CatchUpRedecodeRatioForTest})
		})
	}
	walsender := func(b *testing.B, slot string) streamRun {
		return src.siphonTuned(b, slot, func(c *siphon.Conn) { c.NoCatchUpForTest() })
	}
	sides := []struct {
		name string
		run  func(b *testing.B, slot string) streamRun
	}{{"catch_up", catchUp}, {"walsender", walsender}, {"server_decode", src.serverDecode}}
	for _, side := range sides {
		b.Run(side.name, func(b *testing.B) {
			var total streamRun
			for b.Loop() {
				b.StopTimer()
				slot := src.copySlot(b)
				b.StartTimer()
				r := side.run(b, slot)
				total.took += r.took
				total.server = total.server.plus(r.server)
				total.client = total.client.plus(r.client)
				total.serverKnown = r.serverKnown
			}
			reportRun(b, total, changes*float64(b.N))
		})
	}
	b.Run("ratio", func(b *testing.B) {
		var overDecode, overWalsender []float64
		for i := 0; b.Loop(); i++ {
			var took [3]time.Duration
			for k := range sides {
				j := (i + k) % len(sides)
				b.StopTimer()
				slot := src.copySlot(b)
				b.StartTimer()
				took[j] = sides[j].run(b, slot).took
			}
			b.Logf("iteration %d: catch-up %v, walsender %v, server decode %v", i, took[0], took[1], took[2])
			overDecode = append(overDecode, took[2].Seconds()/took[0].Seconds())
			overWalsender = append(overWalsender, took[1].Seconds()/took[0].Seconds())
		}
		for _, r := range []struct {
			unit   string
			ratios []float64
		}{{"x_server_decode", overDecode}, {"x_walsender", overWalsender}} {
			sort.Float64s(r.ratios)
			b.ReportMetric(r.ratios[len(r.ratios)/2], r.unit+"(median)")
			b.ReportMetric(r.ratios[0], r.unit+"(min)")
		}
		b.ReportMetric(0, "ns/op")
	})
}

// reportRun reports a side's changes/s and, where this machine shows
// them, the CPU shares of the server's backends and of the client (see
// benchStream).
func reportRun(b *testing.B, total streamRun, n float64) {
	b.ReportMetric(n/total.took.Seconds(), "changes/s")
	share := func(d time.Duration) float64 { return 100 * d.Seconds() / total.took.Seconds() }
	if total.serverKnown {
		b.ReportMetric(share(total.server.cpu), "server_cpu_pct")
		b.ReportMetric(share(total.server.wait), "server_runq_pct")
		b.ReportMetric(1e6*total.server.cpu.Seconds()/n, "server_cpu_us/change")
	}
	if total.client.cpu > 0 {
		b.ReportMetric(share(total.client.cpu), "client_cpu_pct")
		b.ReportMetric(1e6*total.client.cpu.Seconds()/n, "client_cpu_us/change")
	}
	b.ReportMetric(0, "ns/op")
}
