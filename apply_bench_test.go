package siphon_test

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/siphondb/siphon"
	"github.com/siphondb/siphon/canonical"
	"github.com/siphondb/siphon/siphontest"
)

// insertStream returns rows, rows of the standard table, as a JSONL change
// stream of transactions of perTx inserts.
func insertStream(b *testing.B, c *siphon.Conn, rows []canonical.Row, perTx int) []byte {
	b.Helper()
	schema, err := c.InspectSchema(context.Background())
	require.NoError(b, err)
	table := *schema.Table("public", "bench")
	var buf bytes.Buffer
	enc := canonical.NewEncoder(&buf)
	require.NoError(b, enc.WriteHeader(canonical.Header{Kind: canonical.KindIncremental, Start: 0x1000000, SystemID: "42", Slot: "bench"}))
	require.NoError(b, enc.WriteTable(&table))
	name := table.TableName()
	pos := canonical.Position(0x1000000)
	at := time.Date(2026, 11, 30, 5, 0, 0, 0, time.UTC)
	for lo := 0; lo < len(rows); lo += perTx {
		pos += 0x100
		require.NoError(b, enc.WriteChange(&canonical.Change{Op: canonical.OpBegin, Position: pos, XID: uint32(lo), CommitTime: at}))
		for _, row := range rows[lo:min(lo+perTx, len(rows))] {
			require.NoError(b, enc.WriteChange(&canonical.Change{Op: canonical.OpInsert, Position: pos, XID: uint32(lo),
				Schema: name.Schema, Table: name.Name, New: row}))
		}
		require.NoError(b, enc.WriteChange(&canonical.Change{Op: canonical.OpCommit, Position: pos + 0x30, CommitTime: at}))
		pos += 0x30
	}
	require.NoError(b, enc.WriteEnd(pos))
	return buf.Bytes()
}

// BenchmarkConsumeCanonicalInserts applies an insert-only change stream
// with ConsumeCanonical and loads the same rows with COPY FROM (text) into
// an identical table, side by side in each iteration (each into its
// emptied table), and reports both rates (siphon_rows/s,
// reference_rows/s) and the median and lowest of the per-iteration
// ratios of ConsumeCanonical's speed over COPY FROM's (x_copy_from; the
// target is >= 0.8). The rows are the standard table's
// (SIPHON_BENCH_ROWS rows, default 20000; see bench_data_test.go), and
// COPY FROM reads the server's own COPY text of them.
func BenchmarkConsumeCanonicalInserts(b *testing.B) {
	for _, perTx := range []int{1000, 100, 10} {
		b.Run(fmt.Sprintf("rows_per_tx=%d", perTx), func(b *testing.B) { benchConsume(b, perTx) })
	}
}

func benchConsume(b *testing.B, perTx int) {
	ctx := context.Background()
	dsn := siphontest.Start(b).NewDatabase(b)
	admin, err := pgx.Connect(ctx, dsn)
	require.NoError(b, err)
	defer admin.Close(ctx)
	n := benchRows(b)
	loadBenchTable(b, admin, n)
	copyText, rows := benchTableText(b, admin)
	execSQL(b, admin, "TRUNCATE bench", "CREATE TABLE bench_copy (LIKE bench INCLUDING ALL)")
	c, err := siphon.Connect(ctx, dsn)
	require.NoError(b, err)
	defer c.Close()
	defer c.ResetAppliedPosition(ctx, "42", "bench")
	stream := insertStream(b, c, rows, perTx)

	// What each spent on a CPU: COPY FROM's backend (admin's), and
	// ConsumeCanonical's backends and this process.
	var copyTook, consumeTook time.Duration
	var copyServer, consumeServer, consumeClient schedStat
	adminPID := int(admin.PgConn().PID())
	copyFrom := func() time.Duration {
		b.StopTimer()
		_, err := admin.Exec(ctx, "TRUNCATE bench_copy")
		require.NoError(b, err)
		b.StartTimer()
		server0, _ := procSched(adminPID)
		start := time.Now()
		_, err = admin.PgConn().CopyFrom(ctx, bytes.NewReader(copyText), "COPY bench_copy FROM STDIN")
		took := time.Since(start)
		require.NoError(b, err)
		server1, _ := procSched(adminPID)
		copyTook, copyServer = copyTook+took, copyServer.plus(server1.minus(server0))
		return took
	}
	consume := func() time.Duration {
		b.StopTimer()
		_, err := admin.Exec(ctx, "TRUNCATE bench")
		require.NoError(b, err)
		require.NoError(b, c.ResetAppliedPosition(ctx, "42", "bench"))
		b.StartTimer()
		watch := watchTarget(dsn, admin)
		client0 := selfSched()
		start := time.Now()
		err = c.ConsumeCanonical(ctx, bytes.NewReader(stream))
		took := time.Since(start)
		client := selfSched().minus(client0)
		server, _ := watch()
		require.NoError(b, err)
		consumeTook, consumeServer, consumeClient = consumeTook+took, consumeServer.plus(server), consumeClient.plus(client)
		return took
	}
	b.ResetTimer()
	sideBySide(b, "x_copy_from", true, n, consume, copyFrom)
	b.StopTimer()
	var count int
	require.NoError(b, admin.QueryRow(ctx, "SELECT count(*) FROM bench").Scan(&count))
	require.Equal(b, n, count)
	share := func(d, of time.Duration) float64 { return 100 * d.Seconds() / of.Seconds() }
	b.ReportMetric(share(copyServer.cpu, copyTook), "reference_server_cpu_pct")
	b.ReportMetric(share(consumeServer.cpu, consumeTook), "server_cpu_pct")
	b.ReportMetric(share(consumeServer.wait, consumeTook), "server_runq_pct")
	b.ReportMetric(share(consumeClient.cpu, consumeTook), "client_cpu_pct")
	total := float64(n) * float64(b.N)
	b.ReportMetric(1e6*copyServer.cpu.Seconds()/total, "reference_server_cpu_us/row")
	b.ReportMetric(1e6*consumeServer.cpu.Seconds()/total, "server_cpu_us/row")
	b.ReportMetric(1e6*consumeClient.cpu.Seconds()/total, "client_cpu_us/row")
}
