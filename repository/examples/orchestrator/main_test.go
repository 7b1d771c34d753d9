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

// TestOrchestrator runs the demo as `go run ./examples/orchestrator` does,
// on an embedded throwaway PostgreSQL (SIPHON_DSN unset) and a directory
// bucket.
func TestOrchestrator(t *testing.T) {
	siphontest.Start(t).SkipUnlessDumpClients(t)
	t.Setenv("SIPHON_DSN", "")
	t.Setenv("SIPHON_REPOSITORY_URL", "")
	var out bytes.Buffer
	require.NoError(t, run(context.Background(), &out))
	t.Log("\n" + out.String())
	assertAccount(t, out.String())
	assert.Contains(t, out.String(), "server: embedded throwaway PostgreSQL")
}

// TestOrchestratorOnYourServer runs the demo with SIPHON_DSN set, on the
// test server, and checks it leaves no slot behind there.
func TestOrchestratorOnYourServer(t *testing.T) {
	siphontest.Start(t).SkipUnlessDumpClients(t)
	dsn := siphontest.Start(t).NewDatabase(t)
	t.Setenv("SIPHON_DSN", dsn)
	t.Setenv("SIPHON_REPOSITORY_URL", "")
	var out bytes.Buffer
	require.NoError(t, run(context.Background(), &out))
	assertAccount(t, out.String())

	conn, err := pgx.Connect(context.Background(), dsn)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	var slots int
	require.NoError(t, conn.QueryRow(context.Background(), `SELECT count(*) FROM pg_replication_slots
		WHERE slot_name = $1 OR slot_type = 'physical'`, slotName).Scan(&slots))
	assert.Zero(t, slots, "no change-stream or base slot left on the server")
}

func assertAccount(t *testing.T, out string) {
	t.Helper()
	assert.Equal(t, days, strings.Count(out, ": base at "), out)
	assert.Equal(t, days*hours, strings.Count(out, "  link "), out)
	assert.Equal(t, days, strings.Count(out, "verified: OK, 4 links"), out)
	assert.Contains(t, out, "identical to the source then")
	assert.NotContains(t, out, "DIFFERENT")
	assert.Contains(t, out, "retention (keep 1): expired [")
	assert.Contains(t, out, "dropped base slots [siphon_")
	assert.Contains(t, out, "repository: 2 chains")
	assert.Contains(t, out, "repository: 1 chains")
}
