// Command test-your-handler shows how to test replication logic written on
// siphon: the handler in handler.go is tested in handler_test.go twice —
// against a recorded change stream with no server at all, and live against
// a throwaway PostgreSQL from siphontest. Copy handler_test.go as a start.
//
//	go test ./examples/test-your-handler          # the tests
//	go run ./examples/test-your-handler           # records a stream and replays it
//	go run ./examples/test-your-handler -record examples/test-your-handler/testdata/orders.jsonl
package main

import (
	"bytes"
	"context"
	"flag"
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
	record := flag.String("record", "", "also write the recorded stream to this file")
	flag.Parse()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := run(ctx, *record, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "test-your-handler:", err)
		os.Exit(1)
	}
}

// run records the demo workload's change stream on an embedded PostgreSQL,
// then replays it into the handler.
func run(ctx context.Context, recordPath string, out io.Writer) error {
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

	var stream bytes.Buffer
	if err := recordWorkload(ctx, dsn, "handler_demo", &stream); err != nil {
		return err
	}
	if recordPath != "" {
		if err := os.WriteFile(recordPath, stream.Bytes(), 0o644); err != nil {
			return err
		}
	}
	revenue := NewRevenue()
	n, err := Replay(&stream, revenue.Handle)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "replayed %d changes: alice %s, bob %s, carol %s\n", n,
		revenue.Total("alice"), revenue.Total("bob"), revenue.Total("carol"))
	return nil
}

// recordWorkload creates shop.orders, writes a few transactions, and records
// them as a canonical JSONL stream (an incremental backup of the slot).
func recordWorkload(ctx context.Context, dsn, slot string, w io.Writer) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, `CREATE SCHEMA shop;
		CREATE TABLE shop.orders (id int PRIMARY KEY, customer text NOT NULL, total numeric(12,2) NOT NULL);
		ALTER TABLE shop.orders REPLICA IDENTITY FULL`); err != nil {
		return err
	}
	c, err := siphon.Connect(ctx, dsn, siphon.WithSlot(slot))
	if err != nil {
		return err
	}
	defer c.Close()
	since, err := c.CurrentPosition(ctx)
	if err != nil {
		return err
	}
	if _, err := conn.Exec(ctx, `
		INSERT INTO shop.orders VALUES (1, 'alice', 10.50), (2, 'bob', 99.99), (3, 'alice', 0.25);
		UPDATE shop.orders SET total = 12.00 WHERE id = 1;
		INSERT INTO shop.orders VALUES (4, 'carol', 5.00);
		DELETE FROM shop.orders WHERE id = 2;
		INSERT INTO shop.orders VALUES (5, 'bob', 1.01);`); err != nil {
		return err
	}
	_, err = c.BackupIncremental(ctx, since, w)
	return err
}

// Replay feeds every change of a recorded canonical stream to handle and
// returns how many it fed: the same calls StreamChanges would make.
func Replay(r io.Reader, handle func(canonical.Change) error) (int, error) {
	dec := canonical.NewDecoder(r)
	if _, err := dec.Header(); err != nil {
		return 0, err
	}
	n := 0
	for {
		rec, err := dec.Next()
		if err == io.EOF {
			return n, nil
		}
		if err != nil {
			return n, err
		}
		if rec.Type == canonical.RecordChange {
			if err := handle(*rec.Change); err != nil {
				return n, err
			}
			n++
		}
	}
}
