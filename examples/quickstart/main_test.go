package main

import (
	"bytes"
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/siphondb/siphon/siphontest"
)

// TestQuickstart runs the tour as `go run ./examples/quickstart` does, on the
// test server.
func TestQuickstart(t *testing.T) {
	srv := siphontest.Start(t)
	t.Setenv("SIPHON_DSN", srv.NewDatabase(t))
	var out bytes.Buffer
	require.NoError(t, run(context.Background(), &out))
	t.Log("\n" + out.String())
	assert.Contains(t, out.String(), "schema: 2 tables")
	assert.Contains(t, out.String(), "siphon_quickstart.orders: 5 columns, primary key [id]")
}

// TestQuickstartEmbedded runs the tour with SIPHON_DSN unset, as a newcomer
// does: on an embedded throwaway PostgreSQL.
func TestQuickstartEmbedded(t *testing.T) {
	siphontest.Start(t) // skips or fails like the other tests when no server can be had
	t.Setenv("SIPHON_DSN", "")
	var out bytes.Buffer
	require.NoError(t, run(context.Background(), &out))
	assert.Contains(t, out.String(), "source: embedded throwaway PostgreSQL")
	assert.Contains(t, out.String(), "schema: 2 tables")
}
