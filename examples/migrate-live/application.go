package main

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// application is the source's application: it keeps committing transfers
// (an insert and two updates each), and now and then opens an account and
// deletes an old transfer, until stopped.
type application struct {
	cancel  context.CancelFunc
	done    chan error
	commits int // once stopped
}

func startApplication(ctx context.Context, dsn string) *application {
	ctx, cancel := context.WithCancel(ctx)
	a := &application{cancel: cancel, done: make(chan error, 1)}
	go func() { a.done <- a.write(ctx, dsn) }()
	return a
}

// stop stops the writes (a transaction in progress is committed first) and
// returns the first error they met.
func (a *application) stop() error {
	a.cancel()
	return <-a.done
}

func (a *application) write(ctx context.Context, dsn string) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	pace := time.NewTicker(2 * time.Millisecond)
	defer pace.Stop()
	for k := 1; ; k++ {
		from, to := 1+k*13%10000, 1+k*29%10000
		batch := &pgx.Batch{}
		batch.Queue("BEGIN")
		batch.Queue("INSERT INTO transfers (from_id, to_id, amount) VALUES ($1, $2, $3)", from, to, k%100)
		batch.Queue("UPDATE accounts SET balance = balance - $2 WHERE id = $1", from, k%100)
		batch.Queue("UPDATE accounts SET balance = balance + $2 WHERE id = $1", to, k%100)
		if k%50 == 0 {
			batch.Queue("INSERT INTO accounts VALUES ($1, $2, 0)", 10000+k, fmt.Sprintf("new owner %d", k))
			batch.Queue("DELETE FROM transfers WHERE id = $1", k)
		}
		batch.Queue("COMMIT")
		// Not cancelled with ctx: a stop takes effect between transactions.
		if err := conn.SendBatch(context.Background(), batch).Close(); err != nil {
			return fmt.Errorf("application, transaction %d: %w", k, err)
		}
		a.commits = k
		select {
		case <-ctx.Done():
			return nil
		case <-pace.C:
		}
	}
}
