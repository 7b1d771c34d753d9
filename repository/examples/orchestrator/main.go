// Command orchestrator is a backup orchestrator on package repository: a
// chain a "day" (a base backup), a link an "hour" (an incremental) while
// the database is written to, every chain verified, a restore drill as of
// a time into a new database, and retention that expires the old chain and
// drops its base slot. The days and hours are compressed to fractions of a
// second; the rest is as in production.
//
//	go run ./examples/orchestrator
//
// With SIPHON_DSN unset it starts an embedded throwaway PostgreSQL (local
// server binaries, see package siphontest) and removes it at the end; with
// SIPHON_DSN set it works on that server, in new databases it drops at the
// end (the role needs REPLICATION and CREATEDB). The repository goes to a
// temporary directory (removed at the end) unless SIPHON_REPOSITORY_URL
// names a bucket ("s3://...", kept). It is encrypted with a key made for the
// run: keep yours in a secret store, never in the bucket.
package main

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/siphondb/siphon"
	"github.com/siphondb/siphon/repository"
	"github.com/siphondb/siphon/siphontest"
)

// The schedule and the retention policy.
const (
	slotName     = "siphon_orchestrator"
	days         = 2                      // chains
	hours        = 3                      // links after each base
	hour         = 300 * time.Millisecond // between links
	keepChains   = 1                      // retention: the newest chains kept
	workloadPace = 20 * time.Millisecond
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// The demo takes seconds; this bounds it on a slow machine. Its test
	// calls run without it: the test binary's timeout bounds a hang there,
	// and a busy machine is no hang.
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := run(ctx, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "orchestrator:", err)
		os.Exit(1)
	}
}

// run does the whole demo, printing an account to out.
func run(ctx context.Context, out io.Writer) (err error) {
	env, err := setUp(ctx, out)
	if err != nil {
		return err
	}
	defer env.close()

	key := make([]byte, 32)
	_, _ = rand.Read(key)
	repo, err := repository.Open(ctx, env.bucket, repository.WithKey(key))
	if err != nil {
		return err
	}
	defer repo.Close()
	// The demo's workload runs no DDL; a source whose schema changes must
	// reach the restores has a superuser call InstallSchemaCapture once.
	src, err := siphon.Connect(ctx, env.source, siphon.WithSlot(slotName), siphon.WithPublication(slotName), repo.StreamKey(),
		siphon.WithoutSchemaCapture())
	if err != nil {
		return err
	}
	defer src.Close()
	defer func() { err = errors.Join(err, dropRemaining(repo, src)) }() // a demo leaves no slot pinning WAL

	w := startWorkload(ctx, env.source)
	var first *repository.Chain
	for day := 1; day <= days; day++ {
		chain, err := oneDay(ctx, repo, src, out)
		if err != nil {
			return errors.Join(err, w.stop())
		}
		if day == 1 {
			first = chain
		}
	}
	if err := w.stop(); err != nil {
		return err
	}
	if err := list(ctx, repo, out); err != nil {
		return err
	}
	if err := drill(ctx, repo, env, first, w.ticks, out); err != nil {
		return err
	}
	rep, err := repo.Expire(ctx, src, repository.ExpireOptions{KeepChains: keepChains})
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "retention (keep %d): expired %v, dropped base slots %v, kept %v\n", keepChains, rep.Expired, rep.DroppedSlots, rep.Kept)
	return list(ctx, repo, out)
}

// oneDay starts a chain, adds a link each hour, and verifies the chain.
func oneDay(ctx context.Context, repo *repository.Repository, src *siphon.Conn, out io.Writer) (*repository.Chain, error) {
	chain, err := repo.StartChain(ctx, src, repository.StartChainOptions{})
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(out, "chain %s: base at %v, %s (base slot %s)\n", chain.ID, chain.Start, size(chain.Links[0].StoredBytes), chain.BaseSlot)
	tick := time.NewTicker(hour)
	defer tick.Stop()
	for range hours {
		select {
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		case <-tick.C:
		}
		if chain, err = repo.AddLink(ctx, src, chain.ID); err != nil {
			return nil, err
		}
		l := chain.Links[len(chain.Links)-1]
		fmt.Fprintf(out, "  link %d: %v -> %v, %d transactions, %s stored (%s of JSONL)\n",
			l.N, l.Start, l.End, l.Transactions, size(l.StoredBytes), size(l.Bytes))
	}
	rep, err := repo.Verify(ctx, chain.ID, repository.VerifyOptions{})
	if err != nil {
		return nil, err
	}
	if !rep.OK {
		return nil, fmt.Errorf("chain %s does not verify: %v", chain.ID, rep.Problems)
	}
	fmt.Fprintf(out, "  verified: OK, %d links\n", rep.Generation)
	return chain, nil
}

// list prints the repository's chains.
func list(ctx context.Context, repo *repository.Repository, out io.Writer) error {
	chains, err := repo.Chains(ctx)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "repository: %d chains\n", len(chains))
	for _, c := range chains {
		verified := "not verified"
		if c.Verified != nil && c.Verified.OK {
			verified = "verified"
		}
		fmt.Fprintf(out, "  %s  %d links  %v -> %v  %s  %s\n", c.ID, len(c.Links), c.Start, c.End, size(c.StoredBytes), verified)
	}
	return nil
}

// drill restores the first chain as of the time right after a tick
// committed mid-way through it, into a new database, and checks it holds
// exactly the ticks the source had then.
func drill(ctx context.Context, repo *repository.Repository, env *environment, chain *repository.Chain, ticks []tick, out io.Writer) error {
	var in []tick
	for _, t := range ticks {
		if t.at.After(chain.Links[1].Created) && t.at.Before(chain.Covered) {
			in = append(in, t)
		}
	}
	if len(in) == 0 {
		return errors.New("restore drill: no tick committed during the first chain")
	}
	target := in[len(in)/2]
	dsn, err := env.newDatabase(ctx)
	if err != nil {
		return err
	}
	c, err := siphon.Connect(ctx, dsn, repo.StreamKey())
	if err != nil {
		return err
	}
	defer c.Close()
	began := time.Now()
	rep, err := repo.Restore(ctx, c, repository.RestoreOptions{Time: target.at})
	if err != nil {
		return fmt.Errorf("restore drill: %w", err)
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
	fmt.Fprintf(out, "restore drill: chain %s as of %s (right after tick %d): %d links read, reached %v in %v, ticks 1..%d -> %s\n",
		rep.Chain, target.at.UTC().Format(time.RFC3339Nano), target.k, rep.Links, rep.Reached, time.Since(began).Round(time.Millisecond), target.k, verdict)
	if got != want {
		return errors.New("the restore drill differs from the source")
	}
	return nil
}

// dropRemaining drops the base slots of the chains the demo keeps: in
// production they stay until Expire removes their chains.
func dropRemaining(repo *repository.Repository, src *siphon.Conn) error {
	ctx := context.Background()
	chains, err := repo.Chains(ctx)
	if err != nil {
		return err
	}
	var errs []error
	for _, c := range chains {
		if c.BaseSlot != "" {
			errs = append(errs, src.DropSlot(ctx, c.BaseSlot))
		}
	}
	return errors.Join(append(errs, src.Detach(ctx))...)
}

// environment is the server, the source database and the bucket.
type environment struct {
	srv      *siphontest.Server
	source   string
	bucket   string
	cleanups []func()
}

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
		if env.srv, err = siphontest.Launch(ctx); err != nil {
			return nil, fmt.Errorf("start an embedded PostgreSQL (or set SIPHON_DSN): %w", err)
		}
		srv := env.srv
		env.cleanups = append(env.cleanups, func() { srv.Close() })
		fmt.Fprintln(out, "server: embedded throwaway PostgreSQL")
	}
	if env.source, err = env.newDatabase(ctx); err != nil {
		return nil, err
	}
	if err = exec(ctx, env.source, `CREATE TABLE ticks (k int PRIMARY KEY, at timestamptz NOT NULL DEFAULT clock_timestamp(), note text)`); err != nil {
		return nil, err
	}
	env.bucket = os.Getenv("SIPHON_REPOSITORY_URL")
	if env.bucket == "" {
		dir, err := os.MkdirTemp("", "siphon-orchestrator-*")
		if err != nil {
			return nil, err
		}
		env.cleanups = append(env.cleanups, func() { os.RemoveAll(dir) })
		env.bucket = "file://" + dir + "?no_tmp_dir=true&metadata=skip"
		fmt.Fprintln(out, "bucket: a temporary directory")
	} else {
		fmt.Fprintln(out, "bucket: the one SIPHON_REPOSITORY_URL names")
	}
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

func (e *environment) close() {
	for i := len(e.cleanups) - 1; i >= 0; i-- {
		e.cleanups[i]()
	}
}

func size(n int64) string {
	if n >= 1<<20 {
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	}
	return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
}

// tick is one committed tick and the server's clock read right after its
// commit: a time between it and the next tick.
type tick struct {
	k  int
	at time.Time
}

// workload commits one tick per transaction until stopped; ticks is
// readable once stop has returned.
type workload struct {
	cancel context.CancelFunc
	done   chan error
	ticks  []tick
}

func startWorkload(ctx context.Context, dsn string) *workload {
	ctx, cancel := context.WithCancel(ctx)
	w := &workload{cancel: cancel, done: make(chan error, 1)}
	go func() { w.done <- w.write(ctx, dsn) }()
	return w
}

func (w *workload) write(ctx context.Context, dsn string) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	pace := time.NewTicker(workloadPace)
	defer pace.Stop()
	for k := 1; ; k++ {
		var at time.Time
		_, err := conn.Exec(context.Background(), "INSERT INTO ticks (k, note) VALUES ($1, repeat('x', $1 % 50))", k)
		if err == nil {
			err = conn.QueryRow(context.Background(), "SELECT clock_timestamp()").Scan(&at)
		}
		if err != nil {
			return fmt.Errorf("workload, tick %d: %w", k, err)
		}
		w.ticks = append(w.ticks, tick{k: k, at: at})
		select {
		case <-ctx.Done():
			return nil
		case <-pace.C:
		}
	}
}

func (w *workload) stop() error {
	w.cancel()
	return <-w.done
}

// digest fingerprints the ticks up to upTo (all with a negative upTo).
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
