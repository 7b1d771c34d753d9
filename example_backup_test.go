package siphon_test

import (
	"bytes"
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/siphondb/siphon"
	"github.com/siphondb/siphon/siphontest"
)

// A full backup is a checksummed envelope around a pg_dump archive, taken
// through a snapshot exported by a replication slot: its Start is where
// the first incremental backup continues. Verify checks it without a
// database; Restore refuses it unless it checks out, then runs pg_restore.
func ExampleConn_Backup() {
	ctx := context.Background()
	srv, err := siphontest.Launch(ctx) // use your own databases instead
	if err != nil {
		fmt.Println(err)
		return
	}
	defer srv.Close()
	source, dropSource, _ := srv.CreateDatabase(ctx)
	defer dropSource(ctx)
	target, dropTarget, _ := srv.CreateDatabase(ctx)
	defer dropTarget(ctx)
	admin, err := pgx.Connect(ctx, source)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer admin.Close(ctx)
	admin.Exec(ctx, "CREATE TABLE orders (id int PRIMARY KEY, status text); INSERT INTO orders VALUES (1, 'new'), (2, 'paid')")

	src, err := siphon.Connect(ctx, source, siphon.WithSlot("orders_full_backup"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer src.Close()
	var backup bytes.Buffer // a file or an object store upload in real use
	if err := src.Backup(ctx, siphon.BackupOptions{}, &backup); err != nil {
		fmt.Println(err)
		return
	}

	report, err := src.Verify(ctx, bytes.NewReader(backup.Bytes()))
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("verified:", report.OK, report.Kind, report.Tables)
	// report.Start is the Position to pass to BackupIncremental next.

	dst, err := siphon.Connect(ctx, target, siphon.WithSlot("orders_restore"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer dst.Close()
	if err := dst.Restore(ctx, siphon.RestoreOptions{}, &backup); err != nil {
		fmt.Println(err)
		return
	}
	restored, err := pgx.Connect(ctx, target)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer restored.Close(ctx)
	var n int
	restored.QueryRow(ctx, "SELECT count(*) FROM orders").Scan(&n)
	fmt.Println("restored orders:", n)
	// Output:
	// verified: true dump [public.orders]
	// restored orders: 2
}
