package siphon_test

import (
	"bytes"
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/siphondb/siphon"
	"github.com/siphondb/siphon/siphontest"
)

// An incremental backup taken from one database is applied to another,
// exactly once: consuming it a second time changes nothing, and
// AppliedPosition says where the next incremental starts.
func ExampleConn_ConsumeCanonical() {
	ctx := context.Background()
	srv, err := siphontest.Launch(ctx) // a throwaway server; use your own DSNs
	if err != nil {
		fmt.Println(err)
		return
	}
	defer srv.Close()
	sourceDSN, _, err := srv.CreateDatabase(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	targetDSN, _, err := srv.CreateDatabase(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	const ddl = `CREATE TABLE orders (id bigint PRIMARY KEY, item text, qty int)`
	for _, dsn := range []string{sourceDSN, targetDSN} {
		if err := execOn(ctx, dsn, ddl); err != nil {
			fmt.Println(err)
			return
		}
	}

	source, err := siphon.Connect(ctx, sourceDSN, siphon.WithSlot("orders_cdc"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer source.Close()
	since, err := source.CurrentPosition(ctx) // creates the slot
	if err != nil {
		fmt.Println(err)
		return
	}
	err = execOn(ctx, sourceDSN,
		`INSERT INTO orders VALUES (1, 'tea', 2), (2, 'scones', 6)`,
		`UPDATE orders SET qty = 3 WHERE id = 1`,
		`DELETE FROM orders WHERE id = 2`)
	if err != nil {
		fmt.Println(err)
		return
	}
	var incremental bytes.Buffer
	end, err := source.BackupIncremental(ctx, since, &incremental)
	if err != nil {
		fmt.Println(err)
		return
	}

	target, err := siphon.Connect(ctx, targetDSN)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer target.Close()
	for range 2 { // the second time, every transaction is skipped
		if err := target.ConsumeCanonical(ctx, bytes.NewReader(incremental.Bytes())); err != nil {
			fmt.Println(err)
			return
		}
	}
	applied, err := target.AppliedPosition(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("applied up to the incremental's end:", applied == end)

	conn, err := pgx.Connect(ctx, targetDSN)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer conn.Close(ctx)
	var item string
	var qty, count int
	if err := conn.QueryRow(ctx, `SELECT min(item), min(qty), count(*) FROM orders`).Scan(&item, &qty, &count); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(count, "order:", qty, item)
	// Output:
	// applied up to the incremental's end: true
	// 1 order: 3 tea
}

// execOn runs statements on the database dsn names.
func execOn(ctx context.Context, dsn string, statements ...string) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	for _, s := range statements {
		if _, err := conn.Exec(ctx, s); err != nil {
			return err
		}
	}
	return nil
}
