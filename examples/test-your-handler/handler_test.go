package main

import (
	"bytes"
	"context"
	"os"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/siphondb/siphon/canonical"
	"github.com/siphondb/siphon/siphontest"
)

// TestMain stops the shared throwaway server when the tests end, and with
// CheckLeaks fails the run if a test left a goroutine running (a stream
// never cancelled, a connection never closed) or a child process behind.
func TestMain(m *testing.M) { siphontest.Main(m, siphontest.CheckLeaks()) }

// TestRevenueFromRecordedStream needs no server: it replays a stream that
// was recorded once (go run . -record testdata/orders.jsonl) into the
// handler. Fast and deterministic, so it can cover every edge you record.
func TestRevenueFromRecordedStream(t *testing.T) {
	t.Parallel()
	f, err := os.Open("testdata/orders.jsonl")
	require.NoError(t, err)
	defer f.Close()

	revenue := NewRevenue()
	n, err := Replay(f, revenue.Handle)
	require.NoError(t, err)
	assert.Positive(t, n)
	assert.Equal(t, "12.25", revenue.Total("alice"), "10.50 updated to 12.00, plus 0.25")
	assert.Equal(t, "1.01", revenue.Total("bob"), "99.99 deleted, 1.01 added")
	assert.Equal(t, "5.00", revenue.Total("carol"))
}

// TestRevenueHandlesHandMadeChanges builds changes in code for a case the
// recording lacks.
func TestRevenueHandlesHandMadeChanges(t *testing.T) {
	t.Parallel()
	cols := []canonical.Column{{Name: "id"}, {Name: "customer"}, {Name: "total"}}
	revenue := NewRevenue()
	require.NoError(t, revenue.Handle(canonical.Change{Op: canonical.OpInsert, Schema: "shop", Table: "orders", Columns: cols,
		New: canonical.Row{canonical.Text("1"), canonical.Text("dave"), canonical.Text("0.10")}}))
	require.NoError(t, revenue.Handle(canonical.Change{Op: canonical.OpInsert, Schema: "shop", Table: "orders", Columns: cols,
		New: canonical.Row{canonical.Text("2"), canonical.Text("dave"), canonical.Text("0.20")}}))
	assert.Equal(t, "0.30", revenue.Total("dave"), "exact decimal arithmetic, no float drift")

	err := revenue.Handle(canonical.Change{Op: canonical.OpUpdate, Schema: "shop", Table: "orders", Columns: cols,
		New: canonical.Row{canonical.Text("2"), canonical.Text("dave"), canonical.Text("0.30")}})
	assert.ErrorContains(t, err, "REPLICA IDENTITY FULL", "an update without its old row is refused")
}

// TestRevenueLive runs the handler against a real logical-replication
// PostgreSQL: siphontest.Start shares one throwaway server per test binary
// and NewDatabase gives this test its own database, dropped at the end.
func TestRevenueLive(t *testing.T) {
	t.Parallel()
	dsn := siphontest.Start(t).NewDatabase(t)
	ctx := context.Background()

	var stream bytes.Buffer
	require.NoError(t, recordWorkload(ctx, dsn, "revenue_live", &stream))
	revenue := NewRevenue()
	_, err := Replay(&stream, revenue.Handle)
	require.NoError(t, err)

	// The handler must agree with the database itself.
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, "SELECT customer, sum(total)::text FROM shop.orders GROUP BY customer")
	require.NoError(t, err)
	want := map[string]string{}
	for rows.Next() {
		var customer, total string
		require.NoError(t, rows.Scan(&customer, &total))
		want[customer] = total
	}
	require.NoError(t, rows.Err())
	require.NotEmpty(t, want, "the workload left orders to compare")
	for customer := range revenue.ByCustomer {
		if _, ok := want[customer]; !ok {
			want[customer] = "0.00" // every order of this customer deleted
		}
	}
	for customer, total := range want {
		assert.Equal(t, total, revenue.Total(customer), customer)
	}
}
