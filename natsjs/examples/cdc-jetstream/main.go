// Command cdc-jetstream fans a database's change stream out through NATS
// JetStream: a publisher streams one replication slot into a JetStream
// stream (one message per change, on a subject per table, a commit marker
// per transaction), and any number of consumers read it back, whole
// transactions in commit order, each from where it stopped.
//
//	cd natsjs   # the natsjs module
//	go run ./examples/cdc-jetstream        # demo: embedded PostgreSQL, in-process nats-server
//	SIPHON_DSN=postgres://... NATS_URL=nats://... go run ./examples/cdc-jetstream -publish
//	NATS_URL=nats://... go run ./examples/cdc-jetstream -consume -tables public.orders
//
// With SIPHON_DSN and NATS_URL unset it starts an embedded throwaway
// PostgreSQL and a nats-server in this process, writes a small workload,
// stops the publisher part way and starts another (it resumes from what
// the stream holds), then runs three consumers: all tables, one table, and
// one resuming after a transaction. SIGINT or SIGTERM stops a real run.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/siphondb/siphon/canonical"
	"github.com/siphondb/siphon/natsjs"
)

type config struct {
	stream, prefix, slot string
	publish, consume     bool
	tables               string
}

func main() {
	var cfg config
	flag.StringVar(&cfg.stream, "stream", "SHOP", "JetStream stream (created if missing)")
	flag.StringVar(&cfg.prefix, "prefix", "shop", "subject prefix")
	flag.StringVar(&cfg.slot, "slot", "shop_jetstream", "replication slot")
	flag.BoolVar(&cfg.publish, "publish", false, "with SIPHON_DSN and NATS_URL: publish the database's changes until stopped")
	flag.BoolVar(&cfg.consume, "consume", false, "with NATS_URL: print the stream's transactions until stopped")
	flag.StringVar(&cfg.tables, "tables", "", "with -consume: only these tables' changes (schema.table, comma-separated)")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	switch {
	case cfg.publish:
		err = publish(ctx, os.Getenv("SIPHON_DSN"), os.Getenv("NATS_URL"), cfg, os.Stdout)
	case cfg.consume:
		err = consume(ctx, os.Getenv("NATS_URL"), cfg, os.Stdout)
	default:
		// The demo takes seconds; this bounds it on a slow machine. Its
		// test calls demo without it: the test binary's timeout bounds a
		// hang there, and a busy machine is no hang.
		demoCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		err = demo(demoCtx, os.Stdout)
		cancel()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "cdc-jetstream:", err)
		os.Exit(1)
	}
}

// publish streams dsn's changes into the stream until ctx ends, creating
// the stream (one replica) when it is missing.
func publish(ctx context.Context, dsn, url string, cfg config, out io.Writer) error {
	if dsn == "" || url == "" {
		return fmt.Errorf("-publish needs SIPHON_DSN and NATS_URL")
	}
	nc, err := nats.Connect(url, nats.MaxReconnects(-1))
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	if _, err := js.CreateOrUpdateStream(ctx, natsjs.StreamConfig(cfg.stream, cfg.prefix)); err != nil {
		return fmt.Errorf("create stream %s: %w", cfg.stream, err)
	}
	pub, err := natsjs.NewPublisher(nc, natsjs.Config{Stream: cfg.stream, Prefix: cfg.prefix, Slot: cfg.slot})
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "publishing slot %s into stream %s (%s.>) until stopped\n", cfg.slot, cfg.stream, cfg.prefix)
	held, err := pub.Run(ctx, dsn)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "stopped: the stream holds the transactions up to %v\n", held)
	return nil
}

// consume prints the stream's transactions until ctx ends.
func consume(ctx context.Context, url string, cfg config, out io.Writer) error {
	if url == "" {
		return fmt.Errorf("-consume needs NATS_URL")
	}
	nc, err := nats.Connect(url, nats.MaxReconnects(-1))
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	s, err := js.Stream(ctx, cfg.stream)
	if err != nil {
		return fmt.Errorf("stream %s: %w", cfg.stream, err)
	}
	cc := natsjs.ConsumeConfig{Prefix: cfg.prefix}
	for _, name := range strings.Split(cfg.tables, ",") {
		if schema, table, ok := strings.Cut(strings.TrimSpace(name), "."); ok {
			cc.Tables = append(cc.Tables, canonical.TableName{Schema: schema, Name: table})
		}
	}
	_, err = natsjs.Consume(ctx, s, cc, printer(out))
	return err
}

// printer returns an emit function that prints each transaction in one
// line.
func printer(out io.Writer) func(canonical.Change) error {
	var line strings.Builder
	return func(ch canonical.Change) error {
		switch ch.Op {
		case canonical.OpBegin:
			line.Reset()
			fmt.Fprintf(&line, "xid %d:", ch.XID)
		case canonical.OpCommit:
			fmt.Fprintf(out, "%s commit (resume after %v)\n", line.String(), ch.Position)
		case canonical.OpTruncate:
			fmt.Fprintf(&line, " truncate %v", ch.Truncated)
		case canonical.OpMessage:
			fmt.Fprintf(&line, " message %q", ch.Message.Prefix)
		default:
			id, _ := ch.Value("id")
			fmt.Fprintf(&line, " %s %s id=%s", ch.Op, ch.TableName(), id)
		}
		return nil
	}
}
