package siphon_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// leftoversQuery describes what siphon may leave on the current database:
// its replication slots (but those in $1), walsenders, advisory locks, and
// sessions named "siphon".
const leftoversQuery = `
SELECT 'slot ' || slot_name || coalesce(' (active pid ' || active_pid || ')', '')
FROM pg_replication_slots
WHERE database = current_database() AND NOT slot_name = ANY ($1)
UNION ALL
SELECT 'walsender pid ' || pid || ' (' || coalesce(state, '') || ': ' || left(query, 80) || ')'
FROM pg_stat_activity
WHERE backend_type = 'walsender' AND datname = current_database()
UNION ALL
SELECT 'advisory lock held by pid ' || pid
FROM pg_locks
WHERE locktype = 'advisory' AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
UNION ALL
SELECT 'session pid ' || pid || ' named siphon (' || coalesce(state, '') || ': ' || left(query, 80) || ')'
FROM pg_stat_activity
WHERE application_name = 'siphon' AND datname = current_database() AND backend_type <> 'walsender'`

// assertNoLeaks waits (up to waitDeadline: sessions end asynchronously) until
// siphon has left nothing behind on the database dsn names: no replication
// slot of that database except keepSlots, no walsender, no advisory lock
// and no session named "siphon". Close every siphon.Conn on the database
// first, and end sessions the test opened with application_name "siphon".
// Physical slots belong to no database: tests that make them run on a
// private server and check pg_replication_slots themselves.
func assertNoLeaks(t testing.TB, dsn string, keepSlots ...string) bool {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer conn.Close(ctx)
	if keepSlots == nil {
		keepSlots = []string{}
	}
	var left []string
	waitUntil(func() bool {
		left, err = leftovers(ctx, conn, keepSlots)
		return err == nil && len(left) == 0
	})
	return assert.NoError(t, err) && assert.Empty(t, left, "left behind by siphon")
}

func leftovers(ctx context.Context, conn *pgx.Conn, keepSlots []string) ([]string, error) {
	rows, err := conn.Query(ctx, leftoversQuery, keepSlots)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// checkNothingLeftRunning is assertNoLeaks for the end of any test that
// used the database dsn: the slots the test made on purpose may remain
// (the database's drop removes them), but no snapshot slot ("siphon_snap_"
// prefix: they must die with their snapshot), copy of a slot for a
// stream's catch-up ("siphon_catchup_"), walsender, advisory lock or
// siphon session.
func checkNothingLeftRunning(t testing.TB, dsn string) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	rows, err := conn.Query(ctx, `SELECT slot_name FROM pg_replication_slots
		WHERE database = current_database() AND NOT starts_with(slot_name, 'siphon_snap_')
			AND NOT starts_with(slot_name, 'siphon_catchup_')`)
	require.NoError(t, err)
	kept, err := pgx.CollectRows(rows, pgx.RowTo[string])
	conn.Close(ctx)
	require.NoError(t, err)
	assertNoLeaks(t, dsn, kept...)
}
