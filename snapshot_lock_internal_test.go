package siphon

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/siphondb/siphon/canonical"
	"github.com/siphondb/siphon/internal/pgerr"
	"github.com/siphondb/siphon/siphontest"
)

// newSessions opens n sessions on a new database of siphontest's server,
// closed when the test ends.
func newSessions(t *testing.T, n int) []*pgx.Conn {
	t.Helper()
	dsn := siphontest.Start(t).NewDatabase(t)
	sessions := make([]*pgx.Conn, n)
	for i := range sessions {
		conn, err := pgx.Connect(context.Background(), dsn)
		require.NoError(t, err)
		t.Cleanup(func() { conn.Close(context.Background()) })
		sessions[i] = conn
	}
	return sessions
}

// TestLockRelationsNeverHoldsWhileWaiting: the copy's first session locks
// lines, then orders, while a transaction that empties them holds orders
// and then needs lines (TRUNCATE ... CASCADE locks a table, then the tables
// that reference it; the copy's order is its own). Had the copy kept lines
// while it waited for orders, one of the two would be ended as a deadlock
// after deadlock_timeout; the copy lets go of lines, the transaction
// commits, and the copy then holds both.
func TestLockRelationsNeverHoldsWhileWaiting(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	sessions := newSessions(t, 3)
	admin, lead, reset := sessions[0], sessions[1], sessions[2]
	exec := func(conn *pgx.Conn, sql string) {
		t.Helper()
		_, err := conn.Exec(ctx, sql)
		require.NoError(t, err, sql)
	}
	exec(admin, `CREATE TABLE orders (id int PRIMARY KEY)`)
	exec(admin, `CREATE TABLE lines (order_id int NOT NULL REFERENCES orders, n int NOT NULL)`)
	exec(admin, `INSERT INTO orders VALUES (1); INSERT INTO lines VALUES (1, 1)`)
	rels := []*relPlan{
		{name: canonical.TableName{Schema: "public", Name: "lines"}},
		{name: canonical.TableName{Schema: "public", Name: "orders"}},
	}

	exec(reset, `BEGIN`)
	exec(reset, `LOCK TABLE orders IN ACCESS EXCLUSIVE MODE`)
	exec(lead, `BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY`)
	locked := make(chan error, 1)
	go func() { locked <- lockRelations(ctx, lead, rels) }()
	waiting := func() bool {
		var n int
		require.NoError(t, admin.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = 'orders'::regclass AND pid = $1`,
			lead.PgConn().PID()).Scan(&n))
		return n > 0
	}
	for deadline := time.Now().Add(time.Minute); !waiting(); {
		require.Empty(t, locked, "lockRelations returned before the transaction ended")
		require.True(t, time.Now().Before(deadline), "the copy's session never waited for orders")
		time.Sleep(10 * time.Millisecond)
	}
	_, err := reset.Exec(ctx, `TRUNCATE orders CASCADE`)
	require.NoError(t, err, "the TRUNCATE did not deadlock with the copy's locks")
	exec(reset, `COMMIT`)
	require.NoError(t, <-locked, "the copy's locks did not deadlock with the TRUNCATE")

	var held []string
	rows, err := admin.Query(ctx, `SELECT relation::regclass::text FROM pg_locks
		WHERE pid = $1 AND mode = 'AccessShareLock' AND granted AND relation IN ('orders'::regclass, 'lines'::regclass) ORDER BY 1`,
		lead.PgConn().PID())
	require.NoError(t, err)
	held, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	assert.Equal(t, []string{"lines", "orders"}, held, "the copy holds both tables once it returns")
	exec(lead, `COMMIT`)
}

// TestLockRelationsKeepsTheLockTimeout: a session whose lock_timeout ends
// the wait for a table another session holds gets the error, as before
// the copy learned to wait for one table alone, instead of waiting again.
func TestLockRelationsKeepsTheLockTimeout(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	sessions := newSessions(t, 2)
	admin, lead := sessions[0], sessions[1]
	_, err := admin.Exec(ctx, `CREATE TABLE orders (id int PRIMARY KEY)`)
	require.NoError(t, err)
	_, err = admin.Exec(ctx, `BEGIN; LOCK TABLE orders IN ACCESS EXCLUSIVE MODE`)
	require.NoError(t, err)
	defer admin.Exec(ctx, `COMMIT`)
	_, err = lead.Exec(ctx, `BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; SET LOCAL lock_timeout = '100ms'`)
	require.NoError(t, err)
	bounded, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	err = lockRelations(bounded, lead, []*relPlan{{name: canonical.TableName{Schema: "public", Name: "orders"}}})
	require.Error(t, err)
	assert.NoError(t, bounded.Err(), "lockRelations returned at the lock_timeout, not at the caller's deadline")
	assert.True(t, pgerr.Is(err, pgerrcode.LockNotAvailable), "the lock_timeout's error: %v", err)
}
