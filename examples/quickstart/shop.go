package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/siphondb/siphon"
	"github.com/siphondb/siphon/siphontest"
)

// backupSlotName is the slot backups chain on. A change stream and a backup
// chain each have their own slot: each acknowledges its own progress.
const backupSlotName = "siphon_quickstart_backups"

// shopTables are the tables the tour captures.
var shopTables = []string{"siphon_quickstart.customers", "siphon_quickstart.orders"}

// shopDDL creates the demo schema.
const shopDDL = `
	CREATE SCHEMA siphon_quickstart;
	CREATE TABLE siphon_quickstart.customers (
		id bigint PRIMARY KEY, name text NOT NULL, email text, since timestamptz NOT NULL DEFAULT now());
	CREATE TABLE siphon_quickstart.orders (
		id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
		customer_id bigint NOT NULL REFERENCES siphon_quickstart.customers,
		total numeric(12,2) NOT NULL, items text[] NOT NULL, details jsonb);`

// setUp returns the server and the source database's DSN, with the shop
// created and filled, and a function that removes everything.
func setUp(ctx context.Context, out io.Writer) (*siphontest.Server, string, func(), error) {
	var srv *siphontest.Server
	var err error
	var source string
	var cleanups []func()
	cleanup := func() {
		for i := len(cleanups) - 1; i >= 0; i-- {
			cleanups[i]()
		}
	}
	launched := time.Now()
	if dsn := os.Getenv("SIPHON_DSN"); dsn != "" {
		if srv, err = siphontest.Attach(ctx, dsn); err != nil {
			return nil, "", nil, err
		}
		source = dsn
		cleanups = append(cleanups, func() { exec(context.Background(), dsn, "DROP SCHEMA IF EXISTS siphon_quickstart CASCADE") })
		fmt.Fprintln(out, "source: the database SIPHON_DSN names, schema siphon_quickstart")
	} else {
		if srv, err = siphontest.Launch(ctx); err != nil {
			return nil, "", nil, fmt.Errorf("start an embedded PostgreSQL (or set SIPHON_DSN): %w", err)
		}
		cleanups = append(cleanups, func() { srv.Close() })
		var drop func(context.Context) error
		if source, drop, err = srv.CreateDatabase(ctx); err != nil {
			cleanup()
			return nil, "", nil, err
		}
		cleanups = append(cleanups, func() { drop(context.Background()) })
		fmt.Fprintf(out, "source: embedded throwaway PostgreSQL, ready in %v\n", since(launched))
	}
	err = exec(ctx, source, "DROP SCHEMA IF EXISTS siphon_quickstart CASCADE;"+shopDDL+`
		INSERT INTO siphon_quickstart.customers (id, name, email)
			SELECT i, 'customer ' || i, 'c' || i || '@example.com' FROM generate_series(1, 1000) i;
		INSERT INTO siphon_quickstart.orders (customer_id, total, items, details)
			SELECT 1 + i % 1000, (i % 997) * 1.25, ARRAY['item ' || i, 'gift'], jsonb_build_object('n', i)
			FROM generate_series(1, 20000) i;
		ANALYZE siphon_quickstart.customers, siphon_quickstart.orders;`)
	if err != nil {
		cleanup()
		return nil, "", nil, err
	}
	fmt.Fprintln(out, "shop:   1000 customers, 20000 orders")
	return srv, source, cleanup, nil
}

// writeWorkload commits a round of small transactions and returns how many.
func writeWorkload(ctx context.Context, dsn string, round int) (int, error) {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return 0, err
	}
	defer conn.Close(context.Background())
	statements := []string{
		`INSERT INTO siphon_quickstart.orders (customer_id, total, items) VALUES ($1, 19.99, '{"new order"}')`,
		`UPDATE siphon_quickstart.customers SET email = 'changed' || $1 || '@example.com' WHERE id = $1`,
		`DELETE FROM siphon_quickstart.orders WHERE id = $1 * 7`,
		`UPDATE siphon_quickstart.orders SET total = total + 1 WHERE customer_id = $1`,
	}
	n := 0
	for i := 1; i <= 40; i++ {
		for _, stmt := range statements {
			if _, err := conn.Exec(ctx, stmt, int64(round*100+i)); err != nil {
				return n, err
			}
			n++
		}
	}
	return n, nil
}

// newCopy creates an empty database on the server for a copy of the shop,
// with the shop's tables when withSchema is set. It is dropped at cleanup.
func (t *tour) newCopy(ctx context.Context, name string, withSchema bool) (string, error) {
	dsn, drop, err := t.srv.CreateDatabase(ctx)
	if err != nil {
		return "", fmt.Errorf("%s: %w", name, err)
	}
	t.cleanups = append(t.cleanups, func() { drop(context.Background()) })
	if withSchema {
		return dsn, exec(ctx, dsn, shopDDL)
	}
	return dsn, nil
}

// digest fingerprints every shop table's rows.
func digest(ctx context.Context, dsn string) (string, error) {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return "", err
	}
	defer conn.Close(context.Background())
	var parts []string
	for _, table := range shopTables {
		var sum string
		err := conn.QueryRow(ctx, "SELECT coalesce(md5(string_agg(t::text, '|' ORDER BY t::text)), '') FROM "+table+" t").Scan(&sum)
		if err != nil {
			return "", err
		}
		parts = append(parts, sum)
	}
	return strings.Join(parts, ","), nil
}

// removeSlots drops the tour's slots, publication and schema capture: a
// slot left behind would pin WAL on the source forever.
func removeSlots(ctx context.Context, c *siphon.Conn, source string) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	c.DropSlot(ctx, backupSlotName)
	exec(ctx, source, "DROP PUBLICATION IF EXISTS "+publicationName)
	// The CDC slot, and the schema capture where one was installed.
	c.Detach(ctx)
}

func exec(ctx context.Context, dsn, sql string) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	_, err = conn.Exec(ctx, sql)
	return err
}

// progressBar draws a bar per table from siphon's copy progress.
func progressBar(out io.Writer) func(siphon.Progress) {
	return func(p siphon.Progress) {
		done := 1.0
		if p.EstimatedRows > 0 && !p.Done {
			done = min(float64(p.Rows)/float64(p.EstimatedRows), 1)
		}
		bar := strings.Repeat("#", int(done*20)) + strings.Repeat(".", 20-int(done*20))
		fmt.Fprintf(out, "\r   copying %-32s [%s] %3.0f%% %7d rows", p.Table, bar, done*100, p.Rows)
		if p.Done {
			fmt.Fprintln(out)
		}
	}
}

func size(n int) string {
	if n >= 1<<20 {
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	}
	return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
}

func since(t time.Time) time.Duration { return time.Since(t).Round(time.Millisecond) }
