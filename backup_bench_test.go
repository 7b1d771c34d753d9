package siphon_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/siphondb/siphon"
	"github.com/siphondb/siphon/pgdump"
	"github.com/siphondb/siphon/siphontest"
)

// countingDiscard counts what it is given.
type countingDiscard struct{ n int64 }

func (c *countingDiscard) Write(p []byte) (int, error) {
	c.n += int64(len(p))
	return len(p), nil
}

// backupBench is a database loaded with rows rows, and a Conn on it.
type backupBench struct {
	c      *siphon.Conn
	conn   pgdump.Conn
	pgDump pgdump.Program
	rows   int
}

func newBackupBench(b *testing.B) *backupBench {
	b.Helper()
	rows := envInt(b, "SIPHON_BENCH_ROWS", 200_000)
	ctx := context.Background()
	dsn := siphontest.Start(b).NewDatabase(b)
	admin, err := pgx.Connect(ctx, dsn)
	if err != nil {
		b.Fatal(err)
	}
	defer admin.Close(ctx)
	for _, sql := range []string{
		`CREATE TABLE bench (id int8 PRIMARY KEY, name text, amount numeric(12,2), at timestamptz, flag bool)`,
		fmt.Sprintf(`INSERT INTO bench SELECT i, 'customer number ' || i, i * 1.25,
			'2026-01-01 00:00:00+00'::timestamptz + i * interval '1 second', i %% 2 = 0 FROM generate_series(1, %d) i`, rows),
		`VACUUM ANALYZE bench`,
	} {
		if _, err := admin.Exec(ctx, sql); err != nil {
			b.Fatal(err)
		}
	}
	c, err := siphon.Connect(ctx, dsn, siphon.WithSlot("bench_backup"), siphon.WithPublication("bench_backup"))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	conn, err := pgdump.ParseDSN(dsn)
	if err != nil {
		b.Fatal(err)
	}
	prog, err := pgdump.Find(ctx, "pg_dump", "", pgdump.Version{})
	if err != nil {
		b.Fatal(err)
	}
	bb := &backupBench{c: c, conn: conn, pgDump: prog, rows: rows}
	bb.backup(b) // the persistent slot and publication exist before timing starts, as in steady use
	return bb
}

// backup runs Backup to a counting sink and returns its wall time and size.
func (bb *backupBench) backup(b *testing.B) (time.Duration, int64) {
	var out countingDiscard
	began := time.Now()
	if err := bb.c.Backup(context.Background(), siphon.BackupOptions{}, &out); err != nil {
		b.Fatal(err)
	}
	return time.Since(began), out.n
}

// pgDumpFc runs plain pg_dump -Fc, the same binary, to a counting sink.
func (bb *backupBench) pgDumpFc(b *testing.B) (time.Duration, int64) {
	cmd := exec.Command(bb.pgDump.Path, "-Fc", "--no-password")
	cmd.Env = append(os.Environ(), "PGHOST="+bb.conn.Host, "PGPORT="+strconv.Itoa(int(bb.conn.Port)),
		"PGUSER="+bb.conn.User, "PGDATABASE="+bb.conn.Database)
	var out countingDiscard
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	began := time.Now()
	if err := cmd.Run(); err != nil {
		b.Fatalf("pg_dump: %v: %s", err, stderr.String())
	}
	return time.Since(began), out.n
}

// BenchmarkBackup compares Backup (slot with exported snapshot, pg_dump
// --snapshot, envelope with checksums) with plain pg_dump -Fc of the same
// database with the same pg_dump, in one run. The ratio sub-benchmark runs
// both on each iteration, in alternating order, and reports the median of
// Backup's wall time over pg_dump's (the target is at most 1.05).
// SIPHON_BENCH_ROWS sets the table's row count (default 200000).
func BenchmarkBackup(b *testing.B) {
	bb := newBackupBench(b)
	report := func(b *testing.B, total time.Duration, bytes int64) {
		b.ReportMetric(float64(bb.rows)*float64(b.N)/total.Seconds(), "rows/s")
		b.ReportMetric(float64(bytes)/1e6, "MB/op")
	}
	b.Run("pg_dump_Fc", func(b *testing.B) {
		var total time.Duration
		var size int64
		for b.Loop() {
			d, n := bb.pgDumpFc(b)
			total, size = total+d, n
		}
		report(b, total, size)
	})
	b.Run("siphon", func(b *testing.B) {
		var total time.Duration
		var size int64
		for b.Loop() {
			d, n := bb.backup(b)
			total, size = total+d, n
		}
		report(b, total, size)
	})
	b.Run("ratio", func(b *testing.B) {
		var ratios []float64
		for i := 0; b.Loop(); i++ {
			var ours, theirs time.Duration
			if i%2 == 0 {
				ours, _ = bb.backup(b)
				theirs, _ = bb.pgDumpFc(b)
			} else {
				theirs, _ = bb.pgDumpFc(b)
				ours, _ = bb.backup(b)
			}
			ratios = append(ratios, ours.Seconds()/theirs.Seconds())
		}
		sort.Float64s(ratios)
		b.ReportMetric(ratios[len(ratios)/2], "x_pg_dump(median)")
		b.ReportMetric(ratios[len(ratios)-1], "x_pg_dump(max)")
		b.ReportMetric(0, "ns/op")
	})
}
