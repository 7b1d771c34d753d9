package siphon_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/siphondb/siphon"
	"github.com/siphondb/siphon/pgdump"
	"github.com/siphondb/siphon/siphontest"
)

// backupBench is a database loaded with rows rows, and a Conn on it.
type backupBench struct {
	c      *siphon.Conn
	conn   pgdump.Conn
	pgDump pgdump.Program
	rows   int
}

func newBackupBench(b *testing.B) *backupBench {
	b.Helper()
	rows := benchRows(b)
	ctx := context.Background()
	dsn := siphontest.Start(b).NewDatabase(b)
	admin, err := pgx.Connect(ctx, dsn)
	if err != nil {
		b.Fatal(err)
	}
	defer admin.Close(ctx)
	loadBenchTable(b, admin, rows)
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
	var out countingWriter
	began := time.Now()
	if err := bb.c.Backup(context.Background(), siphon.BackupOptions{}, &out); err != nil {
		b.Fatal(err)
	}
	return time.Since(began), int64(out)
}

// pgTool prepares a PostgreSQL client program on conn's database: the
// connection goes in the environment, never in argv (siphontest's
// superuser has no password).
func pgTool(path string, conn pgdump.Conn, args ...string) *exec.Cmd {
	cmd := exec.Command(path, args...)
	cmd.Env = append(os.Environ(), "PGHOST="+conn.Host, "PGPORT="+strconv.Itoa(int(conn.Port)),
		"PGUSER="+conn.User, "PGDATABASE="+conn.Database)
	return cmd
}

// pgDumpFc runs plain pg_dump -Fc, the same binary, to a counting sink.
func (bb *backupBench) pgDumpFc(b *testing.B) (time.Duration, int64) {
	cmd := pgTool(bb.pgDump.Path, bb.conn, "-Fc", "--no-password")
	var out countingWriter
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	began := time.Now()
	if err := cmd.Run(); err != nil {
		b.Fatalf("pg_dump: %v: %s", err, stderr.String())
	}
	return time.Since(began), int64(out)
}

// BenchmarkBackup compares Backup (slot with exported snapshot, pg_dump
// --snapshot, envelope with checksums) with plain pg_dump -Fc of the same
// database with the same pg_dump, in one run. The ratio sub-benchmark runs
// both on each iteration, in alternating order, and reports the median of
// Backup's wall time over pg_dump's (the target is at most 1.05).
// The database holds the standard table (SIPHON_BENCH_ROWS rows, default
// 20000; see bench_data_test.go).
func BenchmarkBackup(b *testing.B) {
	bb := newBackupBench(b)
	report := func(b *testing.B, total time.Duration, bytes int64) {
		b.ReportMetric(float64(bb.rows)*float64(b.N)/total.Seconds(), "rows/s")
		b.ReportMetric(float64(bytes)/1e6, "MB/op")
	}
	for _, run := range []struct {
		name string
		once func(*testing.B) (time.Duration, int64)
	}{{"pg_dump_Fc", bb.pgDumpFc}, {"siphon", bb.backup}} {
		b.Run(run.name, func(b *testing.B) {
			var total time.Duration
			var size int64
			for b.Loop() {
				d, n := run.once(b)
				total, size = total+d, n
			}
			report(b, total, size)
		})
	}
	b.Run("ratio", func(b *testing.B) {
		sideBySide(b, "x_pg_dump", false, 0,
			func() time.Duration { d, _ := bb.backup(b); return d },
			func() time.Duration { d, _ := bb.pgDumpFc(b); return d })
	})
}

// restoreBench holds one Backup envelope and one plain pg_dump -Fc file of
// the backupBench database, and the server to create restore targets on.
type restoreBench struct {
	*backupBench
	srv       *siphontest.Server
	envelope  []byte
	dumpFile  string
	pgRestore pgdump.Program
}

func newRestoreBench(b *testing.B) *restoreBench {
	b.Helper()
	bb := newBackupBench(b)
	ctx := context.Background()
	var envelope bytes.Buffer
	if err := bb.c.Backup(ctx, siphon.BackupOptions{}, &envelope); err != nil {
		b.Fatal(err)
	}
	dumpFile := filepath.Join(b.TempDir(), "bench.dump")
	f, err := os.Create(dumpFile)
	if err != nil {
		b.Fatal(err)
	}
	cmd := pgTool(bb.pgDump.Path, bb.conn, "-Fc", "--no-password")
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = f, &stderr
	err = cmd.Run()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		b.Fatalf("pg_dump: %v: %s", err, stderr.String())
	}
	prog, err := pgdump.Find(ctx, "pg_restore", "", pgdump.Version{})
	if err != nil {
		b.Fatal(err)
	}
	return &restoreBench{backupBench: bb, srv: siphontest.Start(b), envelope: envelope.Bytes(), dumpFile: dumpFile, pgRestore: prog}
}

// target creates an empty database, off the timer, and returns its
// connection settings and a function that drops it.
func (rb *restoreBench) target(b *testing.B) (pgdump.Conn, func()) {
	b.Helper()
	b.StopTimer()
	defer b.StartTimer()
	ctx := context.Background()
	dsn, drop, err := rb.srv.CreateDatabase(ctx)
	if err != nil {
		b.Fatal(err)
	}
	conn, err := pgdump.ParseDSN(dsn)
	if err != nil {
		b.Fatal(err)
	}
	return conn, func() {
		b.StopTimer()
		defer b.StartTimer()
		if err := drop(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// restore runs Restore of the envelope into a fresh database (named by
// RestoreOptions.Database on the source's Conn) and returns its wall time.
func (rb *restoreBench) restore(b *testing.B) time.Duration {
	conn, drop := rb.target(b)
	defer drop()
	began := time.Now()
	if err := rb.c.Restore(context.Background(), siphon.RestoreOptions{Database: conn.Database}, bytes.NewReader(rb.envelope)); err != nil {
		b.Fatal(err)
	}
	took := time.Since(began)
	rb.checkRows(b, conn)
	return took
}

// pgRestoreFile runs plain pg_restore --exit-on-error of the pg_dump -Fc
// file into a fresh database and returns its wall time.
func (rb *restoreBench) pgRestoreFile(b *testing.B) time.Duration {
	conn, drop := rb.target(b)
	defer drop()
	cmd := pgTool(rb.pgRestore.Path, conn, "--no-password", "--exit-on-error", "-d", "", rb.dumpFile)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	began := time.Now()
	if err := cmd.Run(); err != nil {
		b.Fatalf("pg_restore: %v: %s", err, stderr.String())
	}
	took := time.Since(began)
	rb.checkRows(b, conn)
	return took
}

// checkRows fails the benchmark unless the restored table holds every row,
// off the timer.
func (rb *restoreBench) checkRows(b *testing.B, conn pgdump.Conn) {
	b.StopTimer()
	defer b.StartTimer()
	ctx := context.Background()
	db, err := pgx.Connect(ctx, fmt.Sprintf("host=%s port=%d user=%s dbname=%s", conn.Host, conn.Port, conn.User, conn.Database))
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close(ctx)
	var n int
	if err := db.QueryRow(ctx, "SELECT count(*) FROM bench").Scan(&n); err != nil {
		b.Fatal(err)
	}
	if n != rb.rows {
		b.Fatalf("restored %d rows, want %d", n, rb.rows)
	}
}

// BenchmarkRestore compares Restore (envelope verified and spooled, then
// pg_restore --exit-on-error) with plain pg_restore --exit-on-error of a
// pg_dump -Fc file of the same database, with the same pg_restore, each into
// a fresh empty database (created and dropped off the timer), in one run.
// The data is BenchmarkBackup's. The ratio sub-benchmark runs both on each
// iteration, in alternating order, and reports the median and max of
// Restore's wall time over pg_restore's. The database holds the standard
// table (SIPHON_BENCH_ROWS rows, default 20000).
//
//	SIPHON_BENCH_ROWS=300000 go test -run '^$' -bench 'BenchmarkRestore$' -benchtime 3x
func BenchmarkRestore(b *testing.B) {
	rb := newRestoreBench(b)
	report := func(b *testing.B, total time.Duration) {
		b.ReportMetric(float64(rb.rows)*float64(b.N)/total.Seconds(), "rows/s")
		b.ReportMetric(0, "ns/op")
	}
	for _, run := range []struct {
		name string
		once func(*testing.B) time.Duration
	}{{"pg_restore", rb.pgRestoreFile}, {"siphon", rb.restore}} {
		b.Run(run.name, func(b *testing.B) {
			var total time.Duration
			for b.Loop() {
				total += run.once(b)
			}
			report(b, total)
		})
	}
	b.Run("ratio", func(b *testing.B) {
		sideBySide(b, "x_pg_restore", false, rb.rows, func() time.Duration { return rb.restore(b) },
			func() time.Duration { return rb.pgRestoreFile(b) })
	})
}
