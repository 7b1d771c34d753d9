package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/siphondb/siphon/siphontest"
)

func TestMain(m *testing.M) { siphontest.Main(m, siphontest.CheckLeaks()) }

// TestMigrateLive runs the demo as `go run ./examples/migrate-live` does,
// on an embedded throwaway PostgreSQL (SIPHON_DSN unset).
func TestMigrateLive(t *testing.T) {
	// Skips or fails like the other tests when no server can be had, and
	// skips where this machine's pg_dump, which copies the schema, is
	// older than the server.
	siphontest.Start(t).SkipUnlessDumpClients(t)
	t.Setenv("SIPHON_DSN", "")
	var out bytes.Buffer
	require.NoError(t, run(context.Background(), &out))
	t.Log("\n" + out.String())
	assertMigrated(t, out.String())
	assert.Contains(t, out.String(), "server: embedded throwaway PostgreSQL")
}

// TestMigrateLiveOnYourServer runs the demo with SIPHON_DSN set, on the
// test server, and checks it leaves no slot, publication or replication
// origin behind there.
func TestMigrateLiveOnYourServer(t *testing.T) {
	srv := siphontest.Start(t)
	srv.SkipUnlessDumpClients(t)
	dsn := srv.NewDatabase(t)
	t.Setenv("SIPHON_DSN", dsn)
	var out bytes.Buffer
	require.NoError(t, run(context.Background(), &out))
	assertMigrated(t, out.String())

	conn, err := pgx.Connect(context.Background(), dsn)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	var left int
	require.NoError(t, conn.QueryRow(context.Background(), `SELECT
		(SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'siphon_migrate') +
		(SELECT count(*) FROM pg_replication_origin WHERE roname LIKE 'siphon_%_siphon_migrate')`).Scan(&left))
	assert.Zero(t, left, "no slot or replication origin left on the server")
}

func assertMigrated(t *testing.T, out string) {
	t.Helper()
	for _, step := range []string{"1. replicate", "2. cutover      lag zero", "set the sequences", "sequence at", "done in"} {
		assert.Contains(t, out, step)
	}
	assert.Contains(t, out, "streaming: applied", "progress of the stream")
	assert.Contains(t, out, "snapshot loaded: 2 tables, ", "progress of the snapshot")
	assert.Equal(t, 2, strings.Count(out, "identical to the source"), out)
}
