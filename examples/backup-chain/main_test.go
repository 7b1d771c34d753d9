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

// TestBackupChain runs the demo as `go run ./examples/backup-chain` does, on
// an embedded throwaway PostgreSQL (SIPHON_DSN unset).
func TestBackupChain(t *testing.T) {
	siphontest.Start(t) // skips or fails like the other tests when no server can be had
	siphontest.Start(t).SkipUnlessDumpClients(t)
	t.Setenv("SIPHON_DSN", "")
	var out bytes.Buffer
	require.NoError(t, run(context.Background(), &out))
	t.Log("\n" + out.String())
	assertAccount(t, out.String())
	assert.Contains(t, out.String(), "server: embedded throwaway PostgreSQL")
}

// TestBackupChainOnYourServer runs the demo with SIPHON_DSN set, on the test
// server, and checks it leaves no slot behind there: a forgotten base slot
// would pin WAL forever.
func TestBackupChainOnYourServer(t *testing.T) {
	siphontest.Start(t).SkipUnlessDumpClients(t)
	dsn := siphontest.Start(t).NewDatabase(t)
	t.Setenv("SIPHON_DSN", dsn)
	var out bytes.Buffer
	require.NoError(t, run(context.Background(), &out))
	assertAccount(t, out.String())

	conn, err := pgx.Connect(context.Background(), dsn)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	var slots int
	require.NoError(t, conn.QueryRow(context.Background(), `SELECT count(*) FROM pg_replication_slots
		WHERE slot_name = 'siphon_backup_chain' OR slot_type = 'physical'`).Scan(&slots))
	assert.Zero(t, slots, "no change-stream or base slot left on the server")
}

func assertAccount(t *testing.T, out string) {
	t.Helper()
	assert.Equal(t, 2, strings.Count(out, "base.siphon"), "two chains, each with a base backup")
	for _, file := range []string{"chain-0001/incr-0003.jsonl", "chain-0002/incr-0003.jsonl"} {
		assert.Contains(t, out, file)
	}
	assert.Equal(t, 2*incrementals, strings.Count(out, " incremental "), out)
	assert.Contains(t, out, "verify chain-0001: OK, 4 links, contiguous")
	assert.Contains(t, out, "mid-way through incr-0002")
	assert.Contains(t, out, "identical to the source then")
	assert.Contains(t, out, "retention (keep 1): deleted chain-0001 (4 files")
	assert.Contains(t, out, "dropped base slot siphon_")
	assert.NotContains(t, out, "DIFFERENT")
}
