package siphon

import (
	"io"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// blockingReader blocks each Read until it is released, and says when
// the first one started.
type blockingReader struct {
	started, release chan struct{}
	reads            atomic.Int64
}

func (b *blockingReader) Read(p []byte) (int, error) {
	select {
	case b.started <- struct{}{}:
	default:
	}
	<-b.release
	b.reads.Add(1)
	return copy(p, "x"), nil
}

// TestStoppableReaderWaitsForTheReadInProgress: stop returns only once a
// Read in progress (pgconn's goroutine, which CopyFrom may leave running)
// has returned, and nothing is read after it.
func TestStoppableReaderWaitsForTheReadInProgress(t *testing.T) {
	t.Parallel()
	inner := &blockingReader{started: make(chan struct{}, 1), release: make(chan struct{})}
	g := &stoppableReader{r: inner}
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 8)
		for {
			if _, err := g.Read(buf); err != nil {
				return
			}
		}
	}()
	<-inner.started
	stopped := make(chan struct{})
	go func() { g.stop(); close(stopped) }()
	select {
	case <-stopped:
		t.Fatal("stop returned while a Read was in progress")
	case <-time.After(50 * time.Millisecond):
	}
	close(inner.release)
	<-stopped
	read := inner.reads.Load()
	<-done
	assert.Equal(t, read, inner.reads.Load(), "nothing read after stop")
	n, err := g.Read(make([]byte, 1))
	require.ErrorIs(t, err, io.EOF)
	assert.Zero(t, n)
}
