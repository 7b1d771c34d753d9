package siphon

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// What the external tests of apply_warm.go need from the inside.

// TakeKeptApplySessionForTest takes the session the Conn's last apply
// kept (nil if none); the caller closes it.
func (c *Conn) TakeKeptApplySessionForTest(ctx context.Context) *pgx.Conn {
	return c.warm.take(ctx, c.pool)
}

// KeptApplyPIDForTest is the backend PID of the session the Conn's last
// apply kept, 0 if none.
func (c *Conn) KeptApplyPIDForTest() uint32 {
	c.warm.mu.Lock()
	defer c.warm.mu.Unlock()
	if c.warm.conn == nil {
		return 0
	}
	return c.warm.conn.PgConn().PID()
}
