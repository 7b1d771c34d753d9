package siphon_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/siphondb/siphon"
	"github.com/siphondb/siphon/siphontest"
)

// BenchmarkDDLWithCapture measures what the schema capture adds to the
// application's DDL: ALTER TABLE ... ADD COLUMN and CREATE INDEX on a
// database of 2000 tables, with the capture installed (a publication of
// all its tables looked after) and, in the same run, on an identical
// database without it. It reports the time of one statement in each and
// their ratio.
func BenchmarkDDLWithCapture(b *testing.B) {
	ctx := context.Background()
	srv := siphontest.Start(b)
	const tables = 2000
	setUp := func(capture bool) *pgx.Conn {
		dsn := srv.NewDatabase(b)
		conn, err := pgx.Connect(ctx, dsn)
		require.NoError(b, err)
		b.Cleanup(func() { conn.Close(context.Background()) })
		_, err = conn.Exec(ctx, fmt.Sprintf(`DO $$ BEGIN FOR i IN 1..%d LOOP
			EXECUTE format('CREATE TABLE t%%s (id int PRIMARY KEY, v text)', i); END LOOP; END $$`, tables))
		require.NoError(b, err)
		if capture {
			c, err := siphon.Connect(ctx, dsn, siphon.WithSlot("bench_ddl_capture"))
			require.NoError(b, err)
			b.Cleanup(func() { c.Detach(context.Background()); c.Close() })
			require.NoError(b, c.InstallSchemaCapture(ctx))
			_, err = c.SyncPublication(ctx)
			require.NoError(b, err)
		}
		return conn
	}
	plain, captured := setUp(false), setUp(true)
	ddl := func(conn *pgx.Conn, i int) time.Duration {
		began := time.Now()
		_, err := conn.Exec(ctx, fmt.Sprintf(`ALTER TABLE t%d ADD COLUMN c%d int; CREATE INDEX ON t%d (v)`, 1+i%tables, i, 1+i%tables))
		require.NoError(b, err)
		return time.Since(began)
	}
	var without, with time.Duration
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		without += ddl(plain, i)
		with += ddl(captured, i)
	}
	n := float64(b.N)
	b.ReportMetric(float64(without.Microseconds())/n, "us/ddl-without")
	b.ReportMetric(float64(with.Microseconds())/n, "us/ddl-with")
	b.ReportMetric(float64(with)/float64(without), "ratio")
}
