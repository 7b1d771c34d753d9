package siphontest_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/siphondb/siphon/siphontest"
)

// TestSkipUnlessRelease checks that a test asking for the server's release
// runs, and one asking for the next release is skipped with a message
// naming both.
func TestSkipUnlessRelease(t *testing.T) {
	t.Parallel()
	srv := siphontest.Start(t)
	num, err := srv.VersionNum(context.Background())
	require.NoError(t, err)
	release := num / 10000
	for major, wantSkipped := range map[int]bool{release: false, release + 1: true} {
		var skipped bool
		t.Run(fmt.Sprintf("needs %d", major), func(t *testing.T) {
			defer func() { skipped = t.Skipped() }()
			srv.SkipUnlessRelease(t, major)
		})
		assert.Equal(t, wantSkipped, skipped, "needs %d on a %d server", major, release)
	}
}
