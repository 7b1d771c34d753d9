package natsjs_test

import (
	"context"
	"fmt"
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
// (until the last insert when end is zero), and returns how long it took.
func (s *benchSource) noop(slot string, end canonical.Position) (time.Duration, canonical.Position, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	c, err := siphon.Connect(ctx, s.dsn, siphon.WithSlot(slot))
	if err != nil {
		return 0, 0, err
	}
	defer c.Close()
	inserts := 0
	began := time.Now()
	last, err := c.StreamChanges(ctx, 0, func(ch canonical.Change) error {
		switch {
		case ch.Op == canonical.OpInsert:
			inserts++
		case ch.Op == canonical.OpCommit && (ch.Position == end || end == 0 && inserts == s.changes):
			cancel()
		}
		return nil
	})
	took := time.Since(began)
	if err == nil && inserts != s.changes {
		err = fmt.Errorf("streamed %d inserts, want %d", inserts, s.changes)
	}
	return took, last, err
}

// publish publishes slot into a new stream on nc until it holds the
// transaction ending at end, and returns how long it took.
func (s *benchSource) publish(b *testing.B, nc *nats.Conn, js jetstream.JetStream, slot string) time.Duration {
	b.Helper()
	ctx := context.Background()
	name := "B" + slot
	st, err := js.CreateStream(ctx, natsjs.StreamConfig(name, "b"))
	if err != nil {
		b.Fatal(err)
	}
	defer js.DeleteStream(ctx, name)
	pub, err := natsjs.NewPublisher(nc, natsjs.Config{Stream: name, Prefix: "b", Slot: slot})
	if err != nil {
		b.Fatal(err)
	}
	began := time.Now()
	run := runPublisher(b, pub, s.dsn)
	deadline := began.Add(10 * time.Minute)
	for heldEnd(b, st, "b") < s.end {
		if time.Now().After(deadline) {
			b.Fatal("the stream does not hold the last transaction within 10 minutes")
		}
		time.Sleep(2 * time.Millisecond) // the figure includes at most this much of polling
	}
	took := time.Since(began)
	if _, err := run.stop(); err != nil {
		b.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		b.Fatal(err)
	}
	if want := uint64(s.changes + s.txns); info.State.Msgs != want {
		b.Fatalf("the stream holds %d messages, want %d (a message per insert and per commit)", info.State.Msgs, want)
	}
	return took
}

// BenchmarkPublish measures changes/s from a slot into JetStream (a
// single in-process node, file storage, on the same machine as PostgreSQL
// and the client) beside StreamChanges of the same slot to a no-op
// callback, on fresh copies of one slot: "noop" and "jetstream" report
// changes/s, "ratio" runs both on each iteration and reports the median of
// jetstream's speed over noop's (x_noop). Two workloads: transactions of
// 100 inserts, and of one (where each transaction waits for JetStream's
// acknowledgements). SIPHON_BENCH_ROWS sets the inserts (default 50000).
func BenchmarkPublish(b *testing.B) {
	rows := 50000
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
				n = rows / 5 // a transaction a row: fewer, or the setup takes longer than the runs
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
			publish := func(b *testing.B) time.Duration {
				b.StopTimer()
				slot := src.copySlot(b)
				b.StartTimer()
				return src.publish(b, nc, js, slot)
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
			b.Run("jetstream", each(publish))
			b.Run("ratio", func(b *testing.B) {
				var ratios []float64
				for i := 0; b.Loop(); i++ {
					var n, j time.Duration
					if i%2 == 0 {
						n, j = noop(b), publish(b)
					} else {
						j, n = publish(b), noop(b)
					}
					ratios = append(ratios, n.Seconds()/j.Seconds())
				}
				slices.Sort(ratios)
				b.ReportMetric(ratios[len(ratios)/2], "x_noop")
				b.ReportMetric(0, "ns/op")
			})
		})
	}
}
