// Package coalesce reads a socket that brings many small messages (a
// walsender's, one per row) in few system calls; see Conn.
package coalesce

import (
	"errors"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

const (
	// coalesceBuffer is how much one socket read may take.
	coalesceBuffer = 64 << 10
	// coalesceLowWater is the receive low-water mark while the stream is
	// busy: the kernel wakes the reader once this much has arrived.
	coalesceLowWater = 16 << 10
	// coalesceWait bounds how long data below the low-water mark waits.
	coalesceWait = time.Millisecond
	// coalesceBusy: reads closer together than this mean a busy stream.
	coalesceBusy = 500 * time.Microsecond
)

// Conn is a socket read so that a busy stream (a replication session)
// costs few system calls. The walsender writes each message on its own, so
// a reader that keeps up wakes and reads once per row: that is most of a
// client's CPU per row, and on a small machine it is taken from the
// walsender. While reads come close together, Conn raises the
// socket's receive low-water mark (SO_RCVLOWAT, where the platform has it)
// so the kernel wakes the reader only once 16 KiB have arrived, and reads up
// to 64 KiB at once. Less than that is read after at most coalesceWait,
// and the low-water mark then drops back to one byte until the stream is
// busy again, so an idle stream is read as promptly as before.
//
// It also tells its reader when the data read so far is used up
// (SetBeforeRead), so that what was decoded from it is handed on in batches as
// large as what arrived together.
//
// Reads are taken one at a time: pgconn, after a failed read, drains the
// socket from a goroutine of its own while its background reader's read
// may still be under way. Deadlines, which another goroutine may set to
// wake the reader, are kept as the outer bound of every read.
type Conn struct {
	net.Conn
	// reading is held for the whole of a Read: the fields below it, to
	// beforeRead, are the reader's.
	reading  sync.Mutex
	raw      syscall.RawConn // nil when the low-water mark cannot be set
	buf      []byte
	r, w     int
	lowWater bool
	lastRead time.Time
	// beforeRead, when set, runs before each read from the socket (see
	// SetBeforeRead). Atomic: the stream's reader unsets it as it ends
	// while pgconn, after a failed read, may drain the socket from a
	// goroutine of its own.
	beforeRead atomic.Pointer[func() error]

	mu    sync.Mutex
	outer time.Time // the deadline set from outside
}

// New wraps conn; the low-water mark is used only on a TCP connection of
// a platform that has it.
func New(conn net.Conn) *Conn {
	c := &Conn{Conn: conn, buf: make([]byte, coalesceBuffer)}
	if tcp, ok := conn.(*net.TCPConn); ok && lowWaterSupported {
		c.raw, _ = tcp.SyscallConn()
	}
	return c
}

// SetBeforeRead sets fn to run before each read from the socket (when
// everything read so far was consumed), nil for none; an error fn returns
// is the read's. It may be called while another goroutine reads.
func (c *Conn) SetBeforeRead(fn func() error) {
	if fn == nil {
		c.beforeRead.Store(nil)
		return
	}
	c.beforeRead.Store(&fn)
}

// SetReadDeadline sets the outer bound of every read.
func (c *Conn) SetReadDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.outer = t
	return c.Conn.SetReadDeadline(t)
}

// SetDeadline sets the outer bound of every read, and of writes.
func (c *Conn) SetDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.outer = t
	return c.Conn.SetDeadline(t)
}

// shortDeadline bounds the next read by coalesceWait within the outer
// deadline.
func (c *Conn) shortDeadline() {
	c.mu.Lock()
	defer c.mu.Unlock()
	d := time.Now().Add(coalesceWait)
	if !c.outer.IsZero() && c.outer.Before(d) {
		d = c.outer
	}
	c.Conn.SetReadDeadline(d)
}

// slowedDown handles a read that timed out while the low-water mark was up:
// unless the outer deadline passed (then the timeout is the caller's), it
// drops the mark and restores the outer deadline, and reports true.
func (c *Conn) slowedDown() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.outer.IsZero() && !time.Now().Before(c.outer) {
		return false
	}
	// Should dropping the mark fail, reads go on in short waits.
	if c.setLowWater(false); !c.lowWater {
		c.Conn.SetReadDeadline(c.outer)
	}
	return true
}

// Read reads what was buffered, or else from the socket into the buffer.
// A Read called while another is under way waits for it.
func (c *Conn) Read(b []byte) (int, error) {
	c.reading.Lock()
	defer c.reading.Unlock()
	if c.r < c.w {
		n := copy(b, c.buf[c.r:c.w])
		c.r += n
		return n, nil
	}
	c.r, c.w = 0, 0
	if before := c.beforeRead.Load(); before != nil {
		if err := (*before)(); err != nil {
			return 0, err
		}
	}
	for {
		if c.lowWater {
			c.shortDeadline()
		}
		n, err := c.Conn.Read(c.buf)
		if c.lowWater && errors.Is(err, os.ErrDeadlineExceeded) && c.slowedDown() {
			// Less than the low-water mark came within coalesceWait: read
			// what there is.
			continue
		}
		now := time.Now()
		if n > 0 && !c.lowWater && now.Sub(c.lastRead) < coalesceBusy {
			c.setLowWater(true)
		}
		c.lastRead = now
		c.w = n
		c.r = copy(b, c.buf[:n])
		return c.r, err
	}
}

func (c *Conn) setLowWater(on bool) {
	if c.raw == nil {
		return
	}
	v := 1
	if on {
		v = coalesceLowWater
	}
	var err error
	if cerr := c.raw.Control(func(fd uintptr) { err = setLowWater(fd, v) }); cerr != nil || err != nil {
		if on {
			c.raw = nil // leave the socket at its default from now on
		}
		return
	}
	c.lowWater = on
}
