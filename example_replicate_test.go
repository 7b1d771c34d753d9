package siphon_test

import (
	"context"
	"fmt"
	"sync"

	"github.com/siphondb/siphon"
	"github.com/siphondb/siphon/siphontest"
)

// A live migration: Replicate copies the source into the target and
// follows its changes while the application writes; once the application
// stops writing, Cutover applies the rest, sets the sequences and
// compares every table.
func ExampleConn_Cutover() {
	ctx := context.Background()
	srv, err := siphontest.Launch(ctx) // a throwaway server; use your own DSNs
	if err != nil {
		fmt.Println(err)
		return
	}
	defer srv.Close()
	sourceDSN, dropSource, err := srv.CreateDatabase(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer dropSource(ctx)
	targetDSN, dropTarget, err := srv.CreateDatabase(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer dropTarget(ctx)
	const ddl = `CREATE TABLE orders (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, item text)`
	for _, dsn := range []string{sourceDSN, targetDSN} {
		if err := execOn(ctx, dsn, ddl); err != nil {
			fmt.Println(err)
			return
		}
	}
	if err := execOn(ctx, sourceDSN, `INSERT INTO orders (item) SELECT 'item ' || g FROM generate_series(1, 1000) g`); err != nil {
		fmt.Println(err)
		return
	}

	source, err := siphon.Connect(ctx, sourceDSN, siphon.WithSlot("orders_migration"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer source.Close()
	target, err := siphon.Connect(ctx, targetDSN)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer target.Close()

	// The snapshot, then the changes, while the application writes.
	replicaCtx, stopReplica := context.WithCancel(ctx)
	defer stopReplica()
	replicated, streaming := make(chan error, 1), make(chan struct{})
	var loaded sync.Once
	go func() {
		_, err := source.Replicate(replicaCtx, target, siphon.ReplicateOptions{Snapshot: true,
			Progress: func(p siphon.ReplicateProgress) {
				if p.Phase == siphon.ReplicateStreaming {
					loaded.Do(func() { close(streaming) }) // the snapshot is loaded
				}
			}})
		replicated <- err
	}()
	<-streaming
	if err := execOn(ctx, sourceDSN, `INSERT INTO orders (item) VALUES ('late'), ('later')`); err != nil {
		fmt.Println(err)
		return
	}

	// The application stops writing: stop Replicate, then cut over.
	stopReplica()
	if err := <-replicated; err != nil {
		fmt.Println(err)
		return
	}
	report, err := source.Cutover(ctx, target, siphon.CutoverOptions{Contents: true})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, table := range report.Tables {
		fmt.Printf("%s: %d rows on the source, %d on the target, equal: %v\n", table.Table, table.SourceRows, table.TargetRows, table.Match)
	}
	fmt.Println("ready to switch:", report.OK)
	if err := source.Detach(ctx); err != nil {
		fmt.Println(err)
	}
	// Output:
	// public.orders: 1002 rows on the source, 1002 on the target, equal: true
	// ready to switch: true
}
