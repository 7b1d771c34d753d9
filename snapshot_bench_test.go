package siphon_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/siphondb/siphon"
	"github.com/siphondb/siphon/canonical"
	"github.com/siphondb/siphon/pgdump"
	"github.com/siphondb/siphon/siphontest"
)

// BenchmarkSnapshotCopy copies the standard table (SIPHON_BENCH_ROWS rows,
// default 20000; see bench_data_test.go) with Snapshot.CopyTables to a
// no-op RowFunc (plain, and resumable with checkpoints) and with
// EmitCanonical to io.Discard, with 1, 2 and 4 sessions, and compares each with the reference, psql -c "COPY
// bench TO STDOUT (FORMAT binary)" to /dev/null. Each iteration runs the
// reference too (off the timer), right before the contender, so the ratio
// x-psql (the contender's speed as a multiple of psql's; above 1 is faster)
// holds on a machine whose load changes; client_cpu_us/row is the CPU time
// siphon's process spent per row. The psql sub-benchmark gives the
// reference's own figures. vs_pg_dump runs EmitCanonical and pg_dump -Fc -t
// bench (to /dev/null) in each iteration, alternating, and reports
// EmitCanonical's wall time over pg_dump's (x_pg_dump; the target is at
// most 1).
//
//	SIPHON_BENCH_ROWS=1000000 go test -run '^$' -bench BenchmarkSnapshotCopy -benchtime 3x
func BenchmarkSnapshotCopy(b *testing.B) {
	rows := benchRows(b)
	psql := clientProgram(b, "psql")
	ctx := context.Background()
	dsn := siphontest.Start(b).NewDatabase(b)
	admin, err := pgx.Connect(ctx, dsn)
	require.NoError(b, err)
	defer admin.Close(ctx)
	loadBenchTable(b, admin, rows)

	// psql writes to /dev/null, at its fastest; one counted run first gives
	// the stream's size (and warms the cache).
	runPsql := func(stdout io.Writer) {
		cmd := exec.Command(psql, "-X", "-q", "-d", dsn, "-c", "COPY bench TO STDOUT (FORMAT binary)")
		var stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = stdout, &stderr
		require.NoError(b, cmd.Run(), stderr.String())
	}
	var counted countingWriter
	runPsql(&counted)
	copyBytes := int64(counted) // the same data for every contender
	devNull, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	require.NoError(b, err)
	defer devNull.Close()

	// measure times run, reports rows/s and MB/s, and with reference the
	// ratio to psql runs interleaved with it.
	measure := func(b *testing.B, reference bool, run func()) {
		b.SetBytes(copyBytes)
		b.ReportAllocs()
		var ours, theirs, cpu time.Duration
		for b.Loop() {
			if reference {
				b.StopTimer()
				start := time.Now()
				runPsql(devNull)
				theirs += time.Since(start)
				b.StartTimer()
			}
			start, sched := time.Now(), selfSched()
			run()
			ours += time.Since(start)
			cpu += selfSched().minus(sched).cpu
		}
		n := float64(rows) * float64(b.N)
		b.ReportMetric(n/ours.Seconds(), "rows/s")
		if reference {
			b.ReportMetric(theirs.Seconds()/ours.Seconds(), "x-psql")
			// siphon's own CPU time (every thread of this process): what
			// the copy costs the client, whatever the machine's load.
			b.ReportMetric(1e6*cpu.Seconds()/n, "client_cpu_us/row")
		}
	}

	b.Run("psql", func(b *testing.B) {
		measure(b, false, func() { runPsql(devNull) })
	})
	var schema *canonical.Schema
	for _, sessions := range []int{1, 2, 4} {
		c, err := siphon.Connect(ctx, dsn, siphon.WithSlot(snapSlotName(b)), siphon.WithCopySessions(sessions))
		require.NoError(b, err)
		if schema == nil {
			schema, err = c.InspectSchema(ctx)
			require.NoError(b, err)
		}
		snap, err := c.TakeSnapshot(ctx)
		require.NoError(b, err)
		b.Run(fmt.Sprintf("noop/sessions=%d", sessions), func(b *testing.B) {
			measure(b, true, func() {
				n := 0
				require.NoError(b, snap.CopyTables(ctx, schema, siphon.CopyOptions{}, func(*canonical.Table, canonical.Row) error {
					n++
					return nil
				}))
				require.Equal(b, rows, n)
			})
		})
		b.Run(fmt.Sprintf("checkpoints/sessions=%d", sessions), func(b *testing.B) {
			// Resumable: every row carries its ctid, checkpoints once a second.
			measure(b, true, func() {
				opt := siphon.CopyOptions{CheckpointInterval: time.Second, Checkpoint: func(*siphon.CopyCheckpoint) error { return nil }}
				require.NoError(b, snap.CopyTables(ctx, schema, opt, func(*canonical.Table, canonical.Row) error { return nil }))
			})
		})
		require.NoError(b, snap.Close(ctx))
		b.Run(fmt.Sprintf("jsonl/sessions=%d", sessions), func(b *testing.B) {
			// EmitCanonical takes (and times) its own snapshot each time.
			measure(b, true, func() {
				_, err := c.EmitCanonical(ctx, schema, io.Discard)
				require.NoError(b, err)
			})
		})
		b.Run(fmt.Sprintf("vs_pg_dump/sessions=%d", sessions), func(b *testing.B) {
			vsPgDump(b, dsn, rows, devNull, func() {
				_, err := c.EmitCanonical(ctx, schema, io.Discard)
				require.NoError(b, err)
			})
		})
		require.NoError(b, c.Close())
	}
}

// vsPgDump runs pg_dump -Fc -t bench to /dev/null and emit once each per
// iteration, in alternating order, and reports the median and max of emit's
// wall time over pg_dump's (the target is at most 1), and each one's rows/s
// (siphon_rows/s, reference_rows/s).
func vsPgDump(b *testing.B, dsn string, rows int, devNull *os.File, emit func()) {
	ctx := context.Background()
	conn, err := pgdump.ParseDSN(dsn)
	require.NoError(b, err)
	prog, err := pgdump.Find(ctx, "pg_dump", "", pgdump.Version{})
	require.NoError(b, err)
	dump := func() time.Duration {
		cmd := pgTool(prog.Path, conn, "-Fc", "--no-password", "-t", "public.bench")
		var stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = devNull, &stderr
		start := time.Now()
		require.NoError(b, cmd.Run(), stderr.String())
		return time.Since(start)
	}
	sideBySide(b, "x_pg_dump", false, rows, func() time.Duration {
		start := time.Now()
		emit()
		return time.Since(start)
	}, dump)
}

// countingWriter counts the bytes written to it, and discards them.
type countingWriter int64

func (w *countingWriter) Write(p []byte) (int, error) {
	*w += countingWriter(len(p))
	return len(p), nil
}
