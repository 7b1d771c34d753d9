package siphon_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/siphondb/siphon"
	"github.com/siphondb/siphon/canonical"
	"github.com/siphondb/siphon/siphontest"
)

// TestSourceRestartMidStreamLosesNothing runs the change data capture loop
// of the fault test (StreamChanges into ConsumeCanonical, acknowledging a
// transaction once the target holds it) in this process, while a workload
// commits on the source, and restarts the source server (a fast shutdown,
// as pg_ctl restart -m fast) at different moments: while emit holds a
// transaction's Begin, while it holds a commit the target applied but the
// slot was not told of, and at a random moment. Each restart must reach the
// loop as a retryable *StreamInterruptedError; the loop resumes from the
// target's applied Position on the same siphon.Conn, the workload
// reconnects, and in the end the target holds exactly the source's data,
// every transaction applied once, with nothing left behind.
func TestSourceRestartMidStreamLosesNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rounds := envInt(t, "SIPHON_RESTART_ROUNDS", 2)
	srv := siphontest.Start(t, siphontest.WithPrivateServer())
	if srv.Source() != "local" {
		t.Skipf("siphontest restarts only the servers it runs itself, not %s ones", srv.Source())
	}
	// The target lives on another server: only the source restarts.
	srcDSN := srv.NewDatabase(t)
	tgtDSN, tgtConn := newDatabase(t)
	srcConn := connectOrFail(t, srcDSN)
	execSQL(t, srcConn, faultDDL...)
	execSQL(t, tgtConn, faultDDL...)
	slot := streamSlot(t)
	systemID := systemIdentifier(t, srcConn)
	srcConn.Close(ctx) // broken by the first restart anyway
	forgetAppliedPosition(t, tgtDSN, systemID, slot)

	src, err := siphon.Connect(ctx, srcDSN, siphon.WithSlot(slot))
	require.NoError(t, err)
	defer src.Close()
	tgt, err := siphon.Connect(ctx, tgtDSN)
	require.NoError(t, err)
	defer tgt.Close()
	_, err = src.CurrentPosition(ctx) // the slot holds every transaction from here
	require.NoError(t, err)

	began := time.Now()
	load := startWorkload(t, srcDSN, time.Millisecond, true, (&faultTransactions{}).next)
	progress := &heldProgress{}
	loop := startRestartLoop(ctx, src, tgt, systemID, slot, progress)

	restarts, held := 0, 0
	var slowest time.Duration
	for range rounds {
		for _, moment := range []string{markBegin, markCommit, ""} {
			// Let the loop apply something since the previous restart.
			awaitAppliedCount(t, progress, progress.applied.Load()+20, loop)
			var took time.Duration
			if moment == "" {
				time.Sleep(rand.N(200 * time.Millisecond)) // a random moment, on purpose
				began := time.Now()
				require.NoError(t, srv.Restart(ctx))
				took = time.Since(began)
			} else {
				took = restartWhileHeld(t, srv, progress, moment, loop)
				held++
			}
			slowest = max(slowest, took)
			restarts++
		}
	}
	awaitAppliedCount(t, progress, progress.applied.Load()+20, loop)
	require.NoError(t, load.stop())

	srcConn = connectOrFail(t, srcDSN)
	var endLSN string
	require.NoError(t, srcConn.QueryRow(ctx, `
		WITH r AS (INSERT INTO fault_accounts VALUES (-1, 0, 'end') RETURNING 1)
		SELECT pg_logical_emit_message(true, $1, 'end')::text FROM r`, faultEndPrefix).Scan(&endLSN))
	res := loop.wait(t)
	t.Logf("%d restarts survived (%d with emit holding a transaction; the slowest took %v), %d interruptions seen by the loop, "+
		"%d transactions applied, %d source transactions committed (%d failed and were not retried, %d workload reconnections), %v",
		restarts, held, slowest.Round(time.Millisecond), res.interrupted, progress.applied.Load(), load.committed, load.failed,
		load.reconnects, time.Since(began).Round(time.Millisecond))

	assert.GreaterOrEqual(t, res.interrupted, held, "every restart while emit held the stream reached the loop as a *StreamInterruptedError")
	applied, err := tgt.AppliedPositionFor(ctx, systemID, slot)
	require.NoError(t, err)
	assert.Equal(t, res.end, applied, "the target stands at the source's last commit")
	msgLSN, err := canonical.ParsePosition(endLSN)
	require.NoError(t, err)
	assert.Greater(t, applied, msgLSN, "the last commit ends after its message")
	for _, table := range []string{"fault_events", "fault_accounts"} {
		assert.Equal(t, digest(t, srcConn, table), digest(t, tgtConn, table), table)
	}
	var events int64
	require.NoError(t, srcConn.QueryRow(ctx, "SELECT count(*) FROM fault_events").Scan(&events))
	assert.GreaterOrEqual(t, events, load.events, "every event the workload saw committed is on the source")
	assert.LessOrEqual(t, events, load.events+load.unsureEvents, "and no other but those of unanswered commits")
	assert.Equal(t, [][]*string(nil), rawRows(t, tgtConn,
		"SELECT seq::text, count(*)::text FROM fault_events GROUP BY seq HAVING count(*) > 1 ORDER BY seq LIMIT 10"),
		"no source transaction applied twice")
	require.NoError(t, src.Close())
	require.NoError(t, tgt.Close())
	assertNoLeaks(t, srcDSN, slot)
}

// TestSourceFastShutdownWithIdleStream restarts the source while a stream
// is idle after its last transaction and a session holds a transaction
// open: the shutdown ends that transaction, so the walsender's last WAL
// record is past the last commit, a position siphon does not confirm. The
// restart must still be fast (the walsender waits for a confirmation before
// it exits), and the stream must end with a retryable error from which it
// resumes with nothing lost or repeated.
func TestSourceFastShutdownWithIdleStream(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := siphontest.Start(t, siphontest.WithPrivateServer())
	if srv.Source() != "local" {
		t.Skipf("siphontest restarts only the servers it runs itself, not %s ones", srv.Source())
	}
	dsn := srv.NewDatabase(t)
	admin := connectOrFail(t, dsn)
	execSQL(t, admin, "CREATE TABLE t (id int PRIMARY KEY)")
	c, slot, from := streamConnAt(t, dsn)
	execSQL(t, admin, "INSERT INTO t VALUES (1)")

	commits := make(chan canonical.Position, 10)
	streamed := make(chan error, 1)
	go func() {
		_, err := c.StreamChanges(ctx, from, func(ch canonical.Change) error {
			if ch.Op == canonical.OpCommit {
				commits <- ch.Position
			}
			return nil
		})
		streamed <- err
	}()
	first := <-commits
	execSQL(t, admin, "BEGIN", "INSERT INTO t VALUES (2)") // ended by the shutdown

	restartCtx, cancel := context.WithTimeout(ctx, waitDeadline)
	defer cancel()
	began := time.Now()
	require.NoError(t, srv.Restart(restartCtx), "the stream does not hold the shutdown")
	t.Logf("restart with an idle stream: %v", time.Since(began).Round(time.Millisecond))
	var intr *siphon.StreamInterruptedError
	select {
	case err := <-streamed:
		require.ErrorAs(t, err, &intr)
		assert.ErrorAs(t, err, new(*siphon.StreamInterruptedError))
	case <-time.After(waitDeadline):
		t.Fatal("the stream did not end when its server restarted")
	}
	assert.Equal(t, first, intr.Position, "resume from the last transaction handled")

	admin = connectOrFail(t, dsn)
	execSQL(t, admin, "INSERT INTO t VALUES (3)")
	var rows []string
	runCtx, stop := context.WithCancel(ctx)
	_, err := c.StreamChanges(runCtx, intr.Position, func(ch canonical.Change) error {
		if ch.Op == canonical.OpInsert {
			rows = append(rows, ch.New[0].String())
		}
		if ch.Op == canonical.OpCommit {
			stop()
		}
		return nil
	})
	require.NoError(t, err)
	assert.Equal(t, []string{"3"}, rows, "the resumed stream holds the later transaction alone")
	require.NoError(t, c.Close())
	assertNoLeaks(t, dsn, slot)
}

// restartWhileHeld restarts srv while the loop's emit is held at the next
// progress mark of kind, and returns how long the restart took. The
// walsender of a fast shutdown waits until the client confirms what it was
// sent, so emit is released once the shutdown is under way (the server
// refuses new sessions), not after the restart.
func restartWhileHeld(t *testing.T, srv *siphontest.Server, progress *heldProgress, kind string, loop *restartLoop) time.Duration {
	t.Helper()
	hit, release := progress.holdAt(kind)
	released := false
	defer func() {
		if !released {
			close(release)
		}
	}()
	select {
	case <-hit:
	case <-loop.done:
		t.Fatalf("the loop ended before a %q mark: %v", kind, loop.err)
	case <-time.After(waitDeadline):
		t.Fatalf("no %q mark within %v", kind, waitDeadline)
	}
	began := time.Now()
	restarted := make(chan error, 1)
	go func() { restarted <- srv.Restart(context.Background()) }()
	waitFor(t, "the server refuses sessions once it shuts down", func() bool { return !accepts(srv.DSN()) })
	close(release)
	released = true
	select {
	case err := <-restarted:
		require.NoError(t, err)
	case <-time.After(waitDeadline):
		t.Fatalf("the restart did not end within %v", waitDeadline)
	}
	return time.Since(began)
}

// accepts reports whether the server takes a new session.
func accepts(dsn string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return false
	}
	conn.Close(ctx)
	return true
}

// awaitAppliedCount waits until the loop has applied n transactions.
func awaitAppliedCount(t *testing.T, progress *heldProgress, n int64, loop *restartLoop) {
	t.Helper()
	deadline := time.After(waitDeadline)
	for progress.applied.Load() < n {
		select {
		case <-loop.done:
			t.Fatalf("the loop ended after %d transactions: %v", progress.applied.Load(), loop.err)
		case <-deadline:
			t.Fatalf("the loop applied %d transactions, not %d, within %v", progress.applied.Load(), n, waitDeadline)
		case <-time.After(time.Millisecond):
		}
	}
}

// heldProgress is the progress writer of captureOnce: it counts the
// transactions applied and, when asked, holds the stream (emit) at the next
// mark of a kind until released.
type heldProgress struct {
	applied atomic.Int64

	mu      sync.Mutex
	kind    string // the mark to hold at, "" for none
	hit     chan struct{}
	release chan struct{}
}

// holdAt makes the stream stop at the next mark of kind: hit is closed when
// it does, and it goes on once release is closed.
func (p *heldProgress) holdAt(kind string) (hit chan struct{}, release chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.kind, p.hit, p.release = kind, make(chan struct{}), make(chan struct{})
	return p.hit, p.release
}

// Write takes one mark line (captureOnce writes each with one Fprintln).
func (p *heldProgress) Write(b []byte) (int, error) {
	kind, _, _ := strings.Cut(strings.TrimSpace(string(b)), " ")
	if kind == markCommit {
		p.applied.Add(1)
	}
	p.mu.Lock()
	if p.kind == "" || kind != p.kind {
		p.mu.Unlock()
		return len(b), nil
	}
	p.kind = ""
	hit, release := p.hit, p.release
	p.mu.Unlock()
	close(hit)
	<-release
	return len(b), nil
}

// restartLoop runs captureOnce until the end message is applied, retrying
// the errors a restart may cause.
type restartLoop struct {
	done chan struct{}
	err  error
	res  restartLoopResult
}

type restartLoopResult struct {
	end         canonical.Position
	interrupted int // *StreamInterruptedError errors retried
}

func startRestartLoop(ctx context.Context, src, tgt *siphon.Conn, systemID, slot string, progress *heldProgress) *restartLoop {
	l := &restartLoop{done: make(chan struct{})}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute) // the whole test: only a hang reaches it
	go func() {
		defer close(l.done)
		defer cancel()
		l.res, l.err = l.run(ctx, src, tgt, systemID, slot, progress)
	}()
	return l
}

func (l *restartLoop) run(ctx context.Context, src, tgt *siphon.Conn, systemID, slot string, progress *heldProgress) (restartLoopResult, error) {
	var res restartLoopResult
	for {
		end, err := captureOnce(ctx, src, tgt, systemID, slot, progress)
		if err == nil {
			res.end = end
			return res, nil
		}
		var intr *siphon.StreamInterruptedError
		switch {
		case errors.As(err, &intr):
			res.interrupted++
			// The target may be past the slot's acknowledgement, never behind it.
			applied, aerr := tgt.AppliedPositionFor(ctx, systemID, slot)
			if aerr == nil && intr.Position > applied {
				return res, fmt.Errorf("interrupted at %v, ahead of the target's %v: %w", intr.Position, applied, err)
			}
		case errors.Is(err, siphon.ErrSlotInUse), errors.Is(err, siphon.ErrApplyInProgress):
		default:
			return res, fmt.Errorf("not a retryable error: %w", err)
		}
		select {
		case <-ctx.Done():
			return res, fmt.Errorf("%w (last error: %v)", ctx.Err(), err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// wait returns the loop's result once it has applied the end message.
func (l *restartLoop) wait(t *testing.T) restartLoopResult {
	t.Helper()
	select {
	case <-l.done:
	case <-time.After(waitDeadline):
		t.Fatalf("the loop did not apply the end message within %v", waitDeadline)
	}
	require.NoError(t, l.err)
	return l.res
}
