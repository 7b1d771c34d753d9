package siphon_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/siphondb/siphon"
	"github.com/siphondb/siphon/canonical"
	"github.com/siphondb/siphon/siphontest"
)

// BenchmarkSnapshotCopy copies one table of SIPHON_BENCH_ROWS rows
// (default 20000) with Snapshot.CopyTables to a no-op RowFunc (plain, and
// resumable with checkpoints) and with EmitCanonical to io.Discard, with 1,
// 2 and 4 sessions, and compares each with the reference, psql -c "COPY
// bench TO STDOUT (FORMAT binary)" to /dev/null. Each iteration runs the
// reference too (off the timer), right before the contender, so the ratio
// x-psql (the contender's speed as a multiple of psql's; above 1 is faster)
// holds on a machine whose load changes. The psql sub-benchmark gives the
// reference's own figures.
//
//	SIPHON_BENCH_ROWS=1000000 go test -run '^$' -bench BenchmarkSnapshotCopy -benchtime 3x
func BenchmarkSnapshotCopy(b *testing.B) {
	rows := envInt(b, "SIPHON_BENCH_ROWS", 20000)
	psql := findPsql(b)
	ctx := context.Background()
	dsn := siphontest.Start(b).NewDatabase(b)
	admin, err := pgx.Connect(ctx, dsn)
	require.NoError(b, err)
	defer admin.Close(ctx)
	for _, s := range []string{
		`CREATE TABLE bench (id bigint PRIMARY KEY, n int, name text, created timestamptz, amount numeric(12,2), flag bool, score float8)`,
		fmt.Sprintf(`INSERT INTO bench SELECT i, i %% 1000, 'customer ' || md5(i::text), '2024-01-01'::timestamptz + i * interval '1 second',
			(i %% 100000) / 100.0, i %% 3 = 0, i / 7.0 FROM generate_series(1, %d) i`, rows),
		`VACUUM (FREEZE, ANALYZE) bench`,
	} {
		_, err := admin.Exec(ctx, s)
		require.NoError(b, err)
	}

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
		var ours, theirs time.Duration
		for b.Loop() {
			if reference {
				b.StopTimer()
				start := time.Now()
				runPsql(devNull)
				theirs += time.Since(start)
				b.StartTimer()
			}
			start := time.Now()
			run()
			ours += time.Since(start)
		}
		b.ReportMetric(float64(rows)*float64(b.N)/ours.Seconds(), "rows/s")
		if reference {
			b.ReportMetric(theirs.Seconds()/ours.Seconds(), "x-psql")
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
				require.NoError(b, snap.CopyTables(ctx, schema, func(*canonical.Table, canonical.Row) error {
					n++
					return nil
				}))
				require.Equal(b, rows, n)
			})
		})
		b.Run(fmt.Sprintf("checkpoints/sessions=%d", sessions), func(b *testing.B) {
			// Resumable: every row carries its ctid, checkpoints once a second.
			measure(b, true, func() {
				require.NoError(b, snap.CopyTables(ctx, schema, func(*canonical.Table, canonical.Row) error { return nil },
					siphon.CopyCheckpoints(time.Second, func(*siphon.CopyCheckpoint) error { return nil })))
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
		require.NoError(b, c.Close())
	}
}

// findPsql finds psql on PATH or beside the PostgreSQL server binaries.
func findPsql(tb testing.TB) string {
	if p, err := exec.LookPath("psql"); err == nil {
		return p
	}
	found, _ := filepath.Glob("/usr/lib/postgresql/*/bin/psql")
	if len(found) == 0 {
		tb.Skip("psql not found: the benchmark compares with it")
	}
	return found[len(found)-1]
}

type countingWriter int64

func (w *countingWriter) Write(p []byte) (int, error) {
	*w += countingWriter(len(p))
	return len(p), nil
}
