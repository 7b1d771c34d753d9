package siphon_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/siphondb/siphon"
)

// TestPublicationNeverHoldsWhileWaiting: siphon creates its publication,
// or adds tables to it (SyncPublication), while a transaction of the
// user's empties a partitioned table and what references it (TRUNCATE
// orders CASCADE locks orders, its partitions, then order_lines). CREATE
// and ALTER PUBLICATION lock their tables in their list's order,
// order_lines before orders: had siphon held order_lines while it waited
// for orders, the server would have ended one of the two as a deadlock.
// siphon lets go and waits for orders alone, and both succeed.
func TestPublicationNeverHoldsWhileWaiting(t *testing.T) {
	t.Parallel()
	for name, publish := range map[string]func(ctx context.Context, c *siphon.Conn) error{
		"created": func(ctx context.Context, c *siphon.Conn) error {
			_, err := c.CurrentPosition(ctx) // creates the publication, then the slot
			return err
		},
		"synced": func(ctx context.Context, c *siphon.Conn) error {
			_, err := c.SyncPublication(ctx)
			return err
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			dsn, admin := newDatabase(t)
			c, _ := streamConn(t, dsn)
			if name == "synced" {
				execSQL(t, admin, `CREATE TABLE customers (id int PRIMARY KEY)`)
				_, err := c.CurrentPosition(ctx)
				require.NoError(t, err)
			}
			execSQL(t, admin,
				`CREATE TABLE orders (id int, placed_on date, PRIMARY KEY (id, placed_on)) PARTITION BY RANGE (placed_on)`,
				`CREATE TABLE orders_2025 PARTITION OF orders FOR VALUES FROM ('2025-01-01') TO ('2026-01-01')`,
				`CREATE TABLE orders_2026 PARTITION OF orders FOR VALUES FROM ('2026-01-01') TO ('2027-01-01')`,
				`CREATE TABLE order_lines (order_id int, placed_on date, n int, PRIMARY KEY (order_id, placed_on, n),
					FOREIGN KEY (order_id, placed_on) REFERENCES orders)`,
				`INSERT INTO orders VALUES (1, '2025-06-01')`,
				`INSERT INTO order_lines VALUES (1, '2025-06-01', 1)`)
			holder, truncater := connectOrFail(t, dsn), connectOrFail(t, dsn)

			// A reader of one partition holds the TRUNCATE up once it has
			// orders.
			execSQL(t, holder, `BEGIN`, `LOCK TABLE orders_2025 IN ACCESS SHARE MODE`)
			truncated := make(chan error, 1)
			go func() {
				_, err := truncater.Exec(ctx, `TRUNCATE orders CASCADE`)
				truncated <- err
			}()
			waitLocked(t, admin, "the TRUNCATE, holding orders,", "orders_2025")

			published := make(chan error, 1)
			go func() { published <- publish(ctx, c) }()
			waitLocked(t, admin, "siphon", "orders")

			execSQL(t, holder, `COMMIT`)
			require.NoError(t, <-truncated, "the user's TRUNCATE")
			require.NoError(t, <-published, "siphon's publication")
		})
	}
}
