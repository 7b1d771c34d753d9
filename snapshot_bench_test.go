package siphon_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/siphondb/siphon"
	"github.com/siphondb/siphon/canonical"
	"github.com/siphondb/siphon/siphontest"
)

// BenchmarkSnapshotCopy copies one table of SIPHON_BENCH_ROWS rows
// (default 20000) with psql -c "COPY t TO STDOUT (FORMAT binary)" (the
// reference), with Snapshot.CopyTables to a no-op RowFunc (plain, and
// resumable with checkpoints) and with EmitCanonical to io.Discard, with 1,
// 2 and 4 sessions, in one run.
// Each sub-benchmark after the reference reports its speed as a multiple
// of the reference's (x-psql; above 1 is faster).
//
//	SIPHON_BENCH_ROWS=1000000 go test -run '^$' -bench BenchmarkSnapshotCopy -benchtime 3x
func BenchmarkSnapshotCopy(b *testing.B) {
	rows := 20000
	if s := os.Getenv("SIPHON_BENCH_ROWS"); s != "" {
		n, err := strconv.Atoi(s)
		require.NoError(b, err, "SIPHON_BENCH_ROWS")
		rows = n
	}
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
	var copyBytes int64 // the binary COPY stream's size, the same data for every contender
	var reference time.Duration
	report := func(b *testing.B, start time.Time) {
		perOp := time.Since(start) / time.Duration(b.N)
		b.ReportMetric(float64(rows)/perOp.Seconds(), "rows/s")
		if reference > 0 {
			b.ReportMetric(reference.Seconds()/perOp.Seconds(), "x-psql")
		}
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
	copyBytes = int64(counted)
	devNull, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	require.NoError(b, err)
	defer devNull.Close()

	b.Run("psql", func(b *testing.B) {
		b.SetBytes(copyBytes)
		start := time.Now()
		for b.Loop() {
			runPsql(devNull)
		}
		report(b, start)
		reference = time.Since(start) / time.Duration(b.N)
	})

	schema := &canonical.Schema{}
	for _, sessions := range []int{1, 2, 4} {
		c, err := siphon.Connect(ctx, dsn, siphon.WithSlot(snapSlotName(b)), siphon.WithCopySessions(sessions))
		require.NoError(b, err)
		if len(schema.Tables) == 0 {
			schema, err = c.InspectSchema(ctx)
			require.NoError(b, err)
		}
		b.Run(fmt.Sprintf("noop/sessions=%d", sessions), func(b *testing.B) {
			snap, err := c.TakeSnapshot(ctx)
			require.NoError(b, err)
			defer snap.Close(ctx)
			b.SetBytes(copyBytes)
			start := time.Now()
			for b.Loop() {
				n := 0
				require.NoError(b, snap.CopyTables(ctx, schema, func(*canonical.Table, canonical.Row) error {
					n++
					return nil
				}))
				require.Equal(b, rows, n)
			}
			report(b, start)
		})
		b.Run(fmt.Sprintf("checkpoints/sessions=%d", sessions), func(b *testing.B) {
			// Resumable: every row carries its ctid, checkpoints once a second.
			snap, err := c.TakeSnapshot(ctx)
			require.NoError(b, err)
			defer snap.Close(ctx)
			b.SetBytes(copyBytes)
			start := time.Now()
			for b.Loop() {
				require.NoError(b, snap.CopyTables(ctx, schema, func(*canonical.Table, canonical.Row) error { return nil },
					siphon.CopyCheckpoints(time.Second, func(*siphon.CopyCheckpoint) error { return nil })))
			}
			report(b, start)
		})
		b.Run(fmt.Sprintf("jsonl/sessions=%d", sessions), func(b *testing.B) {
			b.SetBytes(copyBytes)
			start := time.Now()
			for b.Loop() {
				_, err := c.EmitCanonical(ctx, schema, io.Discard)
				require.NoError(b, err)
			}
			report(b, start)
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
