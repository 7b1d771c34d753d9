// Command quickstart shows siphon's main job end to end on a throwaway
// PostgreSQL: it creates a small shop database, writes to it, and follows
// the data out of it with siphon.
//
//	go run ./examples/quickstart
//
// With SIPHON_DSN unset it starts an embedded throwaway PostgreSQL (local
// server binaries, see package siphontest) and removes it at the end. With
// SIPHON_DSN set it works in a schema "siphon_quickstart" of that database,
// which it drops at the end.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/siphondb/siphon"
	"github.com/siphondb/siphon/siphontest"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "quickstart:", err)
		os.Exit(1)
	}
}

// run does the whole tour, printing a short account to out.
func run(ctx context.Context, out io.Writer) error {
	started := time.Now()
	source, cleanup, err := sourceDatabase(ctx, out)
	if err != nil {
		return err
	}
	defer cleanup()

	if err := createShop(ctx, source); err != nil {
		return err
	}
	c, err := siphon.Connect(ctx, source, siphon.WithTables("siphon_quickstart.customers", "siphon_quickstart.orders"))
	if err != nil {
		return err
	}
	defer c.Close()

	schema, err := c.InspectSchema(ctx)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "schema: %d tables\n", len(schema.Tables))
	for _, t := range schema.Tables {
		fmt.Fprintf(out, "  %s: %d columns, primary key %v, replica identity %s\n", t.TableName(), len(t.Columns), t.PrimaryKey, t.ReplicaIdentity)
	}
	fmt.Fprintf(out, "done in %v\n", time.Since(started).Round(time.Millisecond))
	return nil
}

// sourceDatabase returns the DSN of the database to work on and a function
// that removes what the tour created.
func sourceDatabase(ctx context.Context, out io.Writer) (string, func(), error) {
	if dsn := os.Getenv("SIPHON_DSN"); dsn != "" {
		fmt.Fprintln(out, "source: the database SIPHON_DSN names, schema siphon_quickstart")
		return dsn, func() { dropShop(dsn) }, nil
	}
	launched := time.Now()
	srv, err := siphontest.Launch(ctx)
	if err != nil {
		return "", nil, fmt.Errorf("start an embedded PostgreSQL (or set SIPHON_DSN): %w", err)
	}
	dsn, drop, err := srv.CreateDatabase(ctx)
	if err != nil {
		srv.Close()
		return "", nil, err
	}
	fmt.Fprintf(out, "source: embedded throwaway PostgreSQL (%s), ready in %v\n", srv.Source(), time.Since(launched).Round(time.Millisecond))
	return dsn, func() {
		drop(context.Background())
		srv.Close()
	}, nil
}

// createShop creates the demo schema and fills it.
func createShop(ctx context.Context, dsn string) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	_, err = conn.Exec(ctx, `
		DROP SCHEMA IF EXISTS siphon_quickstart CASCADE;
		CREATE SCHEMA siphon_quickstart;
		CREATE TABLE siphon_quickstart.customers (
			id bigint PRIMARY KEY, name text NOT NULL, email text, since timestamptz NOT NULL DEFAULT now());
		CREATE TABLE siphon_quickstart.orders (
			id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
			customer_id bigint NOT NULL REFERENCES siphon_quickstart.customers,
			total numeric(12,2) NOT NULL, items text[] NOT NULL, details jsonb);
		INSERT INTO siphon_quickstart.customers (id, name, email)
			SELECT i, 'customer ' || i, 'c' || i || '@example.com' FROM generate_series(1, 1000) i;
		INSERT INTO siphon_quickstart.orders (customer_id, total, items, details)
			SELECT 1 + i % 1000, (i % 997) * 1.25, ARRAY['item ' || i, 'gift'], jsonb_build_object('n', i)
			FROM generate_series(1, 5000) i;`)
	return err
}

func dropShop(dsn string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return
	}
	defer conn.Close(ctx)
	conn.Exec(ctx, "DROP SCHEMA IF EXISTS siphon_quickstart CASCADE")
}
