package siphon_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/siphondb/siphon"
	"github.com/siphondb/siphon/canonical"
	"github.com/siphondb/siphon/siphontest"
)

// envInt reads a positive integer from the environment, or returns def.
// envInt returns the positive integer the environment variable name holds,
// or def when it is unset; another value fails the benchmark. Every
// benchmark sizes its data set through it (SIPHON_BENCH_ROWS...).
func envInt(tb testing.TB, name string, def int) int {
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	require.NoError(tb, err, name)
	require.Positive(tb, n, name)
	return n
}

// pgRecvlogical finds the pg_recvlogical binary.
func pgRecvlogical(tb testing.TB) string {
	if p, err := exec.LookPath("pg_recvlogical"); err == nil {
		return p
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin/pg_recvlogical")
	sort.Strings(dirs)
	if len(dirs) == 0 {
		tb.Skip("pg_recvlogical not found")
	}
	return dirs[len(dirs)-1]
}

// benchSource is a database with a pgoutput slot ("bench_src") in front of
// a workload, and the position of the marker message that ends it.
type benchSource struct {
	dsn    string
	admin  *pgx.Conn
	rows   int
	marker canonical.Position
	seq    int
}

// newBenchSource loads rows rows into a fresh database, in transactions of
// perTx rows, after creating the slot; the marker message comes last.
func newBenchSource(b *testing.B, rows, perTx int) *benchSource {
	b.Helper()
	ctx := context.Background()
	dsn := siphontest.Start(b).NewDatabase(b)
	admin, err := pgx.Connect(ctx, dsn)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { admin.Close(ctx) })
	mustExec(b, admin, `CREATE TABLE bench (id int8 PRIMARY KEY, name text, amount numeric(12,2), at timestamptz, flag bool)`)
	c, err := siphon.Connect(ctx, dsn, siphon.WithSlot("bench_src"))
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	if _, err := c.CurrentPosition(ctx); err != nil {
		b.Fatal(err)
	}
	mustExec(b, admin, fmt.Sprintf(`DO $$
		BEGIN
			FOR lo IN 0..%[1]d - 1 BY %[2]d LOOP
				INSERT INTO bench SELECT i, 'customer number ' || i, i * 1.25,
					'2026-01-01 00:00:00+00'::timestamptz + i * interval '1 second', i %% 2 = 0
				FROM generate_series(lo, least(lo + %[2]d, %[1]d) - 1) i;
				COMMIT;
			END LOOP;
		END $$`, rows, perTx))
	var lsn string
	if err := admin.QueryRow(ctx, "SELECT pg_logical_emit_message(false, 'bench.end', '')::text").Scan(&lsn); err != nil {
		b.Fatal(err)
	}
	marker, err := canonical.ParsePosition(lsn)
	if err != nil {
		b.Fatal(err)
	}
	return &benchSource{dsn: dsn, admin: admin, rows: rows, marker: marker}
}

func mustExec(tb testing.TB, conn *pgx.Conn, sql string) {
	tb.Helper()
	if _, err := conn.Exec(context.Background(), sql); err != nil {
		tb.Fatal(err)
	}
}

// copySlot makes a copy of the source slot (same restart and confirmed
// positions, same plugin), dropped when the benchmark ends.
func (s *benchSource) copySlot(b *testing.B) string {
	b.Helper()
	s.seq++
	name := fmt.Sprintf("bench_copy_%d", s.seq)
	mustExec(b, s.admin, "SELECT pg_copy_logical_replication_slot('bench_src', '"+name+"')")
	b.Cleanup(func() { s.admin.Exec(context.Background(), "SELECT pg_drop_replication_slot($1)", name) })
	return name
}

// siphon streams a copy of the slot to a no-op emit (values are decoded
// all the same) until the marker.
func (s *benchSource) siphon(b *testing.B, slot string) time.Duration {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	c, err := siphon.Connect(ctx, s.dsn, siphon.WithSlot(slot))
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	inserts := 0
	began := time.Now()
	_, err = c.StreamChanges(ctx, 0, func(ch canonical.Change) error {
		switch ch.Op {
		case canonical.OpInsert:
			inserts++
		case canonical.OpMessage:
			if ch.Message.Prefix == "bench.end" {
				cancel()
			}
		}
		return nil
	})
	took := time.Since(began)
	if err != nil {
		b.Fatal(err)
	}
	if inserts != s.rows {
		b.Fatalf("streamed %d inserts, want %d", inserts, s.rows)
	}
	return took
}

// recvlogical runs pg_recvlogical (pgoutput, output to /dev/null) on a copy
// of the slot until the marker.
func (s *benchSource) recvlogical(b *testing.B, slot string, binary bool) time.Duration {
	b.Helper()
	args := []string{"-d", s.dsn, "--slot", slot, "--start", "--no-loop", "-f", "/dev/null", "-F", "0",
		"-o", "proto_version=1", "-o", "publication_names=siphon", "-o", "messages=true",
		"--endpos", s.marker.String()}
	if binary {
		args = append(args, "-o", "binary=true")
	}
	cmd := exec.Command(pgRecvlogical(b), args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	began := time.Now()
	if err := cmd.Run(); err != nil {
		b.Fatalf("pg_recvlogical: %v: %s", err, stderr.String())
	}
	return time.Since(began)
}

// serverDecode has the server decode a copy of the slot by itself, with no
// client in the way: SELECT count(*) over pg_logical_slot_peek_binary_changes
// (pgoutput, the same options pg_recvlogical is given).
func (s *benchSource) serverDecode(b *testing.B, slot string) time.Duration {
	b.Helper()
	var n int
	began := time.Now()
	err := s.admin.QueryRow(context.Background(), `SELECT count(*) FROM pg_logical_slot_peek_binary_changes($1, NULL, NULL,
		'proto_version', '1', 'publication_names', 'siphon', 'messages', 'true')`, slot).Scan(&n)
	took := time.Since(began)
	if err != nil {
		b.Fatal(err)
	}
	if n < s.rows {
		b.Fatalf("server decoded %d messages, want at least %d", n, s.rows)
	}
	return took
}

// BenchmarkStreamChanges compares StreamChanges (no-op emit, every value
// decoded into canonical text) with pg_recvlogical (pgoutput, to /dev/null)
// on copies of the same slot over the same WAL, in one run; "ratio" runs
// both on each iteration and reports the median speed ratio. The
// pg_recvlogical_binary variant and "binary_gain" ask pgoutput for binary
// values, to measure what binary mode would save on the server.
// "server_decode" has the server decode a copy of the slot by itself
// (count(*) over pg_logical_slot_peek_binary_changes), and
// "server_decode_ratio" reports siphon's rows/s over that (target at least
// 0.8): how much of the server's own decode rate reaches the callback.
// SIPHON_BENCH_ROWS sets the row count (default 100000) and
// SIPHON_BENCH_TX_ROWS the rows per transaction (default 100).
func BenchmarkStreamChanges(b *testing.B) {
	rows := envInt(b, "SIPHON_BENCH_ROWS", 100_000)
	src := newBenchSource(b, rows, envInt(b, "SIPHON_BENCH_TX_ROWS", 100))
	// each runs one tool per iteration on a fresh copy of the slot and
	// reports its rows/s.
	each := func(run func(b *testing.B, slot string) time.Duration) func(b *testing.B) {
		return func(b *testing.B) {
			var total time.Duration
			for b.Loop() {
				b.StopTimer()
				slot := src.copySlot(b)
				b.StartTimer()
				total += run(b, slot)
			}
			b.ReportMetric(float64(rows)*float64(b.N)/total.Seconds(), "rows/s")
			b.ReportMetric(0, "ns/op")
		}
	}
	b.Run("siphon", each(src.siphon))
	b.Run("pg_recvlogical", each(func(b *testing.B, slot string) time.Duration { return src.recvlogical(b, slot, false) }))
	b.Run("pg_recvlogical_binary", each(func(b *testing.B, slot string) time.Duration { return src.recvlogical(b, slot, true) }))
	b.Run("server_decode", each(src.serverDecode))
	// Both on each iteration, in alternating order: the median of the
	// per-iteration ratios holds on a noisy machine.
	b.Run("ratio", func(b *testing.B) {
		pairedRatio(b, "x_pg_recvlogical", func(slot string) time.Duration { return src.recvlogical(b, slot, false) },
			func(slot string) time.Duration { return src.siphon(b, slot) }, src.copySlot)
	})
	b.Run("server_decode_ratio", func(b *testing.B) {
		pairedRatio(b, "x_server_decode", func(slot string) time.Duration { return src.serverDecode(b, slot) },
			func(slot string) time.Duration { return src.siphon(b, slot) }, src.copySlot)
	})
	// What binary mode would save the walsender: pg_recvlogical in text
	// mode over pg_recvlogical in binary mode.
	b.Run("binary_gain", func(b *testing.B) {
		pairedRatio(b, "x_text", func(slot string) time.Duration { return src.recvlogical(b, slot, false) },
			func(slot string) time.Duration { return src.recvlogical(b, slot, true) }, src.copySlot)
	})
}

// pairedRatio runs reference and contender once each per iteration, each on
// a fresh copy of the slot, in alternating order, and reports the median
// (and lowest) of reference time / contender time: above 1, the contender
// is faster.
func pairedRatio(b *testing.B, unit string, reference, contender func(slot string) time.Duration, copySlot func(*testing.B) string) {
	var ratios []float64
	for i := 0; b.Loop(); i++ {
		b.StopTimer()
		r, c := copySlot(b), copySlot(b)
		b.StartTimer()
		var ref, con time.Duration
		if i%2 == 0 {
			ref, con = reference(r), contender(c)
		} else {
			con, ref = contender(c), reference(r)
		}
		ratios = append(ratios, ref.Seconds()/con.Seconds())
	}
	sort.Float64s(ratios)
	b.ReportMetric(ratios[len(ratios)/2], unit+"(median)")
	b.ReportMetric(ratios[0], unit+"(min)")
	b.ReportMetric(0, "ns/op")
}

// BenchmarkStreamHugeTransactionRSS streams one transaction of
// SIPHON_BENCH_HUGE_ROWS rows (default 200000; the target is 2000000 in
// 64 MiB) in a child process that reports its own peak RSS (VmHWM), so
// the figure is the stream's alone.
func BenchmarkStreamHugeTransactionRSS(b *testing.B) {
	rows := envInt(b, "SIPHON_BENCH_HUGE_ROWS", 200_000)
	src := newBenchSource(b, rows, rows)
	for b.Loop() {
		b.StopTimer()
		slot := src.copySlot(b)
		b.StartTimer()
		cmd := childCmd("huge-transaction-rss", "SIPHON_RSS_CHILD_DSN="+src.dsn, "SIPHON_RSS_CHILD_SLOT="+slot,
			"SIPHON_RSS_CHILD_ROWS="+strconv.Itoa(rows))
		out, err := cmd.CombinedOutput()
		if err != nil {
			b.Fatalf("child: %v\n%s", err, out)
		}
		var hwm, took int64
		sc := bufio.NewScanner(bytes.NewReader(out))
		for sc.Scan() {
			if v, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "rss-child: "); ok {
				fmt.Sscanf(v, "vmhwm_kib=%d took_ms=%d", &hwm, &took)
			}
		}
		if hwm == 0 {
			b.Fatalf("child reported no peak RSS:\n%s", out)
		}
		b.ReportMetric(float64(hwm)/1024, "peak_RSS_MiB")
		b.ReportMetric(float64(rows)/(float64(took)/1000), "rows/s")
		b.ReportMetric(0, "ns/op")
	}
}

func init() { childModes["huge-transaction-rss"] = rssChild }

// rssChild is BenchmarkStreamHugeTransactionRSS's child process: it streams the huge transaction
// and prints its own peak RSS.
func rssChild() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	c, err := siphon.Connect(ctx, os.Getenv("SIPHON_RSS_CHILD_DSN"), siphon.WithSlot(os.Getenv("SIPHON_RSS_CHILD_SLOT")))
	if err != nil {
		return err
	}
	defer c.Close()
	want, _ := strconv.Atoi(os.Getenv("SIPHON_RSS_CHILD_ROWS"))
	inserts := 0
	began := time.Now()
	_, err = c.StreamChanges(ctx, 0, func(ch canonical.Change) error {
		switch ch.Op {
		case canonical.OpInsert:
			inserts++
		case canonical.OpMessage:
			if ch.Message.Prefix == "bench.end" {
				cancel()
			}
		}
		return nil
	})
	took := time.Since(began)
	if err != nil {
		return err
	}
	if inserts != want {
		return fmt.Errorf("streamed %d inserts, want %d", inserts, want)
	}
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return err
	}
	for line := range strings.SplitSeq(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kib, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
			fmt.Printf("rss-child: vmhwm_kib=%d took_ms=%d\n", kib, took.Milliseconds())
		}
	}
	return nil
}
