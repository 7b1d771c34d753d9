package main

import (
	"bytes"
	"context"
	"io"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/siphondb/siphon"
	"github.com/siphondb/siphon/canonical"
	"github.com/siphondb/siphon/siphontest"
)

// TestMain stops the shared throwaway server when the tests end, and with
// CheckLeaks fails the run if a test left a goroutine running (a stream
// never cancelled, a connection never closed) or a child process behind.
func TestMain(m *testing.M) { siphontest.Main(m, siphontest.CheckLeaks()) }

// TestRevenueFromRecording needs no server: it replays a stream recorded
// once from a live one into the handler, exactly as StreamChanges
// delivered it. Fast and deterministic, so it can cover every edge you
// record. The recording is testdata/orders.jsonl, committed with the
// test; SIPHON_RECORD=1 go test -run TestRevenueFromRecording records it
// again, with the function given to siphontest.Recording.
func TestRevenueFromRecording(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	stream := siphontest.Recording(t, "testdata/orders.jsonl", func(w io.Writer) error {
		dsn := siphontest.Start(t).NewDatabase(t)
		return recordWorkload(ctx, dsn, "orders_recording", w, NewRevenue().Handle)
	})

	revenue := NewRevenue()
	_, err := canonical.Replay(ctx, bytes.NewReader(stream), 0, revenue.Handle)
	require.NoError(t, err)
	assert.Equal(t, "12.25", revenue.Total("alice"), "10.50 updated to 12.00, plus 0.25")
	assert.Equal(t, "1.01", revenue.Total("bob"), "99.99 deleted, 1.01 added")
	assert.Equal(t, "5.00", revenue.Total("carol"))
}

// TestRevenueHandlesHandMadeChanges builds changes in code for cases the
// recording lacks.
func TestRevenueHandlesHandMadeChanges(t *testing.T) {
	t.Parallel()
	cols := []canonical.Column{{Name: "id"}, {Name: "customer"}, {Name: "total"}}
	order := func(op canonical.Op, id, customer, total string) canonical.Change {
		row := canonical.Row{canonical.Text(id), canonical.Text(customer), canonical.Text(total)}
		ch := canonical.Change{Op: op, Schema: "shop", Table: "orders", Columns: cols}
		if op == canonical.OpDelete {
			ch.Old = row
		} else {
			ch.New = row
		}
		return ch
	}
	revenue := NewRevenue()
	require.NoError(t, revenue.Handle(order(canonical.OpInsert, "1", "dave", "0.10")))
	require.NoError(t, revenue.Handle(order(canonical.OpInsert, "2", "dave", "0.20")))
	assert.Equal(t, "0.30", revenue.Total("dave"), "exact decimal arithmetic, no float drift")

	err := revenue.Handle(order(canonical.OpUpdate, "2", "dave", "0.30"))
	assert.ErrorContains(t, err, "REPLICA IDENTITY FULL", "an update without its old row is refused")

	err = revenue.Handle(order(canonical.OpInsert, "3", "erin", "NaN"))
	assert.ErrorIs(t, err, canonical.ErrNotConvertible, "numeric NaN is no amount")
	assert.Equal(t, "0.30", revenue.Total("dave"))

	require.NoError(t, revenue.Handle(canonical.Change{Op: canonical.OpTruncate, Truncated: []canonical.TableName{{Schema: "shop", Name: "orders"}}}))
	assert.Equal(t, "0.00", revenue.Total("dave"), "TRUNCATE shop.orders empties it")
}

// TestRevenueLive runs the handler against a real logical-replication
// PostgreSQL: siphontest.Start shares one throwaway server per test binary
// and NewDatabase gives this test its own database, dropped at the end.
// The stream is recorded as the handler runs, and the recording replayed
// into a new handler ends with the same totals.
func TestRevenueLive(t *testing.T) {
	t.Parallel()
	dsn := siphontest.Start(t).NewDatabase(t)
	ctx := context.Background()

	live := NewRevenue()
	var recording bytes.Buffer
	require.NoError(t, recordWorkload(ctx, dsn, "revenue_live", &recording, live.Handle))
	assertAgreesWithDatabase(t, dsn, live)

	replayed := NewRevenue()
	_, err := canonical.Replay(ctx, &recording, 0, replayed.Handle)
	require.NoError(t, err)
	assert.Equal(t, totals(live), totals(replayed))
}

// TestRevenueFromSnapshotThenStream feeds the one handler a snapshot of
// the orders that existed before, as changes, then the change stream from
// the snapshot's Position: the totals count every order once.
func TestRevenueFromSnapshotThenStream(t *testing.T) {
	t.Parallel()
	dsn := siphontest.Start(t).NewDatabase(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	require.NoError(t, createOrders(ctx, conn))
	_, err = conn.Exec(ctx, `INSERT INTO shop.orders VALUES (100, 'alice', 1.00), (101, 'dave', 7.00)`)
	require.NoError(t, err)

	c, err := siphon.Connect(ctx, dsn, siphon.WithSlot("revenue_snapshot"))
	require.NoError(t, err)
	defer c.Close()
	snap, err := c.TakeSnapshot(ctx)
	require.NoError(t, err)
	defer snap.Close(ctx)
	revenue := NewRevenue()
	rows := canonical.NewSnapshotChanges(snap.Position(), revenue.Handle)
	require.NoError(t, snap.CopyTables(ctx, nil, siphon.CopyOptions{}, rows.Row))
	require.NoError(t, rows.Commit())
	require.NoError(t, snap.Close(ctx))
	assert.Equal(t, "1.00", revenue.Total("alice"), "the snapshot's orders")

	require.NoError(t, streamWorkload(ctx, c, conn, snap.Position(), revenue.Handle))
	assert.Equal(t, "13.25", revenue.Total("alice"))
	assert.Equal(t, "7.00", revenue.Total("dave"))
	assertAgreesWithDatabase(t, dsn, revenue)
}

// assertAgreesWithDatabase checks the handler's totals against the
// database's own answer.
func assertAgreesWithDatabase(t *testing.T, dsn string, revenue *Revenue) {
	t.Helper()
	ctx := context.Background()
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
