package main

import (
	"bytes"
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/siphondb/siphon/siphontest"
)

// TestRun runs `go run ./examples/test-your-handler` as a newcomer does.
func TestRun(t *testing.T) {
	siphontest.Start(t) // skips or fails like the other tests when no server can be had
	var out bytes.Buffer
	require.NoError(t, run(context.Background(), &out))
	assert.Contains(t, out.String(), "live:     alice 12.25, bob 1.01, carol 5.00")
	assert.Contains(t, out.String(), "replayed: alice 12.25, bob 1.01, carol 5.00 (4 transactions, no server)")
}
