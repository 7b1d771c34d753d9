package siphon

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Closing sessions.
//
// A call that returns has let go of what its sessions held on the server:
// a slot, a replication origin, an advisory lock, an exported snapshot. A
// closed socket alone does not say so: the backend notices only when it
// next reads or writes, and a command it is running (a COPY, a walsender
// waiting for a transaction to end) goes on until then. So every session
// siphon opens is closed by one policy, on a context of its own bounded by
// closeTimeout so that cleaning up runs even when the caller's ended:
// close the connection, wait until pgconn has finished with it (after a
// cancelled command it sends a cancel request and closes the socket from a
// goroutine of its own), and, where what the backend holds matters, wait
// until the backend has left pg_stat_activity (which it does after it has
// released its slot and its origin), terminating it when it does not go by
// itself.

// closeTimeout bounds closing sessions and cleaning up after a failure.
const closeTimeout = 2 * time.Second

// endGrace is how long a backend whose client closed is given to exit
// before it is terminated: an idle one exits within milliseconds.
const endGrace = 20 * time.Millisecond

// cleanupContext is the context cleaning up runs on: ctx's values without
// its cancellation, bounded by closeTimeout.
func cleanupContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), closeTimeout)
}

// closeConn closes conn and waits (as long as ctx allows) until pgconn has
// finished with it.
func closeConn(ctx context.Context, conn *pgconn.PgConn) error {
	err := conn.Close(ctx)
	select {
	case <-conn.CleanupDone():
	case <-ctx.Done():
	}
	return err
}

// closeSession closes conn on a cleanup context of its own.
func closeSession(conn *pgconn.PgConn) error {
	ctx, cancel := cleanupContext(context.Background())
	defer cancel()
	return closeConn(ctx, conn)
}

// closeAndEnd closes conn and waits until its backend is gone, asking q (a
// session of its own) and terminating the backend past endGrace. It
// returns closing's error.
func closeAndEnd(q querier, conn *pgconn.PgConn) error {
	ctx, cancel := cleanupContext(context.Background())
	defer cancel()
	pid := conn.PID()
	err := closeConn(ctx, conn)
	endBackend(ctx, q, pid)
	return err
}

// endBackend waits until the backend pid has left pg_stat_activity,
// terminating it once past endGrace, for as long as ctx allows.
func endBackend(ctx context.Context, q querier, pid uint32) {
	terminated := false
	started := time.Now()
	for pause := time.Millisecond; ; pause = min(2*pause, 20*time.Millisecond) {
		var there bool
		err := q.QueryRow(ctx, "SELECT EXISTS (SELECT FROM pg_stat_activity WHERE pid = $1)", int64(pid)).Scan(&there)
		if err != nil || !there {
			return
		}
		if !terminated && time.Since(started) > endGrace {
			q.Exec(ctx, "SELECT pg_catalog.pg_terminate_backend($1)", int64(pid))
			terminated = true
		}
		if sleepCtx(ctx, pause) != nil {
			return
		}
	}
}

// querier is what *pgx.Conn and *pgxpool.Pool have in common.
type querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
