package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/siphondb/siphon"
	"github.com/siphondb/siphon/canonical"
	"github.com/siphondb/siphon/natsjs"
	"github.com/siphondb/siphon/siphontest"
)

// The demo workload: demoOrders transactions that each insert an order
// (every third also counts it in customers), and every tenth order a
// transaction that changes customers alone.
const (
	demoOrders       = 150
	demoTransactions = demoOrders + demoOrders/10
)

var demoCfg = config{stream: "SHOP", prefix: "shop", slot: "shop_jetstream"}

// demo runs a publisher twice (stopped part way, then resumed) while a
// workload writes, then three consumers, on an embedded PostgreSQL and an
// in-process nats-server.
func demo(ctx context.Context, out io.Writer) error {
	pg, err := siphontest.Launch(ctx)
	if err != nil {
		return fmt.Errorf("start an embedded PostgreSQL (or set SIPHON_DSN and NATS_URL): %w", err)
	}
	defer pg.Close()
	dsn, drop, err := pg.CreateDatabase(ctx)
	if err != nil {
		return err
	}
	defer drop(context.Background())
	dir, err := os.MkdirTemp("", "cdc-jetstream-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	ns, err := startNATS(dir)
	if err != nil {
		return err
	}
	defer func() { ns.Shutdown(); ns.WaitForShutdown() }()
	fmt.Fprintf(out, "PostgreSQL: embedded, throwaway; nats-server: in this process at %s, JetStream files in %s\n", ns.ClientURL(), dir)

	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	s, err := js.CreateStream(ctx, natsjs.StreamConfig(demoCfg.stream, demoCfg.prefix))
	if err != nil {
		return err
	}
	if err := prepareDemo(ctx, dsn); err != nil {
		return err
	}
	fmt.Fprintf(out, "stream %s captures %s.>: a subject per table (%s), commit markers on %s\n", demoCfg.stream, demoCfg.prefix,
		natsjs.TableSubject(demoCfg.prefix, canonical.TableName{Schema: "public", Name: "orders"}), natsjs.CommitSubject(demoCfg.prefix))

	workload := make(chan error, 1)
	go func() { workload <- writeDemo(ctx, dsn) }()
	if err := publishTwice(ctx, nc, s, dsn, workload, out); err != nil {
		return err
	}
	return consumeThrice(ctx, s, out)
}

// startNATS starts a single-node nats-server with JetStream storing in
// dir, on a free loopback port.
func startNATS(dir string) (*server.Server, error) {
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: dir, NoLog: true, NoSigs: true})
	if err != nil {
		return nil, err
	}
	ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		ns.Shutdown()
		return nil, fmt.Errorf("nats-server not ready within 10s")
	}
	return ns, nil
}

// prepareDemo creates the tables, then the slot (before any write, so the
// stream sees every change).
func prepareDemo(ctx context.Context, dsn string) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, `CREATE TABLE customers (id int PRIMARY KEY, orders int NOT NULL DEFAULT 0);
		CREATE TABLE orders (id int PRIMARY KEY, customer int NOT NULL REFERENCES customers, amount numeric NOT NULL);
		INSERT INTO customers (id) SELECT generate_series(0, 4)`); err != nil {
		return err
	}
	c, err := siphon.Connect(ctx, dsn, siphon.WithSlot(demoCfg.slot))
	if err != nil {
		return err
	}
	defer c.Close()
	_, err = c.CurrentPosition(ctx)
	return err
}

// writeDemo commits the demo workload, a trickle.
func writeDemo(ctx context.Context, dsn string) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	for i := 1; i <= demoOrders; i++ {
		sql := fmt.Sprintf("INSERT INTO orders VALUES (%d, %d, %d.50)", i, i%5, i)
		if i%3 == 0 {
			sql = fmt.Sprintf("BEGIN; %s; UPDATE customers SET orders = orders + 1 WHERE id = %d; COMMIT", sql, i%5)
		}
		if _, err := conn.Exec(ctx, sql); err != nil {
			return err
		}
		if i%10 == 0 {
			if _, err := conn.Exec(ctx, "UPDATE customers SET orders = orders WHERE id = 0"); err != nil {
				return err
			}
		}
		time.Sleep(2 * time.Millisecond) // a trickle, so the first publisher stops mid-stream
	}
	return nil
}

// heldTransactions returns how many transactions the stream holds (its
// commit markers).
func heldTransactions(ctx context.Context, s jetstream.Stream) (uint64, error) {
	subject := natsjs.CommitSubject(demoCfg.prefix)
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(subject))
	if err != nil {
		return 0, err
	}
	return info.State.Subjects[subject], nil
}

// waitHeld waits until the stream holds n transactions.
func waitHeld(ctx context.Context, s jetstream.Stream, n uint64) error {
	for {
		held, err := heldTransactions(ctx, s)
		if err != nil || held >= n {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the stream holds %d of %d transactions: %w", held, n, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// publishTwice runs a publisher until the stream holds a third of the
// workload, stops it (as a deploy would), then another until the stream
// holds all of it.
func publishTwice(ctx context.Context, nc *nats.Conn, s jetstream.Stream, dsn string, workload chan error, out io.Writer) error {
	var prev canonical.Position
	for run, until := range []uint64{demoTransactions / 3, demoTransactions} {
		pub, err := natsjs.NewPublisher(nc, natsjs.Config{Stream: demoCfg.stream, Prefix: demoCfg.prefix, Slot: demoCfg.slot})
		if err != nil {
			return err
		}
		runCtx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		var held canonical.Position
		go func() {
			var err error
			held, err = pub.Run(runCtx, dsn)
			done <- err
		}()
		err = waitHeld(ctx, s, until)
		if err == nil && run == 1 {
			err = <-workload
		}
		stop()
		if rerr := <-done; err == nil {
			err = rerr
		}
		if err != nil {
			return err
		}
		n, err := heldTransactions(ctx, s)
		if err != nil {
			return err
		}
		if run == 0 {
			fmt.Fprintf(out, "publisher 1 stopped part way (as a deploy would): the stream holds %d transactions, up to %v\n", n, held)
		} else {
			fmt.Fprintf(out, "publisher 2 resumed after %v, from what the stream holds, and stopped: the stream holds %d transactions, up to %v\n", prev, n, held)
		}
		prev = held
	}
	return nil
}

// consumeThrice reads the stream back three ways.
func consumeThrice(ctx context.Context, s jetstream.Stream, out io.Writer) error {
	held, err := heldTransactions(ctx, s)
	if err != nil {
		return err
	}
	// 1: every table. Each order must arrive once, in commit order.
	var ends []canonical.Position
	orders := 0
	err = consumeN(ctx, s, natsjs.ConsumeConfig{Prefix: demoCfg.prefix}, held, func(ch canonical.Change) error {
		switch {
		case ch.Op == canonical.OpCommit:
			ends = append(ends, ch.Position)
		case ch.Op == canonical.OpInsert && ch.Table == "orders":
			if id, _ := ch.Value("id"); id.String() != fmt.Sprint(orders+1) {
				return fmt.Errorf("order %s after order %d", id, orders)
			}
			orders++
		}
		return nil
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "consumer 1 (every table): %d transactions, all %d orders, each exactly once, in commit order\n", len(ends), orders)

	// 2: one table. Transactions that change no order still arrive, as
	// their begin and commit, so the consumer knows where each ends.
	empty, changes, shown := 0, 0, 0
	show := printer(out)
	orderTable := canonical.TableName{Schema: "public", Name: "orders"}
	err = consumeN(ctx, s, natsjs.ConsumeConfig{Prefix: demoCfg.prefix, Tables: []canonical.TableName{orderTable}}, held, func(ch canonical.Change) error {
		switch ch.Op {
		case canonical.OpBegin:
			changes = 0
		case canonical.OpCommit:
			if changes == 0 {
				empty++
			}
		default:
			changes++
		}
		if shown < 3 { // the first three transactions
			if ch.Op == canonical.OpCommit {
				shown++
			}
			return show(ch)
		}
		return nil
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "consumer 2 (public.orders only): %d transactions, %d of them without an order change\n", held, empty)

	// 3: resuming after the 40th transaction, as a consumer that stored
	// that Position would.
	after := ends[39]
	err = consumeN(ctx, s, natsjs.ConsumeConfig{Prefix: demoCfg.prefix, After: after}, held-40, func(canonical.Change) error { return nil })
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "consumer 3 (after %v, the 40th transaction's end): the %d transactions after it\n", after, held-40)
	return nil
}

// consumeN runs Consume until emit has seen n transactions.
func consumeN(ctx context.Context, s jetstream.Stream, cc natsjs.ConsumeConfig, n uint64, emit func(canonical.Change) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	seen := uint64(0)
	_, err := natsjs.Consume(ctx, s, cc, func(ch canonical.Change) error {
		if err := emit(ch); err != nil {
			return err
		}
		if ch.Op == canonical.OpCommit {
			if seen++; seen == n {
				cancel()
			}
		}
		return nil
	})
	if err == nil && seen != n {
		return fmt.Errorf("consumed %d of %d transactions", seen, n)
	}
	return err
}
