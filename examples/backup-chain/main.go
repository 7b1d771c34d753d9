// Command backup-chain is a small backup orchestrator: a base backup, then
// incremental backups on an interval while the database is written to, kept
// as files of a chain directory, verified as a chain, restored to a point in
// time, and retired once a newer chain exists.
//
//	go run ./examples/backup-chain
//
// With SIPHON_DSN unset it starts an embedded throwaway PostgreSQL (local
// server binaries, see package siphontest) and removes it at the end. With
// SIPHON_DSN set it works on that server, in new databases it creates and
// drops at the end (the role needs REPLICATION and CREATEDB), and drops the
// slots it made. The chain files go to a temporary directory, removed at
// the end.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/siphondb/siphon"
	"github.com/siphondb/siphon/canonical"
	"github.com/siphondb/siphon/siphontest"
)

// The demo's schedule and retention.
const (
	slotName     = "siphon_backup_chain"
	incrementals = 3                      // per chain
	interval     = 300 * time.Millisecond // between incrementals
	keepChains   = 1                      // chains kept once a new one is complete
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// The demo takes seconds; this bounds it on a slow machine. Its test
	// calls run without it: the test binary's timeout bounds a hang there,
	// and a busy machine is no hang.
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := run(ctx, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "backup-chain:", err)
		os.Exit(1)
	}
}

// run does the whole demo, printing a short account to out.
func run(ctx context.Context, out io.Writer) (err error) {
	started := time.Now()
	env, err := setUp(ctx, out)
	if err != nil {
		return err
	}
	defer env.close()
	c, err := siphon.Connect(ctx, env.source, siphon.WithSlot(slotName), siphon.WithPublication(slotName))
	if err != nil {
		return err
	}
	defer c.Close()
	o := &orchestrator{c: c, root: env.dir, out: out}
	defer func() { err = errors.Join(err, o.dropBaseSlots()) }() // a base slot pins WAL while it exists

	w := startWorkload(ctx, env.source, 1)
	first, err := o.runChain(ctx)
	if err = errors.Join(err, w.stop()); err != nil {
		return err
	}
	if err := o.verify(ctx, first); err != nil {
		return err
	}
	if err := pointInTime(ctx, o, env, first, w.commits); err != nil {
		return err
	}
	w = startWorkload(ctx, env.source, w.next())
	_, err = o.runChain(ctx)
	if err = errors.Join(err, w.stop()); err != nil {
		return err
	}
	if err := o.retain(ctx, keepChains); err != nil {
		return err
	}
	fmt.Fprintf(out, "done in %v\n", since(started))
	return nil
}

// pointInTime restores the first chain up to a tick recorded mid-way
// through its second incremental, into a new database, and checks it holds
// exactly the ticks the source had then.
func pointInTime(ctx context.Context, o *orchestrator, env *environment, ch *chain, ticks []tickCommit) error {
	target, ok := midway(ticks, ch.ends[1], ch.ends[2])
	if !ok {
		return fmt.Errorf("point-in-time: no tick committed during the second incremental")
	}
	dsn, err := env.newDatabase(ctx)
	if err != nil {
		return err
	}
	c, err := siphon.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer c.Close()
	files, closeFiles, err := ch.open()
	if err != nil {
		return err
	}
	defer closeFiles()
	began := time.Now()
	reached, err := c.RestoreChain(ctx, siphon.RestoreChainOptions{TargetPosition: target.lsn}, files...)
	if err != nil {
		return fmt.Errorf("point-in-time restore: %w", err)
	}
	want, err := digest(ctx, env.source, target.k)
	if err != nil {
		return err
	}
	got, err := digest(ctx, dsn, -1)
	if err != nil {
		return err
	}
	verdict := "identical to the source then"
	if got != want {
		verdict = "DIFFERENT from the source then"
	}
	fmt.Fprintf(o.out, "point-in-time restore to %v (right after tick %d, mid-way through incr-0002): reached %v in %v, ticks 1..%d -> %s\n",
		target.lsn, target.k, reached, since(began), target.k, verdict)
	if got != want {
		return errors.New("the point-in-time restore differs from the source")
	}
	return nil
}

// midway returns the tick committed closest to the middle of (from, to].
func midway(ticks []tickCommit, from, to canonical.Position) (tickCommit, bool) {
	var in []tickCommit
	for _, t := range ticks {
		if t.lsn > from && t.lsn <= to {
			in = append(in, t)
		}
	}
	if len(in) == 0 {
		return tickCommit{}, false
	}
	return in[len(in)/2], true
}

// environment is the server the demo runs on, its source database and the
// chain directory, and how to remove them.
type environment struct {
	srv      *siphontest.Server
	source   string
	dir      string
	cleanups []func()
}

// setUp gets a server, a source database with a ticks table, and a
// directory for the chains.
func setUp(ctx context.Context, out io.Writer) (_ *environment, err error) {
	env := &environment{}
	defer func() {
		if err != nil {
			env.close()
		}
	}()
	launched := time.Now()
	if dsn := os.Getenv("SIPHON_DSN"); dsn != "" {
		if env.srv, err = siphontest.Attach(ctx, dsn); err != nil {
			return nil, err
		}
		fmt.Fprintln(out, "server: the one SIPHON_DSN names, in new databases")
	} else {
		if env.srv, err = siphontest.Launch(ctx); err != nil {
			return nil, fmt.Errorf("start an embedded PostgreSQL (or set SIPHON_DSN): %w", err)
		}
		srv := env.srv
		env.cleanups = append(env.cleanups, func() { srv.Close() })
		fmt.Fprintf(out, "server: embedded throwaway PostgreSQL, ready in %v\n", since(launched))
	}
	if env.source, err = env.newDatabase(ctx); err != nil {
		return nil, err
	}
	if err = exec(ctx, env.source, `CREATE TABLE ticks (k int PRIMARY KEY, at timestamptz NOT NULL DEFAULT clock_timestamp(), note text)`); err != nil {
		return nil, err
	}
	if env.dir, err = os.MkdirTemp("", "siphon-backup-chain-*"); err != nil {
		return nil, err
	}
	dir := env.dir
	env.cleanups = append(env.cleanups, func() { os.RemoveAll(dir) })
	return env, nil
}

// newDatabase creates a database on the server, dropped at close.
func (e *environment) newDatabase(ctx context.Context) (string, error) {
	dsn, drop, err := e.srv.CreateDatabase(ctx)
	if err != nil {
		return "", err
	}
	e.cleanups = append(e.cleanups, func() { drop(context.Background()) })
	return dsn, nil
}

// close removes what the demo made, newest first.
func (e *environment) close() {
	for i := len(e.cleanups) - 1; i >= 0; i-- {
		e.cleanups[i]()
	}
}

func since(t time.Time) time.Duration { return time.Since(t).Round(time.Millisecond) }

func size(n int64) string {
	if n >= 1<<20 {
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	}
	return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
}

// rel names a path by its place in the chain directory.
func rel(root, path string) string {
	if r, err := filepath.Rel(root, path); err == nil {
		return r
	}
	return path
}

// orchestrator takes chains of backups into numbered directories under
// root: chain-0001/base.siphon, chain-0001/incr-0001.jsonl, ...
type orchestrator struct {
	c      *siphon.Conn
	root   string
	out    io.Writer
	chains []*chain
}

// chain is one chain's files, in order, and the Position each ends at.
type chain struct {
	n        int
	dir      string
	files    []string
	ends     []canonical.Position
	last     siphon.ChainLink // what the next incremental continues
	baseSlot string           // the physical base slot that pins the chain's WAL
}

// runChain starts a chain with a base backup, then takes its incrementals
// on the interval.
func (o *orchestrator) runChain(ctx context.Context) (*chain, error) {
	ch := &chain{n: len(o.chains) + 1}
	ch.dir = filepath.Join(o.root, fmt.Sprintf("chain-%04d", ch.n))
	if err := os.MkdirAll(ch.dir, 0o700); err != nil {
		return nil, err
	}
	o.chains = append(o.chains, ch)
	if err := o.base(ctx, ch); err != nil {
		return nil, err
	}
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for i := 1; i <= incrementals; i++ {
		select {
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		case <-tick.C:
		}
		if err := o.incremental(ctx, ch, i); err != nil {
			return nil, err
		}
	}
	return ch, nil
}

// base writes the chain's base backup, with a base slot.
func (o *orchestrator) base(ctx context.Context, ch *chain) error {
	path := filepath.Join(ch.dir, "base.siphon")
	n, err := writeFile(path, func(w io.Writer) error {
		return o.c.Backup(ctx, siphon.BackupOptions{StartChain: true, BaseSlot: true}, w)
	})
	if err != nil {
		return fmt.Errorf("base backup: %w", err)
	}
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	rep, err := o.c.Verify(ctx, f)
	if err != nil {
		return err
	}
	if rep.Base != nil {
		ch.baseSlot = rep.Base.Slot
	}
	ch.files, ch.ends, ch.last = append(ch.files, path), append(ch.ends, rep.Start), rep.ChainLink()
	fmt.Fprintf(o.out, "%-26s base         at %-12v %9s  (base slot %s)\n", rel(o.root, path), rep.Start, size(n), ch.baseSlot)
	return nil
}

// incremental writes the chain's i-th incremental, from where it ends,
// naming the link before it.
func (o *orchestrator) incremental(ctx context.Context, ch *chain, i int) error {
	path := filepath.Join(ch.dir, fmt.Sprintf("incr-%04d.jsonl", i))
	start := ch.last.End
	var next siphon.ChainLink
	n, err := writeFile(path, func(w io.Writer) (err error) {
		next, err = o.c.BackupIncrementalAfter(ctx, ch.last, w)
		return err
	})
	if err != nil {
		return fmt.Errorf("incremental %d: %w", i, err)
	}
	ch.files, ch.ends, ch.last = append(ch.files, path), append(ch.ends, next.End), next
	fmt.Fprintf(o.out, "%-26s incremental  %v -> %v  %9s\n", rel(o.root, path), start, next.End, size(n))
	return nil
}

// verify checks a chain's files as one chain.
func (o *orchestrator) verify(ctx context.Context, ch *chain) error {
	files, closeFiles, err := ch.open()
	if err != nil {
		return err
	}
	defer closeFiles()
	rep, err := o.c.VerifyChain(ctx, files...)
	if err != nil {
		return err
	}
	if !rep.OK {
		return fmt.Errorf("verify chain-%04d: %v", ch.n, rep.Problems)
	}
	fmt.Fprintf(o.out, "verify chain-%04d: OK, %d links, contiguous from %v to %v\n", ch.n, len(rep.Links), rep.Start, rep.End)
	return nil
}

// retain deletes all but the newest keep chains, and drops their base
// slots: nothing needs their WAL any more.
func (o *orchestrator) retain(ctx context.Context, keep int) error {
	for len(o.chains) > keep {
		ch := o.chains[0]
		var bytes int64
		for _, f := range ch.files {
			if st, err := os.Stat(f); err == nil {
				bytes += st.Size()
			}
		}
		if err := os.RemoveAll(ch.dir); err != nil {
			return err
		}
		if ch.baseSlot != "" {
			if err := o.c.DropSlot(ctx, ch.baseSlot); err != nil {
				return err
			}
		}
		o.chains = o.chains[1:]
		fmt.Fprintf(o.out, "retention (keep %d): deleted chain-%04d (%d files, %s), dropped base slot %s\n",
			keep, ch.n, len(ch.files), size(bytes), ch.baseSlot)
	}
	return nil
}

// dropBaseSlots drops the base slots of the chains still kept: the demo's
// chains go away with it.
func (o *orchestrator) dropBaseSlots() error {
	var errs []error
	for _, ch := range o.chains {
		if ch.baseSlot != "" {
			errs = append(errs, o.c.DropSlot(context.Background(), ch.baseSlot))
		}
	}
	return errors.Join(errs...)
}

// open opens the chain's files in order; closeFiles closes them.
func (ch *chain) open() (files []io.ReadSeeker, closeFiles func(), err error) {
	var opened []*os.File
	closeFiles = func() {
		for _, f := range opened {
			f.Close()
		}
	}
	for _, path := range ch.files {
		f, err := os.Open(path)
		if err != nil {
			closeFiles()
			return nil, nil, err
		}
		opened, files = append(opened, f), append(files, f)
	}
	return files, closeFiles, nil
}

// writeFile writes a new file with write, synced, and returns its size. A
// failed write removes it.
func writeFile(path string, write func(io.Writer) error) (int64, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return 0, err
	}
	err = write(f)
	if err == nil {
		err = f.Sync()
	}
	st, serr := f.Stat()
	if cerr := f.Close(); err == nil {
		err = errors.Join(serr, cerr)
	}
	if err != nil {
		os.Remove(path)
		return 0, err
	}
	return st.Size(), nil
}

// tickCommit is one committed tick and pg_current_wal_insert_lsn() read
// right after its commit: a Position between it and the next tick.
type tickCommit struct {
	k   int
	lsn canonical.Position
}

// workload commits one tick per transaction until stopped. commits is
// readable once stop has returned.
type workload struct {
	cancel  context.CancelFunc
	done    chan error
	first   int
	commits []tickCommit
}

// startWorkload starts the writer at tick first, owned by the caller until
// stop.
func startWorkload(ctx context.Context, dsn string, first int) *workload {
	ctx, cancel := context.WithCancel(ctx)
	w := &workload{cancel: cancel, done: make(chan error, 1), first: first}
	go func() { w.done <- w.write(ctx, dsn) }()
	return w
}

// next is the tick after the last one committed (once stopped).
func (w *workload) next() int {
	if len(w.commits) == 0 {
		return w.first
	}
	return w.commits[len(w.commits)-1].k + 1
}

func (w *workload) write(ctx context.Context, dsn string) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	pace := time.NewTicker(20 * time.Millisecond)
	defer pace.Stop()
	// A stop takes effect between ticks only: a tick is either committed and
	// recorded, or not begun, so the next workload starts after it.
	for k := w.first; ; k++ {
		var lsn string
		_, err := conn.Exec(context.Background(), "INSERT INTO ticks (k, note) VALUES ($1, repeat('x', $1 % 50))", k)
		if err == nil {
			err = conn.QueryRow(context.Background(), "SELECT pg_current_wal_insert_lsn()::text").Scan(&lsn)
		}
		if err != nil {
			return fmt.Errorf("workload, tick %d: %w", k, err)
		}
		pos, err := canonical.ParsePosition(lsn)
		if err != nil {
			return err
		}
		w.commits = append(w.commits, tickCommit{k: k, lsn: pos})
		select {
		case <-ctx.Done():
			return nil
		case <-pace.C:
		}
	}
}

// stop stops the writer and waits for it.
func (w *workload) stop() error {
	w.cancel()
	return <-w.done
}

// digest fingerprints the ticks table's rows, those up to tick upTo (all
// with a negative upTo).
func digest(ctx context.Context, dsn string, upTo int) (string, error) {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return "", err
	}
	defer conn.Close(context.Background())
	var sum string
	err = conn.QueryRow(ctx, `SELECT count(*) || ' ' || coalesce(md5(string_agg(t::text, '|' ORDER BY t::text)), '')
		FROM ticks t WHERE $1 < 0 OR k <= $1`, upTo).Scan(&sum)
	return sum, err
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
