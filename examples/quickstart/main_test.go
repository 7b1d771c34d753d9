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

// TestQuickstart runs the tour as `go run ./examples/quickstart` does, on an
// embedded throwaway PostgreSQL (SIPHON_DSN unset).
func TestQuickstart(t *testing.T) {
	siphontest.Start(t) // skips or fails like the other tests when no server can be had
	siphontest.Start(t).SkipUnlessDumpClients(t)
	t.Setenv("SIPHON_DSN", "")
	var out bytes.Buffer
	require.NoError(t, run(context.Background(), &out))
	t.Log("\n" + out.String())
	assertTour(t, out.String())
	assert.Contains(t, out.String(), "source: embedded throwaway PostgreSQL")
}

// TestQuickstartOnYourDatabase runs the tour with SIPHON_DSN set, in a
// database of the test server, and checks it leaves nothing behind there.
func TestQuickstartOnYourDatabase(t *testing.T) {
	siphontest.Start(t).SkipUnlessDumpClients(t)
	dsn := siphontest.Start(t).NewDatabase(t)
	t.Setenv("SIPHON_DSN", dsn)
	var out bytes.Buffer
	require.NoError(t, run(context.Background(), &out))
	assertTour(t, out.String())

	var leftovers int
	conn := mustConnect(t, dsn)
	require.NoError(t, conn.QueryRow(context.Background(), `SELECT
		(SELECT count(*) FROM pg_replication_slots WHERE slot_name LIKE 'siphon_quickstart%') +
		(SELECT count(*) FROM pg_publication WHERE pubname = 'siphon_quickstart') +
		(SELECT count(*) FROM pg_namespace WHERE nspname = 'siphon_quickstart')`).Scan(&leftovers))
	assert.Zero(t, leftovers, "no slot, publication or schema left in the user's database")
}

func assertTour(t *testing.T, out string) {
	t.Helper()
	for _, step := range []string{"1. snapshot", "3. backup", "verified OK", "5. stream", "6. incremental", "7. apply"} {
		assert.Contains(t, out, step)
	}
	assert.Contains(t, out, "5. stream       from")
	assert.Contains(t, out, "320 transactions")
	assert.Equal(t, 2, strings.Count(out, "identical to the source"), out)
}

func mustConnect(t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), dsn)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}
