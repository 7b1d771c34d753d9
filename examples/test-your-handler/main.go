// Command test-your-handler shows how to test replication logic written on
// siphon: the handler in handler.go is tested in handler_test.go against a
// recorded change stream with no server at all, with hand-made changes,
// and live against a throwaway PostgreSQL from siphontest. Copy
// handler_test.go as a start.
//
//	go test ./examples/test-your-handler          # the tests
//	go run ./examples/test-your-handler           # records a stream live and replays it
//	SIPHON_RECORD=1 go test -run TestRevenueFromRecording ./examples/test-your-handler   # records testdata/orders.jsonl again
package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/siphondb/siphon"
	"github.com/siphondb/siphon/canonical"
	"github.com/siphondb/siphon/siphontest"
)

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := run(ctx, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "test-your-handler:", err)
		os.Exit(1)
	}
}

// run streams the demo workload's changes on an embedded PostgreSQL into
// the handler, recording them as it goes, then replays the recording into
// a new handler, with no server: both end with the same totals.
func run(ctx context.Context, out io.Writer) error {
	srv, err := siphontest.Launch(ctx)
	if err != nil {
		return fmt.Errorf("start an embedded PostgreSQL: %w", err)
	}
	defer srv.Close()
	dsn, drop, err := srv.CreateDatabase(ctx)
	if err != nil {
		return err
	}
	defer drop(context.Background())

	live := NewRevenue()
	var recording bytes.Buffer
	if err := recordWorkload(ctx, dsn, "handler_demo", &recording, live.Handle); err != nil {
		return err
	}
	fmt.Fprintf(out, "live:     %s\n", totals(live))

	replayed := NewRevenue()
	transactions := 0
	_, err = canonical.Replay(ctx, &recording, 0, func(ch canonical.Change) error {
		if ch.Op == canonical.OpCommit {
			transactions++
		}
		return replayed.Handle(ch)
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "replayed: %s (%d transactions, no server)\n", totals(replayed), transactions)
	return nil
}

func totals(r *Revenue) string {
	return fmt.Sprintf("alice %s, bob %s, carol %s", r.Total("alice"), r.Total("bob"), r.Total("carol"))
}

// workload is the demo's transactions on shop.orders.
var workload = []string{
	`INSERT INTO shop.orders VALUES (1, 'alice', 10.50), (2, 'bob', 99.99), (3, 'alice', 0.25)`,
	`UPDATE shop.orders SET total = 12.00 WHERE id = 1`,
	`INSERT INTO shop.orders VALUES (4, 'carol', 5.00)`,
	`DELETE FROM shop.orders WHERE id = 2; INSERT INTO shop.orders VALUES (5, 'bob', 1.01)`, // one transaction
}

// createOrders creates table shop.orders.
func createOrders(ctx context.Context, conn *pgx.Conn) error {
	_, err := conn.Exec(ctx, `CREATE SCHEMA shop;
		CREATE TABLE shop.orders (id int PRIMARY KEY, customer text NOT NULL, total numeric(12,2) NOT NULL);
		ALTER TABLE shop.orders REPLICA IDENTITY FULL`)
	return err
}

// recordWorkload creates shop.orders, runs the workload, and streams its
// changes into handle through a canonical.Recorder that writes them to w:
// the handler receives the live stream, and w its recording.
func recordWorkload(ctx context.Context, dsn, slot string, w io.Writer, handle func(canonical.Change) error) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	if err := createOrders(ctx, conn); err != nil {
		return err
	}
	c, err := siphon.Connect(ctx, dsn, siphon.WithSlot(slot))
	if err != nil {
		return err
	}
	defer c.Close()
	from, err := c.CurrentPosition(ctx)
	if err != nil {
		return err
	}
	rec := canonical.NewRecorder(w, from)
	if err := streamWorkload(ctx, c, conn, from, rec.Tee(handle)); err != nil {
		return err
	}
	return rec.Close()
}

// streamWorkload runs the workload and streams the changes committed after
// from into emit, until the workload's last commit.
func streamWorkload(ctx context.Context, c *siphon.Conn, conn *pgx.Conn, from canonical.Position, emit func(canonical.Change) error) error {
	for _, sql := range workload {
		if _, err := conn.Exec(ctx, sql); err != nil {
			return err
		}
	}
	// StreamChanges runs until its ctx is cancelled: the handler cancels
	// it once it has seen the workload's transactions (the database has no
	// others); the run's deadline bounds the wait.
	streamCtx, stop := context.WithCancel(ctx)
	defer stop()
	commits := 0
	_, err := c.StreamChanges(streamCtx, from, func(ch canonical.Change) error {
		if err := emit(ch); err != nil {
			return err
		}
		if ch.Op == canonical.OpCommit {
			if commits++; commits == len(workload) {
				stop()
			}
		}
		return nil
	})
	return err
}
