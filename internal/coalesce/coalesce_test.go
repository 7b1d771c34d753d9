package coalesce

import (
	"errors"
	"io"
	"net"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// tcpPair returns the two ends of a loopback TCP connection, the reading
// end wrapped in a Conn.
func tcpPair(t *testing.T) (reader *Conn, writer net.Conn) {
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
	return New(dialed), writer
}

// TestCoalescingConnBurstThenTrickle: messages that arrive one by one, a
// few microseconds apart, are read many at a time (the low-water mark is
// up), and a lone message after them is still read at once.
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
			// A walsender sends each row as it decodes it, a few
			// microseconds apart.
			for began := time.Now(); time.Since(began) < 20*time.Microsecond; {
			}
		}
	}()
	got, reads := 0, 0
	raised := false
	buf := make([]byte, 8192)
	for got < msgs*size {
		n, err := r.Read(buf)
		require.NoError(t, err)
		got += n
		reads++
		raised = raised || r.lowWater
	}
	t.Logf("%d bytes in %d reads", got, reads)
	if lowWaterSupported {
		assert.True(t, raised, "the low-water mark went up while the messages came close together")
		assert.Less(t, reads, msgs/4, "the messages were read several at a time")
	}

	// A lone small message after the burst is read promptly, although it is
	// below the low-water mark if that is still up: in about coalesceWait,
	// where a read that waited for the mark would wait forever (nothing
	// more comes). The bound leaves room for a loaded machine.
	began := time.Now()
	_, err := w.Write([]byte("tail"))
	require.NoError(t, err)
	n, err := io.ReadFull(r, buf[:4])
	require.NoError(t, err)
	assert.Equal(t, "tail", string(buf[:n]))
	assert.Less(t, time.Since(began), time.Minute, "read, not left waiting for a mark nothing reaches")
}

// TestCoalescingConnDeadlineWakesReader: a read blocked on the socket
// returns when another goroutine moves the deadline to now, as net.Conn's
// own reads do, although Conn sets short deadlines of its own.
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
	waitBlockedInRead(t)
	require.NoError(t, r.SetReadDeadline(time.Now()))
	select {
	case err := <-done:
		assert.True(t, errors.Is(err, os.ErrDeadlineExceeded), "got %v", err)
	case <-time.After(time.Minute):
		t.Fatal("the read was not woken by the deadline")
	}
}

// waitBlockedInRead waits until a goroutine is blocked on the network
// inside Conn.Read.
func waitBlockedInRead(t *testing.T) {
	t.Helper()
	stacks := make([]byte, 1<<20)
	require.Eventually(t, func() bool {
		n := runtime.Stack(stacks, true)
		for _, g := range strings.Split(string(stacks[:n]), "\n\n") {
			if strings.Contains(g, "[IO wait") && strings.Contains(g, "(*Conn).Read") {
				return true
			}
		}
		return false
	}, time.Minute, time.Millisecond, "the reader blocks on the socket")
}

// TestCoalescingConnReadsFromTwoGoroutines: pgconn, after a failed read,
// drains the socket in a goroutine of its own (io.Copy to io.Discard)
// while its background reader may still be reading; each byte is read
// once, by one of them, and the race detector finds nothing.
func TestCoalescingConnReadsFromTwoGoroutines(t *testing.T) {
	t.Parallel()
	r, w := tcpPair(t)
	const msgs, size = 4000, 100
	go func() {
		msg := make([]byte, size)
		for range msgs {
			if _, err := w.Write(msg); err != nil {
				return
			}
		}
		w.Close()
	}()
	counts := make(chan int64, 2)
	for range 2 {
		go func() {
			n, _ := io.Copy(io.Discard, r)
			counts <- n
		}()
	}
	assert.Equal(t, int64(msgs*size), <-counts+<-counts)
}
