package main

import (
	"bytes"
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/siphondb/siphon/siphontest"
)

func TestMain(m *testing.M) { siphontest.Main(m, siphontest.CheckLeaks()) }

// TestDemo runs `go run ./examples/cdc-jsonl` as a newcomer does.
func TestDemo(t *testing.T) {
	siphontest.Start(t) // skips or fails like the other tests when no server can be had
	var out bytes.Buffer
	cfg := config{dir: t.TempDir(), maxBytes: 4 << 10, slot: "cdc_jsonl_test"}
	require.NoError(t, demo(context.Background(), cfg, &out))
	t.Log("\n" + out.String())
	assert.Contains(t, out.String(), "run 2 (resumes from the files)")
	assert.Contains(t, out.String(), "hold all 300 rows, each exactly once")
}
