package siphon

import (
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// tcpPair returns the two ends of a loopback TCP connection, the reading
// end wrapped in a coalescingConn.
func tcpPair(t *testing.T) (reader *coalescingConn, writer net.Conn) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := l.Accept()
		accepted <- c
	}()
	dialed, err := net.Dial("tcp", l.Addr().String())
	require.NoError(t, err)
	writer = <-accepted
	require.NotNil(t, writer)
	t.Cleanup(func() { dialed.Close(); writer.Close() })
	return newCoalescingConn(dialed), writer
}

func TestCoalescingConnBurstThenTrickle(t *testing.T) {
	t.Parallel()
	r, w := tcpPair(t)
	const msgs, size = 2000, 100
	go func() {
		msg := make([]byte, size)
		for range msgs {
			if _, err := w.Write(msg); err != nil {
				return
			}
		}
	}()
	got, reads := 0, 0
	buf := make([]byte, 8192)
	for got < msgs*size {
		n, err := r.Read(buf)
		require.NoError(t, err)
		got += n
		reads++
	}
	t.Logf("%d bytes in %d reads", got, reads)

	// A lone small message after the burst is read promptly, although it is
	// below the low-water mark if that is still up.
	began := time.Now()
	_, err := w.Write([]byte("tail"))
	require.NoError(t, err)
	n, err := io.ReadFull(r, buf[:4])
	require.NoError(t, err)
	assert.Equal(t, "tail", string(buf[:n]))
	assert.Less(t, time.Since(began), 500*time.Millisecond)
}

func TestCoalescingConnDeadlineWakesReader(t *testing.T) {
	t.Parallel()
	r, w := tcpPair(t)
	// Make it busy, so the low-water mark is up when the reader blocks.
	msg := make([]byte, 100)
	buf := make([]byte, 8192)
	for range 20 {
		_, err := w.Write(msg)
		require.NoError(t, err)
		_, err = io.ReadFull(r, buf[:100])
		require.NoError(t, err)
	}
	require.NoError(t, r.SetReadDeadline(time.Now().Add(time.Hour)))
	done := make(chan error, 1)
	go func() {
		_, err := r.Read(buf)
		done <- err
	}()
	// Another goroutine expires the deadline: the blocked read returns.
	require.NoError(t, r.SetReadDeadline(time.Now()))
	select {
	case err := <-done:
		assert.True(t, errors.Is(err, os.ErrDeadlineExceeded), "got %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("the read was not woken by the deadline")
	}
}
