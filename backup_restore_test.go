package siphon_test

import (
	"bytes"
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/siphondb/siphon"
)

// TestRestoreLeavesTheSourcesMachineryOut backs up a source where siphon is
// attached (its publication, the schema capture) and which has a
// publication of the application's own: a Restore brings neither
// publication, nor siphon's schema or event triggers, and the restored
// database does not publish; with KeepPublications the publications come
// too (never siphon's schema, nor subscriptions).
func TestRestoreLeavesTheSourcesMachineryOut(t *testing.T) {
	t.Parallel()
	skipUnlessDumpClients(t)
	ctx := context.Background()
	dsn, src := newDatabase(t)
	execSQL(t, src, `CREATE TABLE t (id int PRIMARY KEY, v text)`, `INSERT INTO t VALUES (1, 'one'), (2, 'two')`,
		`CREATE TABLE audit (at timestamptz NOT NULL DEFAULT now(), what text)`,
		`CREATE PUBLICATION app_feed FOR TABLE t`)
	c, slot := backupConn(t, dsn)
	require.NoError(t, c.InstallSchemaCapture(ctx))
	data := backup(t, c, siphon.BackupOptions{StartChain: true})
	require.Equal(t, 2, siphonLeftovers(t, src)["publications"], "the application's and siphon's")

	dstDSN, dst := newDatabase(t)
	target := connect(t, dstDSN)
	require.NoError(t, target.Restore(ctx, siphon.RestoreOptions{}, bytes.NewReader(data)))
	assert.Equal(t, tableDigests(t, src), tableDigests(t, dst))
	assert.Equal(t, noLeftovers, siphonLeftovers(t, dst), "no publication, nothing of siphon's")

	keptDSN, kept := newDatabase(t)
	target = connect(t, keptDSN)
	require.NoError(t, target.Restore(ctx, siphon.RestoreOptions{KeepPublications: true}, bytes.NewReader(data)))
	assert.Equal(t, tableDigests(t, src), tableDigests(t, kept))
	assert.ElementsMatch(t, []string{"app_feed", slot}, publicationNames(t, kept))
	left := siphonLeftovers(t, kept)
	delete(left, "publications")
	assert.Equal(t, map[string]int{"schema siphon": 0, "event triggers": 0, "subscriptions": 0}, left)
	require.NoError(t, c.Detach(ctx))
}

// siphonLeftovers counts what of siphon's a database holds: schema
// siphon, event triggers, publications and subscriptions.
func siphonLeftovers(t *testing.T, conn *pgx.Conn) map[string]int {
	t.Helper()
	return map[string]int{
		"schema siphon":  count(t, conn, "SELECT count(*) FROM pg_namespace WHERE nspname = 'siphon'"),
		"event triggers": count(t, conn, "SELECT count(*) FROM pg_event_trigger"),
		"publications":   count(t, conn, "SELECT count(*) FROM pg_publication"),
		"subscriptions":  count(t, conn, "SELECT count(*) FROM pg_subscription WHERE subdbid = (SELECT oid FROM pg_database WHERE datname = current_database())"),
	}
}

var noLeftovers = map[string]int{"schema siphon": 0, "event triggers": 0, "publications": 0, "subscriptions": 0}

// publicationNames lists the publications of conn's database.
func publicationNames(t *testing.T, conn *pgx.Conn) []string {
	t.Helper()
	rows, err := conn.Query(context.Background(), "SELECT pubname::text FROM pg_publication")
	require.NoError(t, err)
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return names
}
