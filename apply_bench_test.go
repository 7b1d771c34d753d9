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
// an identical table, in each iteration, and reports both rates and their
// ratio (x_copy_from; the target is >= 0.5). The rows are the standard
// table's (SIPHON_BENCH_ROWS rows, default 20000; see bench_data_test.go),
// and COPY FROM reads the server's own COPY text of them.
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

	var consumeTime, copyTime time.Duration
	b.ResetTimer()
	for b.Loop() {
		b.StopTimer()
		_, err := admin.Exec(ctx, "TRUNCATE bench, bench_copy")
		require.NoError(b, err)
		require.NoError(b, c.ResetAppliedPosition(ctx, "42", "bench"))
		b.StartTimer()

		start := time.Now()
		_, err = admin.PgConn().CopyFrom(ctx, bytes.NewReader(copyText), "COPY bench_copy FROM STDIN")
		require.NoError(b, err)
		copyTime += time.Since(start)

		start = time.Now()
		require.NoError(b, c.ConsumeCanonical(ctx, bytes.NewReader(stream)))
		consumeTime += time.Since(start)
	}
	b.StopTimer()
	var count int
	require.NoError(b, admin.QueryRow(ctx, "SELECT count(*) FROM bench").Scan(&count))
	require.Equal(b, n, count)
	total := float64(n) * float64(b.N)
	b.ReportMetric(total/consumeTime.Seconds(), "consume_rows/s")
	b.ReportMetric(total/copyTime.Seconds(), "copyfrom_rows/s")
	b.ReportMetric(copyTime.Seconds()/consumeTime.Seconds(), "x_copy_from")
	b.ReportMetric(float64(len(stream))*float64(b.N)/consumeTime.Seconds()/1e6, "stream_MB/s")
}
