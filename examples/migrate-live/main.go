// Command migrate-live migrates a database to another one while its
// application keeps writing: an initial snapshot and the change stream
// after it, applied live by Replicate, with progress in time and bytes;
// then, once the target has caught up and the application stopped
// writing, Cutover: the last transactions applied, the sequences set, and
// every table compared with the source's, by content.
//
//	go run ./examples/migrate-live
//
// With SIPHON_DSN unset it starts an embedded throwaway PostgreSQL (local
// server binaries, see package siphontest) and removes it at the end. With
// SIPHON_DSN set it works on that server, in two new databases it drops at
// the end (the role needs REPLICATION and CREATEDB).
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/siphondb/siphon"
	"github.com/siphondb/siphon/canonical"
	"github.com/siphondb/siphon/siphontest"
)

// slotName names the migration's slot and publication on the source.
const slotName = "siphon_migrate"

// schema is the application's, on the source: Replicate copies it to the
// target (CopySchema), which starts empty.
const schema = `
	CREATE TABLE accounts (id bigint PRIMARY KEY, owner text NOT NULL, balance numeric(12,2) NOT NULL);
	CREATE TABLE transfers (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
		from_id bigint NOT NULL REFERENCES accounts, to_id bigint NOT NULL REFERENCES accounts,
		amount numeric(12,2) NOT NULL, at timestamptz NOT NULL DEFAULT now());`

// tables are the tables migrated and compared, rows and identity sequences.
var tables = []string{"accounts", "transfers"}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// The migration takes seconds; this bounds it on a slow machine. Its test
	// calls run without it: the test binary's timeout bounds a hang there,
	// and a busy machine is no hang.
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := run(ctx, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "migrate-live:", err)
		os.Exit(1)
	}
}

// run migrates the demo's source into its target, printing an account to out.
func run(ctx context.Context, out io.Writer) error {
	out = &lockedWriter{w: out} // Progress writes from Replicate's goroutine
	started := time.Now()
	env, err := setUp(ctx, out)
	if err != nil {
		return err
	}
	defer env.close()

	app := startApplication(ctx, env.source)
	src, err := siphon.Connect(ctx, env.source, siphon.WithSlot(slotName), siphon.WithPublication(slotName))
	if err != nil {
		return errors.Join(err, app.stop())
	}
	defer src.Close()
	target, err := siphon.Connect(ctx, env.target)
	if err != nil {
		return errors.Join(err, app.stop())
	}
	defer target.Close()

	// 1. Snapshot, then the stream, into the target, while the application writes.
	caughtUp := make(chan struct{})
	var once, loaded bool
	replica := startReplicate(ctx, src, target, siphon.ReplicateOptions{
		Snapshot:         true,
		CopySchema:       &siphon.CopySchemaOptions{},
		ProgressInterval: 250 * time.Millisecond,
		Progress: func(p siphon.ReplicateProgress) {
			switch {
			case p.Phase == siphon.ReplicateCopying:
				fmt.Fprintf(out, "   copying the snapshot: %d of %d tables, %d rows\n", p.Snapshot.TablesDone, p.Snapshot.Tables, p.Snapshot.Rows)
				return
			case !loaded && p.Phase == siphon.ReplicateStreaming:
				loaded = true
				fmt.Fprintf(out, "   snapshot loaded: %d tables, %d rows\n", p.Snapshot.TablesDone, p.Snapshot.Rows)
			}
			fmt.Fprintf(out, "   %s: applied %v, lag %v (%d bytes), %d transactions streamed, %.0f tx/s\n",
				p.Phase, p.Applied, p.Lag.Round(time.Millisecond), p.LagBytes, p.Transactions, p.TransactionsPerSecond)
			if !once && p.Transactions > 0 && p.LagBytes == 0 {
				once = true // a report after the snapshot, streaming, nothing waiting
				close(caughtUp)
			}
		},
	})
	fmt.Fprintln(out, "1. replicate    the schema and a snapshot, then the stream from its Position, while the application writes")
	select {
	case <-caughtUp:
	case err := <-replica.done:
		return errors.Join(fmt.Errorf("replicate stopped: %w", err), app.stop())
	}

	// 2. Cutover: the application stops writing; siphon does the rest.
	if err := app.stop(); err != nil {
		return err
	}
	if _, err := replica.stop(); err != nil {
		return err
	}
	fmt.Fprintf(out, "2. cutover      lag zero: the application stopped after %d transactions\n", app.commits)
	rep, err := src.Cutover(ctx, target, siphon.CutoverOptions{Contents: true})
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "   the target holds every transaction the source committed before %v (it set the sequences)\n", rep.Position)
	if !rep.OK {
		return fmt.Errorf("the target differs from the source: %v", rep.Problems)
	}

	// 3. The target holds what the source holds.
	for _, tc := range rep.Tables {
		seq, err := sequenceValue(ctx, env.target, tc.Table.Name)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "3. compare      %-9s %d rows, checksum %s, sequence at %s: identical to the source\n", tc.Table.Name, tc.TargetRows, tc.TargetSum, seq)
	}
	fmt.Fprintf(out, "done in %v: point the application at the target\n", since(started))
	// The demo drops its databases: forget the target's position of the
	// source (replication origins are cluster-wide), then the slot.
	systemID, err := src.SystemID(ctx)
	if err != nil {
		return err
	}
	return errors.Join(target.ResetAppliedPosition(ctx, systemID, slotName), src.Detach(ctx))
}

// replica is Replicate running in the background.
type replica struct {
	cancel context.CancelFunc
	done   chan error
	pos    canonical.Position
}

func startReplicate(ctx context.Context, src, target *siphon.Conn, opts siphon.ReplicateOptions) *replica {
	ctx, cancel := context.WithCancel(ctx)
	r := &replica{cancel: cancel, done: make(chan error, 1)}
	go func() {
		var err error
		r.pos, err = src.Replicate(ctx, target, opts)
		r.done <- err
	}()
	return r
}

// stop cancels Replicate, the normal way to stop it, and returns the
// Position the target has applied.
func (r *replica) stop() (canonical.Position, error) {
	r.cancel()
	err := <-r.done
	return r.pos, err
}

// sequenceValue is the last value of a table's identity sequence: "none"
// for a table without one, "unused" before its first nextval.
func sequenceValue(ctx context.Context, dsn, table string) (string, error) {
	var last *int64
	query := "SELECT last_value FROM pg_sequences WHERE format('%I.%I', schemaname, sequencename)::regclass = pg_get_serial_sequence($1, 'id')::regclass"
	err := queryRow(ctx, dsn, query, []any{table}, &last)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return "none", nil
	case err != nil:
		return "", err
	case last == nil:
		return "unused", nil
	}
	return fmt.Sprint(*last), nil
}

func queryRow(ctx context.Context, dsn, sql string, args []any, dest ...any) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	return conn.QueryRow(ctx, sql, args...).Scan(dest...)
}

// lockedWriter serialises writes to w.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func since(t time.Time) time.Duration { return time.Since(t).Round(time.Millisecond) }

// environment is the demo's server and databases.
type environment struct {
	srv            *siphontest.Server
	source, target string
	cleanups       []func()
}

// setUp starts (or attaches to) the server and creates the source, with
// the application's tables filled, and the target, with them empty.
func setUp(ctx context.Context, out io.Writer) (_ *environment, err error) {
	env := &environment{}
	defer func() {
		if err != nil {
			env.close()
		}
	}()
	if dsn := os.Getenv("SIPHON_DSN"); dsn != "" {
		if env.srv, err = siphontest.Attach(ctx, dsn); err != nil {
			return nil, err
		}
		fmt.Fprintln(out, "server: the one SIPHON_DSN names, in new databases")
	} else {
		launched := time.Now()
		if env.srv, err = siphontest.Launch(ctx); err != nil {
			return nil, fmt.Errorf("start an embedded PostgreSQL (or set SIPHON_DSN): %w", err)
		}
		srv := env.srv
		env.cleanups = append(env.cleanups, func() { srv.Close() })
		fmt.Fprintf(out, "server: embedded throwaway PostgreSQL, ready in %v\n", since(launched))
	}
	for _, db := range []*string{&env.source, &env.target} {
		dsn, drop, err := env.srv.CreateDatabase(ctx)
		if err != nil {
			return nil, err
		}
		env.cleanups = append(env.cleanups, func() { drop(context.Background()) })
		*db = dsn
	}
	err = exec(ctx, env.source, schema+`
		INSERT INTO accounts SELECT i, 'owner ' || i, 1000 FROM generate_series(1, 10000) i;
		INSERT INTO transfers (from_id, to_id, amount) SELECT 1 + i % 10000, 1 + (i * 7) % 10000, (i % 500) / 10.0
			FROM generate_series(1, 100000) i;
		ANALYZE accounts, transfers;`)
	if err != nil {
		return nil, err
	}
	fmt.Fprintln(out, "source: 10000 accounts, 100000 transfers; target: an empty database")
	return env, nil
}

// close removes what the demo made, newest first.
func (e *environment) close() {
	for i := len(e.cleanups) - 1; i >= 0; i-- {
		e.cleanups[i]()
	}
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
