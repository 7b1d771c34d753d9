package siphon

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestCatchUpChunkSpans: by default a chunk spans at least a quarter of
// the WAL left, between 2 and 16 MiB: a small backlog is read in small
// chunks (its first rows come soon), a large one in large chunks (fewer
// calls), and the last chunks of a large one get smaller again. Settings
// without a share keep their least span whatever is left.
func TestCatchUpChunkSpans(t *testing.T) {
	t.Parallel()
	const mib = 1 << 20
	d := catchUpSettings{}.orDefaults()
	for left, want := range map[int64]int64{
		0: 2 * mib, 1 * mib: 2 * mib, 8 * mib: 2 * mib, 10 * mib: 10 * mib / 4,
		40 * mib: 10 * mib, 64 * mib: 16 * mib, 1 << 40: 16 * mib,
	} {
		assert.Equal(t, want, d.leastSpan(left), "%d bytes left", left)
	}
	fixed := catchUpSettings{set: true, minChunk: 5 * mib, fullChunk: 16 * mib}
	assert.Equal(t, int64(5*mib), fixed.leastSpan(1<<40))
	small := catchUpSettings{set: true, minChunk: 32 * mib, leftShare: 4, fullChunk: 16 * mib}
	assert.Equal(t, int64(32*mib), small.leastSpan(1<<40), "the least span is never below minChunk")
}
