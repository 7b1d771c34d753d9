package siphon_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// backgroundWorkload commits a transaction on a database every tick, in the
// background, until stopped. next makes each transaction and says how many
// events it inserts. When the server goes away (a restart), a workload
// that may reconnect does so on the next ticks; otherwise, as on any other
// error, it stops with that error.
type backgroundWorkload struct {
	dsn       string
	every     time.Duration
	reconnect bool
	next      func(rng *rand.Rand) (sql string, events int64)

	halt, done chan struct{}
	err        error
	// Read after stop.
	committed, failed, reconnects int
	events                        int64 // inserted by the committed transactions
	unsureEvents                  int64 // by those whose COMMIT got no answer (committed or not)
}

// startWorkload starts a workload on dsn that commits next's transactions
// every tick; it is stopped when the test ends, if not before.
func startWorkload(t *testing.T, dsn string, every time.Duration, reconnect bool,
	next func(rng *rand.Rand) (string, int64)) *backgroundWorkload {
	t.Helper()
	w := &backgroundWorkload{dsn: dsn, every: every, reconnect: reconnect, next: next,
		halt: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		w.err = w.run()
	}()
	t.Cleanup(func() { _ = w.stop() })
	return w
}

// stop ends the workload after its transaction in progress and returns its
// error. It may be called twice.
func (w *backgroundWorkload) stop() error {
	select {
	case <-w.halt:
	default:
		close(w.halt)
	}
	<-w.done
	return w.err
}

func (w *backgroundWorkload) run() error {
	rng := rand.New(rand.NewPCG(rand.Uint64(), 1))
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			conn.Close(context.Background())
		}
	}()
	tick := time.NewTicker(w.every)
	defer tick.Stop()
	for {
		select {
		case <-w.halt:
			return nil
		case <-tick.C:
		}
		if conn == nil {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			c, err := pgx.Connect(ctx, w.dsn)
			cancel()
			switch {
			case err == nil:
				conn = c
				w.reconnects++
			case w.reconnect:
				continue // restarting: try again on the next tick
			default:
				return fmt.Errorf("workload: %w", err)
			}
		}
		sql, events := w.next(rng)
		if _, err := conn.Exec(context.Background(), sql); err != nil {
			if !w.reconnect || !conn.IsClosed() {
				return fmt.Errorf("workload: %w", err)
			}
			conn, w.failed, w.unsureEvents = nil, w.failed+1, w.unsureEvents+events
			continue
		}
		w.committed++
		w.events += events
	}
}

// faultTransactions makes the fault tests' transactions: a few events
// inserted into fault_events (now and then many), and an account of
// fault_accounts opened, closed, or a transfer between two. Sequence
// numbers and account ids are never used twice, even when a transaction
// may not have committed.
type faultTransactions struct {
	seq, nextID int64
	ids         []int64
}

// next returns the next transaction and the events it inserts.
func (f *faultTransactions) next(rng *rand.Rand) (string, int64) {
	var sql strings.Builder
	sql.WriteString("BEGIN;")
	events := 1 + rng.Int64N(4)
	if rng.IntN(20) == 0 {
		events = 50 + rng.Int64N(200) // now and then a larger transaction
	}
	fmt.Fprintf(&sql, "INSERT INTO fault_events SELECT s, %d, md5(s::text) FROM generate_series(%d, %d) s;",
		rng.IntN(8), f.seq+1, f.seq+events)
	f.seq += events
	switch op := rng.IntN(4); {
	case op == 0 || len(f.ids) < 5:
		f.nextID++
		f.ids = append(f.ids, f.nextID)
		fmt.Fprintf(&sql, "INSERT INTO fault_accounts VALUES (%d, %d, 'opened');", f.nextID, rng.IntN(1000))
	case op == 1:
		i := rng.IntN(len(f.ids))
		fmt.Fprintf(&sql, "DELETE FROM fault_accounts WHERE id = %d;", f.ids[i])
		f.ids = append(f.ids[:i], f.ids[i+1:]...)
	default:
		a, b := f.ids[rng.IntN(len(f.ids))], f.ids[rng.IntN(len(f.ids))]
		amount := rng.IntN(100)
		fmt.Fprintf(&sql, "UPDATE fault_accounts SET balance = balance - %d, note = 'sent %d' WHERE id = %d;", amount, f.seq, a)
		fmt.Fprintf(&sql, "UPDATE fault_accounts SET balance = balance + %d, note = 'got %d' WHERE id = %d;", amount, f.seq, b)
	}
	sql.WriteString("COMMIT")
	return sql.String(), events
}
