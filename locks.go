package siphon

import (
	"context"
	"fmt"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/siphondb/siphon/canonical"
	"github.com/siphondb/siphon/internal/pgerr"
	"github.com/siphondb/siphon/internal/sqltext"
)

// Table lock modes siphon takes.
const (
	accessShare          = "ACCESS SHARE"
	shareUpdateExclusive = "SHARE UPDATE EXCLUSIVE"
	accessExclusive      = "ACCESS EXCLUSIVE"
)

// tableLock is a lock on a table, in mode, on the table alone (only) or
// on its partitions and children too.
type tableLock struct {
	table canonical.TableName
	mode  string
	only  bool
}

// lockingSession is a session or transaction that takes locks: *pgx.Conn
// or pgx.Tx.
type lockingSession interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// tableLockError is a failure to lock table.
type tableLockError struct {
	table canonical.TableName
	err   error
}

func (e *tableLockError) Error() string { return fmt.Sprintf("lock %s: %v", e.table, e.err) }
func (e *tableLockError) Unwrap() error { return e.err }

// lockTables takes locks in s's transaction, for the rest of it, without
// ever waiting for one while it holds another: a transaction of the
// user's that holds one of the tables and then waits for another (TRUNCATE
// ... CASCADE locks a table, then its partitions, then the tables that
// reference it) would otherwise deadlock with siphon, and the server would
// end one of the two. It asks for all of them without waiting (NOWAIT),
// in a savepoint; when another session holds or awaits a conflicting lock
// on one, it rolls back to the savepoint (which lets go of the rest), waits
// for that one alone, and asks again. The wait ends with ctx or at the
// session's lock_timeout, with its error. s must hold no lock that another
// session may wait for when it is called: those are held while it waits.
func lockTables(ctx context.Context, s lockingSession, locks []tableLock) error {
	if len(locks) == 0 {
		return nil
	}
	awaited := -1
	for {
		busy, err := tryLockTables(ctx, s, locks, awaited)
		if err != nil || busy < 0 {
			return err
		}
		if _, err := s.Exec(ctx, "ROLLBACK TO SAVEPOINT siphon_locks"); err != nil {
			return fmt.Errorf("release locks: %w", err)
		}
		awaited = busy
	}
}

// tryLockTables takes locks in a savepoint, in one round trip: it waits
// for locks[awaited] (when awaited is not -1) and takes the others only if
// no session holds or awaits a conflicting lock. It returns the index of
// the first lock it could not take, or -1 when it holds all of them.
func tryLockTables(ctx context.Context, s lockingSession, locks []tableLock, awaited int) (busy int, err error) {
	order := make([]int, 0, len(locks))
	if awaited >= 0 {
		order = append(order, awaited)
	}
	for i := range locks {
		if i != awaited {
			order = append(order, i)
		}
	}
	batch := &pgx.Batch{}
	batch.Queue("SAVEPOINT siphon_locks")
	for _, i := range order {
		l := locks[i]
		stmt := "LOCK TABLE "
		if l.only {
			stmt += "ONLY "
		}
		stmt += sqltext.Name(l.table.Schema, l.table.Name) + " IN " + l.mode + " MODE"
		if i != awaited {
			stmt += " NOWAIT"
		}
		batch.Queue(stmt)
	}
	batch.Queue("RELEASE SAVEPOINT siphon_locks")
	res := s.SendBatch(ctx, batch)
	defer res.Close()
	if _, err := res.Exec(); err != nil {
		return -1, fmt.Errorf("lock tables: %w", err)
	}
	for _, i := range order {
		_, err := res.Exec()
		switch {
		case err == nil:
		case pgerr.Is(err, pgerrcode.LockNotAvailable) && i != awaited:
			return i, nil
		default:
			return -1, &tableLockError{table: locks[i].table, err: err}
		}
	}
	if _, err := res.Exec(); err != nil {
		return -1, fmt.Errorf("lock tables: %w", err)
	}
	return -1, res.Close()
}
