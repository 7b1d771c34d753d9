package siphon

import (
	"context"
	"sync"

	"github.com/jackc/pgx/v5"
)

// A backend that has not run before costs more per row than one that has:
// the same COPY of 200k rows took 18-19% more of the server's CPU per row
// on a new session than on one that had loaded rows before (docs/performance.md).
// So the Conn keeps the session of an apply that ended cleanly in its own
// database, reset as a new session is, for the next one: a chain of
// incrementals applied one file after the other, or Replicate started
// again, applies on a warm backend.

// warmApply holds at most one reset apply session of the Conn's database.
type warmApply struct {
	mu     sync.Mutex
	conn   *pgx.Conn
	closed bool // the Conn closed: nothing is kept any more
}

// take returns the kept session, once it answered, or nil.
func (w *warmApply) take(ctx context.Context, q querier) *pgx.Conn {
	w.mu.Lock()
	conn := w.conn
	w.conn = nil
	w.mu.Unlock()
	if conn == nil {
		return nil
	}
	if err := conn.Ping(ctx); err != nil { // ended meanwhile (idle_session_timeout, a terminated backend)
		closeAndEnd(q, conn.PgConn())
		return nil
	}
	return conn
}

// keep resets conn as a new session is (DISCARD ALL: settings back to the
// session's start, its role, prepared statements, temporary tables,
// advisory locks) and keeps it, unless it is in a transaction, one is
// kept already, or the Conn closed. It reports whether it kept conn; the
// caller closes a session it did not.
func (w *warmApply) keep(ctx context.Context, conn *pgx.Conn) bool {
	if conn.IsClosed() || conn.PgConn().TxStatus() != 'I' {
		return false
	}
	if _, err := conn.PgConn().Exec(ctx, "DISCARD ALL").ReadAll(); err != nil {
		return false
	}
	if err := conn.DeallocateAll(ctx); err != nil { // pgx's statement caches, which DISCARD ALL emptied on the server
		return false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed || w.conn != nil {
		return false
	}
	w.conn = conn
	return true
}

// release closes the kept session, waiting, asking q, until its backend is
// gone, and keeps nothing from then on.
func (w *warmApply) release(q querier) {
	w.mu.Lock()
	conn := w.conn
	w.conn, w.closed = nil, true
	w.mu.Unlock()
	if conn != nil {
		closeAndEnd(q, conn.PgConn())
	}
}
