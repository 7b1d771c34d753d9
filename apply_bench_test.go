package siphon_test

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/siphondb/siphon"
	"github.com/siphondb/siphon/canonical"
	"github.com/siphondb/siphon/siphontest"
)

const benchDDL = `(id bigint PRIMARY KEY, name text NOT NULL, amount numeric(12,2), at timestamptz, tags text[], payload jsonb)`

// benchData returns n rows as canonical rows, as a JSONL change stream of
// transactions of perTx inserts, and as COPY text.
func benchData(b *testing.B, c *siphon.Conn, n, perTx int) (stream, copyText []byte) {
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
	var cp []byte
	for i := 0; i < n; {
		pos += 0x100
		at := time.Date(2026, 11, 30, 5, 0, 0, 0, time.UTC)
		require.NoError(b, enc.WriteChange(&canonical.Change{Op: canonical.OpBegin, Position: pos, XID: uint32(i), CommitTime: at}))
		for j := 0; j < perTx && i < n; j++ {
			i++
			row := canonical.Row{
				canonical.Text(strconv.Itoa(i)), canonical.Text(fmt.Sprintf("customer %d", i)),
				canonical.Text(fmt.Sprintf("%d.%02d", i%100000, i%100)), canonical.Text("2026-11-30 05:00:00.123456+00"),
				canonical.Text(`{red,"green blue"}`), canonical.Text(fmt.Sprintf(`{"n": %d, "ok": true}`, i)),
			}
			require.NoError(b, enc.WriteChange(&canonical.Change{Op: canonical.OpInsert, Position: pos, XID: uint32(i),
				Schema: name.Schema, Table: name.Name, New: row}))
			for k, v := range row {
				if k > 0 {
					cp = append(cp, '\t')
				}
				s, _ := v.Text()
				cp = append(cp, s...)
			}
			cp = append(cp, '\n')
		}
		require.NoError(b, enc.WriteChange(&canonical.Change{Op: canonical.OpCommit, Position: pos + 0x30, CommitTime: at}))
		pos += 0x30
	}
	require.NoError(b, enc.WriteEnd(pos))
	return buf.Bytes(), cp
}

// BenchmarkConsumeCanonicalInserts applies an insert-only change stream
// with ConsumeCanonical and loads the same rows with COPY FROM (text) into
// an identical table, in each iteration, and reports both rates and their
// ratio (consume_vs_copy; the target is >= 0.5). SIPHON_BENCH_ROWS sets the
// number of rows (default 20000).
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
	for _, sql := range []string{"CREATE TABLE bench " + benchDDL, "CREATE TABLE bench_copy " + benchDDL} {
		_, err := admin.Exec(ctx, sql)
		require.NoError(b, err)
	}
	c, err := siphon.Connect(ctx, dsn)
	require.NoError(b, err)
	defer c.Close()
	defer c.ResetAppliedPosition(ctx, "42", "bench")
	n := envInt(b, "SIPHON_BENCH_ROWS", 20000)
	stream, copyText := benchData(b, c, n, perTx)

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
	rows := float64(n) * float64(b.N)
	b.ReportMetric(rows/consumeTime.Seconds(), "consume_rows/s")
	b.ReportMetric(rows/copyTime.Seconds(), "copyfrom_rows/s")
	b.ReportMetric(copyTime.Seconds()/consumeTime.Seconds(), "consume_vs_copy")
	b.ReportMetric(float64(len(stream))*float64(b.N)/consumeTime.Seconds()/1e6, "stream_MB/s")
}
