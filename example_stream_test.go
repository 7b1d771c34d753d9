package siphon_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/jackc/pgx/v5"

	"github.com/siphondb/siphon"
	"github.com/siphondb/siphon/canonical"
	"github.com/siphondb/siphon/siphontest"
)

// exampleDatabase starts a throwaway server with a fresh database holding an
// orders table; use your own DSN instead.
func exampleDatabase(ctx context.Context) (dsn string, admin *pgx.Conn, stop func(), err error) {
	srv, err := siphontest.Launch(ctx)
	if err != nil {
		return "", nil, nil, err
	}
	dsn, drop, err := srv.CreateDatabase(ctx)
	if err == nil {
		admin, err = pgx.Connect(ctx, dsn)
	}
	if err == nil {
		_, err = admin.Exec(ctx, "CREATE TABLE orders (id int PRIMARY KEY, status text)")
	}
	stop = func() {
		if admin != nil {
			admin.Close(ctx)
		}
		drop(ctx)
		srv.Close()
	}
	if err != nil {
		stop()
		return "", nil, nil, err
	}
	return dsn, admin, stop, nil
}

// A consumer records the Position of each OpCommit it handled, together
// with what the transaction did (in the same transaction of its own
// database, ideally), and restarts from it: it sees nothing twice and
// misses nothing.
func ExampleConn_StreamChanges() {
	ctx := context.Background()
	dsn, admin, stop, err := exampleDatabase(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer stop()
	c, err := siphon.Connect(ctx, dsn, siphon.WithSlot("orders_cdc"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()

	// Where to start: a new slot's consistent point (or, normally, the
	// Position of a snapshot).
	resume, err := c.CurrentPosition(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	admin.Exec(ctx, "INSERT INTO orders VALUES (1, 'new'), (2, 'new')")
	admin.Exec(ctx, "UPDATE orders SET status = 'paid' WHERE id = 1")

	consume := func(transactions int) {
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		_, err := c.StreamChanges(ctx, resume, func(ch canonical.Change) error {
			switch ch.Op {
			case canonical.OpInsert, canonical.OpUpdate:
				id, _ := ch.Value("id")
				status, _ := ch.Value("status")
				fmt.Println(ch.Op, ch.Table, id, status)
			case canonical.OpCommit:
				resume = ch.Position // store it with the transaction's effects
				if transactions--; transactions == 0 {
					cancel() // the normal way to stop
				}
			}
			return nil
		})
		if err != nil {
			fmt.Println(err)
		}
	}
	consume(2)
	fmt.Println("-- restart")
	admin.Exec(ctx, "DELETE FROM orders WHERE id = 2")
	admin.Exec(ctx, "UPDATE orders SET status = 'shipped' WHERE id = 1")
	consume(2)
	// Output:
	// insert orders 1 new
	// insert orders 2 new
	// update orders 1 paid
	// -- restart
	// update orders 1 shipped
}

// A consumer that makes transactions durable after emit returns (a queue
// that acknowledges asynchronously, a writer that saves them in batches)
// says how far it got through StreamOptions.Durable: the slot is
// acknowledged only that far, and what it had not saved when it stopped
// comes again when it resumes from its durable Position.
func ExampleConn_StreamChangesWith() {
	ctx := context.Background()
	dsn, admin, stop, err := exampleDatabase(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer stop()
	c, err := siphon.Connect(ctx, dsn, siphon.WithSlot("orders_saver"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	from, err := c.CurrentPosition(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, id := range []string{"1", "2", "3"} {
		admin.Exec(ctx, "INSERT INTO orders VALUES ("+id+", 'new')")
	}

	// consume streams from from and saves this many transactions, then
	// stops; it returns how far it saved.
	consume := func(from canonical.Position, save int) canonical.Position {
		var durable siphon.DurablePosition
		streamCtx, cancel := context.WithCancel(ctx)
		defer cancel()
		transactions := make(chan []canonical.Change, 64)
		saved := make(chan struct{})
		go func() { // the saver, in its own time
			defer close(saved)
			for tx := range transactions {
				if save == 0 {
					continue
				}
				for _, ch := range tx[1 : len(tx)-1] { // between OpBegin and OpCommit
					id, _ := ch.Value("id")
					fmt.Println("saved", ch.Op, ch.Table, id)
				}
				// Once the transaction is saved for good (a file synced, a
				// queue's acknowledgement):
				durable.Set(tx[len(tx)-1].Position)
				if save--; save == 0 {
					cancel()
				}
			}
		}()
		var tx []canonical.Change
		_, err := c.StreamChangesWith(streamCtx, from, siphon.StreamOptions{Durable: &durable}, func(ch canonical.Change) error {
			tx = append(tx, ch)
			if ch.Op == canonical.OpCommit {
				transactions <- tx // and on at once: the slot waits for durable
				tx = nil
			}
			return nil
		})
		close(transactions)
		<-saved
		if err != nil {
			fmt.Println(err)
		}
		return durable.Position()
	}
	resume := consume(from, 2)
	fmt.Println("-- resumed from what was saved")
	consume(resume, 1)
	// Output:
	// saved insert orders 1
	// saved insert orders 2
	// -- resumed from what was saved
	// saved insert orders 3
}

// Incremental backups form a chain: each starts where the previous one
// ended. A transaction still open when one is taken goes into the next.
func ExampleConn_BackupIncremental() {
	ctx := context.Background()
	dsn, admin, stop, err := exampleDatabase(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer stop()
	c, err := siphon.Connect(ctx, dsn, siphon.WithSlot("orders_backup"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	since, err := c.CurrentPosition(ctx) // where a full backup ended, normally
	if err != nil {
		fmt.Println(err)
		return
	}

	for i, stmt := range []string{
		"INSERT INTO orders VALUES (1, 'new'), (2, 'new')",
		"UPDATE orders SET status = 'paid'",
	} {
		admin.Exec(ctx, stmt)
		var link bytes.Buffer
		end, err := c.BackupIncremental(ctx, since, &link)
		if err != nil {
			fmt.Println(err)
			return
		}
		dec := canonical.NewDecoder(&link)
		h, _ := dec.Header()
		changes := 0
		for {
			rec, err := dec.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				fmt.Println(err)
				return
			}
			if rec.Type == canonical.RecordChange && rec.Change.Op != canonical.OpBegin && rec.Change.Op != canonical.OpCommit {
				changes++
			}
		}
		fmt.Printf("link %d: %s, starts at the previous end: %v, %d row changes\n", i+1, h.Kind, h.Start == since, changes)
		since = end // the next link starts here
	}
	// Output:
	// link 1: incremental, starts at the previous end: true, 2 row changes
	// link 2: incremental, starts at the previous end: true, 2 row changes
}
