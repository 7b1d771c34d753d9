package natsjs_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/siphondb/siphon"
	"github.com/siphondb/siphon/canonical"
	"github.com/siphondb/siphon/natsjs"
)

// benchSource is a database whose slot holds a workload of inserts:
// txns transactions of size rows each, into a table of four columns.
type benchSource struct {
	dsn     string
	admin   *pgx.Conn
	slot    string
	txns    int
	changes int
	end     canonical.Position // the last transaction's end
	copies  int
}

// newBenchSource creates the table, then the slot, then runs the workload,
// and reads the slot once (on a copy) to find where it ends.
func newBenchSource(b *testing.B, txns, size int) *benchSource {
	b.Helper()
	slot := testSlot(b)
	dsn, admin, _ := newSource(b, []string{
		`CREATE TABLE bench (id int8 PRIMARY KEY, name text NOT NULL, qty int4 NOT NULL, at timestamptz NOT NULL)`,
	}, slot)
	for t := range txns {
		execSQL(b, admin, fmt.Sprintf(`INSERT INTO bench SELECT g, 'item ' || g, g %% 1000, '2026-12-01'::timestamptz + g * interval '1 second'
			FROM generate_series(%d, %d) g`, t*size+1, (t+1)*size))
	}
	src := &benchSource{dsn: dsn, admin: admin, slot: slot, txns: txns, changes: txns * size}
	var err error
	if _, src.end, err = src.noop(src.copySlot(b), 0); err != nil {
		b.Fatal(err)
	}
	return src
}

// copySlot makes a copy of the source slot, which starts where it does;
// it is dropped when the benchmark ends.
func (s *benchSource) copySlot(b *testing.B) string {
	b.Helper()
	s.copies++
	name := fmt.Sprintf("%s_copy_%d", s.slot, s.copies)
	execSQL(b, s.admin, "SELECT pg_copy_logical_replication_slot('"+s.slot+"', '"+name+"')")
	b.Cleanup(func() { s.admin.Exec(context.Background(), "SELECT pg_drop_replication_slot($1)", name) })
	return name
}

// noop streams slot to a no-op emit until the transaction ending at end
// (until the last insert when end is zero), and returns how long it took
// from the call to that transaction's commit.
func (s *benchSource) noop(slot string, end canonical.Position) (time.Duration, canonical.Position, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	c, err := siphon.Connect(ctx, s.dsn, siphon.WithSlot(slot))
	if err != nil {
		return 0, 0, err
	}
	defer c.Close()
	inserts := 0
	var took time.Duration
	began := time.Now()
	last, err := c.StreamChanges(ctx, 0, func(ch canonical.Change) error {
		switch {
		case ch.Op == canonical.OpInsert:
			inserts++
		case ch.Op == canonical.OpCommit && (ch.Position == end || end == 0 && inserts == s.changes):
			took = time.Since(began) // not the end of the session that follows
			cancel()
		}
		return nil
	})
	if err == nil && inserts != s.changes {
		err = fmt.Errorf("streamed %d inserts, want %d", inserts, s.changes)
	}
	return took, last, err
}

// publish publishes slot into a new stream on nc, with maxChanges changes
// a message at most, until it holds the transaction ending at end, and
// returns how long it took from when the Publisher began to stream (as
// noop's time starts when StreamChanges is called: neither counts the
// connections made before).
func (s *benchSource) publish(b *testing.B, nc *nats.Conn, js jetstream.JetStream, slot string, maxChanges int) time.Duration {
	b.Helper()
	ctx := context.Background()
	name := "B" + slot
	st, err := js.CreateStream(ctx, natsjs.StreamConfig(name, "b"))
	if err != nil {
		b.Fatal(err)
	}
	defer js.DeleteStream(ctx, name)
	started := startedAt{at: make(chan time.Time, 1)}
	pub, err := natsjs.NewPublisher(nc, natsjs.Config{Stream: name, Prefix: "b", Slot: slot,
		MaxChangesPerMessage: maxChanges, Logger: slog.New(started)})
	if err != nil {
		b.Fatal(err)
	}
	run := runPublisher(b, pub, s.dsn)
	deadline := time.Now().Add(10 * time.Minute)
	for heldEnd(b, st, "b") < s.end {
		if time.Now().After(deadline) {
			b.Fatal("the stream does not hold the last transaction within 10 minutes")
		}
		time.Sleep(2 * time.Millisecond) // the figure includes at most this much of polling
	}
	took := time.Since(<-started.at)
	if _, err := run.stop(); err != nil {
		b.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		b.Fatal(err)
	}
	size := s.changes / s.txns
	if want := uint64(s.txns * ((size+maxChanges-1)/maxChanges + 1)); info.State.Msgs != want {
		b.Fatalf("the stream holds %d messages, want %d (a message per %d inserts and per commit)", info.State.Msgs, want, maxChanges)
	}
	return took
}

// startedAt is a log handler that sends the time a Publisher logs that it
// begins to stream, the first time.
type startedAt struct{ at chan time.Time }

func (s startedAt) Enabled(context.Context, slog.Level) bool { return true }

func (s startedAt) Handle(_ context.Context, r slog.Record) error {
	if r.Message == "natsjs: publishing" {
		select {
		case s.at <- time.Now():
		default:
		}
	}
	return nil
}

func (s startedAt) WithAttrs([]slog.Attr) slog.Handler { return s }

func (s startedAt) WithGroup(string) slog.Handler { return s }

// benchBatch is the MaxChangesPerMessage of the batched runs.
const benchBatch = 1000

// BenchmarkPublish measures changes/s from a slot into JetStream (a
// single in-process node, file storage, on the same machine as PostgreSQL
// and the client) beside StreamChanges of the same slot to a no-op
// callback, on fresh copies of one slot: "noop", "jetstream" (a message
// per change, the default) and "batched" (MaxChangesPerMessage 1000)
// report changes/s; "ratio" runs the three on each iteration, in turns,
// and reports the median of each publisher's speed over noop's (x_noop,
// x_noop_batched). Two workloads: transactions of 100 inserts, and of one
// (where each transaction waits for JetStream's acknowledgements).
// SIPHON_BENCH_ROWS sets the inserts (default 200000, a tenth of them for
// transactions of one: a second or more a run, which the load of a shared
// machine sways less than shorter ones).
func BenchmarkPublish(b *testing.B) {
	rows := 200000
	if v := os.Getenv("SIPHON_BENCH_ROWS"); v != "" {
		var err error
		if rows, err = strconv.Atoi(v); err != nil {
			b.Fatal(err)
		}
	}
	srv := startNATS(b)
	nc, js := connectNATS(b, srv.ClientURL())
	for _, size := range []int{100, 1} {
		b.Run(fmt.Sprintf("tx%d", size), func(b *testing.B) {
			n := rows
			if size == 1 {
				n = rows / 10 // a transaction a row: fewer, or the setup takes longer than the runs
			}
			src := newBenchSource(b, n/size, size)
			noop := func(b *testing.B) time.Duration {
				b.StopTimer()
				slot := src.copySlot(b)
				b.StartTimer()
				took, _, err := src.noop(slot, src.end)
				if err != nil {
					b.Fatal(err)
				}
				return took
			}
			publish := func(maxChanges int) func(b *testing.B) time.Duration {
				return func(b *testing.B) time.Duration {
					b.StopTimer()
					slot := src.copySlot(b)
					b.StartTimer()
					return src.publish(b, nc, js, slot, maxChanges)
				}
			}
			each := func(run func(*testing.B) time.Duration) func(*testing.B) {
				return func(b *testing.B) {
					var total time.Duration
					for b.Loop() {
						total += run(b)
					}
					b.ReportMetric(float64(src.changes*b.N)/total.Seconds(), "changes/s")
					b.ReportMetric(0, "ns/op")
				}
			}
			b.Run("noop", each(noop))
			b.Run("jetstream", each(publish(1)))
			b.Run("batched", each(publish(benchBatch)))
			b.Run("ratio", func(b *testing.B) {
				runs := []func(*testing.B) time.Duration{noop, publish(1), publish(benchBatch)}
				var single, batched []float64
				for i := 0; b.Loop(); i++ {
					var took [3]time.Duration
					for k := range runs { // in turns, each first once in three
						j := (i + k) % len(runs)
						took[j] = runs[j](b)
					}
					single = append(single, took[0].Seconds()/took[1].Seconds())
					batched = append(batched, took[0].Seconds()/took[2].Seconds())
				}
				b.ReportMetric(median(single), "x_noop")
				b.ReportMetric(median(batched), "x_noop_batched")
				b.ReportMetric(0, "ns/op")
			})
		})
	}
}

// median returns the median of xs.
func median(xs []float64) float64 {
	slices.Sort(xs)
	return xs[len(xs)/2]
}
