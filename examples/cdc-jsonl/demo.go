package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/siphondb/siphon"
	"github.com/siphondb/siphon/canonical"
	"github.com/siphondb/siphon/siphontest"
)

// demoRows is how many rows the demo workload inserts, one per transaction.
const demoRows = 300

// demo runs the service twice on an embedded PostgreSQL while a workload
// writes: the first run is stopped part way, the second resumes from the
// files, and the files end up holding every row exactly once.
func demo(ctx context.Context, cfg config, out io.Writer) error {
	srv, err := siphontest.Launch(ctx)
	if err != nil {
		return fmt.Errorf("start an embedded PostgreSQL (or set SIPHON_DSN): %w", err)
	}
	defer srv.Close()
	dsn, drop, err := srv.CreateDatabase(ctx)
	if err != nil {
		return err
	}
	defer drop(context.Background())
	if cfg.dir == "" {
		if cfg.dir, err = os.MkdirTemp("", "cdc-jsonl-"); err != nil {
			return err
		}
		defer os.RemoveAll(cfg.dir)
	}
	if err := prepareDemo(ctx, dsn, cfg.slot); err != nil {
		return err
	}

	workload := make(chan error, 1)
	go func() { workload <- writeDemoRows(ctx, dsn) }()

	inserts := 0
	countInserts := func(limit int) func(canonical.Change) bool {
		return func(ch canonical.Change) bool {
			if ch.Op == canonical.OpInsert {
				inserts++
			}
			return ch.Op == canonical.OpCommit && inserts >= limit
		}
	}
	fmt.Fprintln(out, "run 1 (stopped part way, as a restart would):")
	if err := runOnce(ctx, dsn, cfg, out, countInserts(demoRows/3)); err != nil {
		return err
	}
	fmt.Fprintln(out, "run 2 (resumes from the files):")
	if err := runOnce(ctx, dsn, cfg, out, countInserts(demoRows)); err != nil {
		return err
	}
	if err := <-workload; err != nil {
		return err
	}
	return reportFiles(cfg.dir, out)
}

// prepareDemo creates the demo table and the slot (before any write, so the
// stream sees every row).
func prepareDemo(ctx context.Context, dsn, slot string) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, `CREATE TABLE events (id bigint PRIMARY KEY, kind text NOT NULL, at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return err
	}
	c, err := siphon.Connect(ctx, dsn, siphon.WithSlot(slot))
	if err != nil {
		return err
	}
	defer c.Close()
	_, err = c.CurrentPosition(ctx)
	return err
}

// writeDemoRows inserts demoRows rows, one transaction each.
func writeDemoRows(ctx context.Context, dsn string) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	for i := 1; i <= demoRows; i++ {
		if _, err := conn.Exec(ctx, "INSERT INTO events (id, kind) VALUES ($1, $2)", i, []string{"click", "view", "buy"}[i%3]); err != nil {
			return err
		}
		time.Sleep(2 * time.Millisecond) // a trickle, so the restart falls mid-stream
	}
	return nil
}

// reportFiles reads every file back and checks each row is there once.
func reportFiles(dir string, out io.Writer) error {
	files, _ := filepath.Glob(filepath.Join(dir, "changes-*.jsonl"))
	seen := map[string]int{}
	for _, path := range files {
		if err := readInserts(path, seen); err != nil {
			return err
		}
	}
	for id, n := range seen {
		if n != 1 {
			return fmt.Errorf("row %s arrived %d times", id, n)
		}
	}
	if len(seen) != demoRows {
		return fmt.Errorf("%d of %d rows arrived", len(seen), demoRows)
	}
	fmt.Fprintf(out, "%d files hold all %d rows, each exactly once\n", len(files), demoRows)
	return nil
}

func readInserts(path string, seen map[string]int) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	dec := canonical.NewDecoder(f)
	if _, err := dec.Header(); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	for {
		rec, err := dec.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		if rec.Type == canonical.RecordChange && rec.Change.Op == canonical.OpInsert {
			id, _ := rec.Change.Value("id")
			seen[id.String()]++
		}
	}
}
