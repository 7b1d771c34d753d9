// Command quickstart shows siphon's main job end to end: a consistent
// snapshot, the change stream that continues it, a full backup aligned to
// the same timeline, an incremental backup, and exactly-once apply into two
// copies that end identical to the source.
//
//	go run ./examples/quickstart
//
// With SIPHON_DSN unset it starts an embedded throwaway PostgreSQL (local
// server binaries, see package siphontest) and removes it at the end. With
// SIPHON_DSN set it works in a schema "siphon_quickstart" of that database
// (which needs wal_level=logical and a role with REPLICATION and CREATEDB:
// the copies are new databases on the same server) and removes everything it
// made at the end.
package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/siphondb/siphon"
	"github.com/siphondb/siphon/canonical"
	"github.com/siphondb/siphon/siphontest"
)

// Names the tour uses on the source.
const (
	slotName        = "siphon_quickstart"
	publicationName = "siphon_quickstart"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// The tour takes seconds; this bounds it on a slow machine. Its test
	// calls run without it: the test binary's timeout bounds a hang there,
	// and a busy machine is no hang.
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := run(ctx, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "quickstart:", err)
		os.Exit(1)
	}
}

// run does the whole tour, printing a short account to out.
func run(ctx context.Context, out io.Writer) error {
	started := time.Now()
	srv, source, cleanup, err := setUp(ctx, out)
	if err != nil {
		return err
	}
	defer cleanup()
	// The tour changes no schema, and installs nothing in your database
	// (with SIPHON_DSN): WithoutSchemaCapture says that siphon follows
	// only the columns it sees added and dropped (see InstallSchemaCapture).
	c, err := siphon.Connect(ctx, source, siphon.WithSlot(slotName), siphon.WithPublication(publicationName),
		siphon.WithTables(shopTables...), siphon.WithProgress(progressBar(out)), siphon.WithoutSchemaCapture())
	if err != nil {
		return err
	}
	defer c.Close()
	defer removeSlots(ctx, c, source) // a slot pins WAL for as long as it exists
	backups, err := siphon.Connect(ctx, source, siphon.WithSlot(backupSlotName), siphon.WithPublication(publicationName),
		siphon.WithTables(shopTables...), siphon.WithoutSchemaCapture())
	if err != nil {
		return err
	}
	defer backups.Close()

	t := tour{c: c, backups: backups, out: out, source: source, srv: srv}
	defer t.cleanUp()
	for _, step := range []func(context.Context) error{
		t.snapshot, t.writes(1), t.backup, t.writes(2), t.stream, t.incremental, t.apply,
	} {
		if err := step(ctx); err != nil {
			return err
		}
	}
	fmt.Fprintf(out, "done in %v\n", time.Since(started).Round(time.Millisecond))
	return nil
}

// tour holds what one step hands the next.
type tour struct {
	c        *siphon.Conn // streams on the CDC slot
	backups  *siphon.Conn // backs up on the backup chain's slot
	out      io.Writer
	source   string
	srv      *siphontest.Server
	cleanups []func()

	snapshotAt      canonical.Position
	snapshotFile    bytes.Buffer // canonical JSONL
	backupAt        canonical.Position
	backupFile      bytes.Buffer // envelope with a pg_dump body
	changes         bytes.Buffer // the stream from the snapshot, as canonical JSONL
	incrementalFile bytes.Buffer // the bounded change set after the backup
	txns            int          // transactions the workload committed
}

func (t *tour) snapshot(ctx context.Context) error {
	began := time.Now()
	pos, err := t.c.EmitCanonical(ctx, nil, &t.snapshotFile)
	if err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	t.snapshotAt = pos
	fmt.Fprintf(t.out, "1. snapshot     at %v: %s of canonical JSONL in %v\n", pos, size(t.snapshotFile.Len()), since(began))
	return nil
}

func (t *tour) writes(round int) func(context.Context) error {
	return func(ctx context.Context) error {
		n, err := writeWorkload(ctx, t.source, round)
		if err != nil {
			return fmt.Errorf("workload: %w", err)
		}
		t.txns += n
		what := map[int]string{1: "after the snapshot", 2: "after the backup"}[round]
		fmt.Fprintf(t.out, "%d. writes       %d transactions %s (inserts, updates, deletes)\n", 2*round, n, what)
		return nil
	}
}

func (t *tour) backup(ctx context.Context) error {
	began := time.Now()
	if err := t.backups.Backup(ctx, siphon.BackupOptions{Schemas: []string{"siphon_quickstart"}, StartChain: true}, &t.backupFile); err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	report, err := t.backups.Verify(ctx, bytes.NewReader(t.backupFile.Bytes()))
	if err != nil {
		return fmt.Errorf("verify: %w", err)
	}
	if !report.OK {
		return fmt.Errorf("verify: %v", report.Problems)
	}
	t.backupAt = report.Start
	fmt.Fprintf(t.out, "3. backup       at %v: pg_dump in a checksummed envelope, %s, verified OK in %v\n",
		report.Start, size(t.backupFile.Len()), since(began))
	return nil
}

func (t *tour) cleanUp() {
	for _, f := range t.cleanups {
		f()
	}
}
