package siphon_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/siphondb/siphon"
	"github.com/siphondb/siphon/canonical"
)

// replicaRun is a Replicate running in the background.
type replicaRun struct {
	cancel context.CancelFunc
	done   chan struct{}
	pos    canonical.Position
	err    error
}

// startReplicate runs src.Replicate(target) until stopped.
func startReplicate(t *testing.T, src, target *siphon.Conn, opts siphon.ReplicateOptions) *replicaRun {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &replicaRun{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		r.pos, r.err = src.Replicate(ctx, target, opts)
	}()
	t.Cleanup(func() { r.stop() })
	return r
}

// stop cancels the run and returns what Replicate returned.
func (r *replicaRun) stop() (canonical.Position, error) {
	r.cancel()
	<-r.done
	return r.pos, r.err
}

// waitApplied waits until target has applied src up to pos, or the run
// ended.
func waitApplied(t *testing.T, target *siphon.Conn, systemID, slot string, pos canonical.Position, r *replicaRun) {
	t.Helper()
	waitFor(t, fmt.Sprintf("the target reaches %v", pos), func() bool {
		select {
		case <-r.done:
			require.NoError(t, r.err, "Replicate stopped")
		default:
		}
		applied, err := target.AppliedPositionFor(context.Background(), systemID, slot)
		require.NoError(t, err)
		return applied >= pos
	})
}

// TestReplicateMigratesARealSchema migrates the shop live: Replicate with
// an initial snapshot into a target that has the shop's schema (triggers,
// foreign keys, partitions), while the workload goes on (TRUNCATE ...
// CASCADE during the initial copy included); once the target has caught
// up, the target equals the source. Progress reports come with
// counts, and a cancelled Replicate returns the applied Position and nil.
// Started again, it continues where the target stands.
func TestReplicateMigratesARealSchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	src, c, slot := realShopSource(t)
	systemID := systemIdentifier(t, src)
	dstDSN, dst := realShopTarget(t)
	target, err := siphon.Connect(ctx, dstDSN)
	require.NoError(t, err)
	defer target.Close()
	forgetAppliedPosition(t, dstDSN, systemID, slot)

	var mu sync.Mutex
	var reports []siphon.ReplicateProgress
	run := startReplicate(t, c, target, siphon.ReplicateOptions{Snapshot: true, ProgressInterval: 50 * time.Millisecond,
		Progress: func(p siphon.ReplicateProgress) {
			mu.Lock()
			defer mu.Unlock()
			reports = append(reports, p)
		}})
	// While the snapshot is taken (a TRUNCATE during the copy, in round 3,
	// makes Replicate take a new one), then while it streams.
	realShopRound(t, src, 2)
	realShopRound(t, src, 3)
	waitApplied(t, target, systemID, slot, 1, run)
	for k := 4; k <= 6; k++ {
		realShopRound(t, src, k)
	}
	waitApplied(t, target, systemID, slot, sourceMark(t, src), run)
	pos, err := run.stop()
	require.NoError(t, err, "cancelling is the normal stop")
	assertSameAsSource(t, src, dst, "migrated live")
	applied, err := target.AppliedPositionFor(ctx, systemID, slot)
	require.NoError(t, err)
	assert.Equal(t, applied, pos, "Replicate returns the applied Position")
	mu.Lock()
	require.NotEmpty(t, reports)
	last := reports[len(reports)-1]
	mu.Unlock()
	assert.Positive(t, last.Transactions)
	assert.Positive(t, last.Changes)
	assert.NotZero(t, last.SourceEnd)

	// Started again: it continues from the target's Position, snapshot or not.
	realShopRound(t, src, 7)
	run = startReplicate(t, c, target, siphon.ReplicateOptions{Snapshot: true})
	waitApplied(t, target, systemID, slot, sourceMark(t, src), run)
	_, err = run.stop()
	require.NoError(t, err)
	assertSameAsSource(t, src, dst, "after a second run")
	require.NoError(t, c.Detach(ctx))
}

// sourceMark returns a Position that a target which applied every
// transaction committed on conn so far reaches: the WAL insert position,
// read before a transaction (a logical decoding message) that ends past it
// and that every stream carries. (The insert position alone may never be
// reached: other databases of the server write WAL too.)
func sourceMark(t *testing.T, conn *pgx.Conn) canonical.Position {
	t.Helper()
	pos := insertPosition(t, conn)
	execSQL(t, conn, `SELECT pg_logical_emit_message(true, 'siphon_test.mark', '')`)
	return pos
}

// The environment of the replicate child, the test binary in child mode
// "replicate".
const (
	replicaChildSource = "SIPHON_REPLICA_CHILD_SOURCE"
	replicaChildTarget = "SIPHON_REPLICA_CHILD_TARGET"
	replicaChildSlot   = "SIPHON_REPLICA_CHILD_SLOT"
)

func init() { childModes["replicate"] = replicateChild }

// replicateChild runs Replicate until killed (or for waitDeadline).
func replicateChild() error {
	ctx, cancel := context.WithTimeout(context.Background(), waitDeadline)
	defer cancel()
	src, err := siphon.Connect(ctx, os.Getenv(replicaChildSource), siphon.WithSlot(os.Getenv(replicaChildSlot)),
		siphon.WithStatusInterval(10*time.Millisecond))
	if err != nil {
		return err
	}
	defer src.Close()
	tgt, err := siphon.Connect(ctx, os.Getenv(replicaChildTarget))
	if err != nil {
		return err
	}
	defer tgt.Close()
	for {
		_, err := src.Replicate(ctx, tgt, siphon.ReplicateOptions{})
		switch {
		case errors.Is(err, siphon.ErrSlotInUse), errors.Is(err, siphon.ErrApplyInProgress):
			// A killed predecessor's sessions are still going: try again
			// shortly, for as long as ctx allows.
			select {
			case <-ctx.Done():
				return fmt.Errorf("%w (last error: %v)", ctx.Err(), err)
			case <-time.After(20 * time.Millisecond):
			}
		case err != nil:
			return err
		default:
			return errors.New("replicate returned before it was killed")
		}
	}
}

// TestKillReplicateAtRandomPoints runs Replicate in a child process and
// SIGKILLs it at random moments while the source keeps committing, then
// lets Replicate catch up in this process: every source transaction is in
// the target exactly once (a keyless table would show a duplicate), and
// the target equals the source. A slot acknowledged past what a killed run
// committed would lose transactions; one behind it, once resumed, would
// repeat them: both would show.
func TestKillReplicateAtRandomPoints(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rounds := envInt(t, "SIPHON_REPLICATE_KILL_ROUNDS", 12)
	srcDSN, srcConn, tgtDSN, tgtConn, slot, systemID := faultDatabases(t)
	src, err := siphon.Connect(ctx, srcDSN, siphon.WithSlot(slot))
	require.NoError(t, err)
	defer src.Close()

	load := startWorkload(t, srcDSN, time.Millisecond, false, (&faultTransactions{}).next)
	env := []string{replicaChildSource + "=" + srcDSN, replicaChildTarget + "=" + tgtDSN, replicaChildSlot + "=" + slot}
	var advanced int
	var last canonical.Position
	origin := fmt.Sprintf("siphon_%s_%s_%s", dbOID(t, tgtConn), systemID, slot)
	for round := range rounds {
		cmd := childCmd("replicate", env...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		require.NoError(t, cmd.Start())
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		// Every other kill lands at a random moment after the child's
		// first commit on the target: on a slow machine (the race
		// detector, a loaded CI) a child may take longer to start than a
		// random delay from its start.
		killAt := time.After(100*time.Millisecond + rand.N(400*time.Millisecond))
		if round%2 == 1 {
			killAt = afterTargetMovesOn(t, tgtConn, origin, last, exited)
		}
		select {
		case err := <-exited:
			t.Fatalf("the replicate child exited before it was killed: %v\nstderr: %s", err, stderr.String())
		case <-killAt:
		}
		require.NoError(t, cmd.Process.Kill())
		<-exited
		awaitReleased(t, srcConn, tgtConn, slot)
		applied := originProgress(t, tgtConn, origin)
		if applied > last {
			advanced++
		}
		last = applied
	}
	require.NoError(t, load.stop())
	target, err := siphon.Connect(ctx, tgtDSN)
	require.NoError(t, err)
	defer target.Close()
	run := startReplicate(t, src, target, siphon.ReplicateOptions{})
	waitApplied(t, target, systemID, slot, sourceMark(t, srcConn), run)
	_, err = run.stop()
	require.NoError(t, err)
	t.Logf("%d kills, %d of them after the target moved on, %d source transactions", rounds, advanced, load.committed)
	assert.Positive(t, advanced, "the killed runs applied something")
	assertAppliedOnce(t, srcConn, tgtConn)
	require.NoError(t, src.DropSlot(ctx, slot))
	require.NoError(t, src.Close())
	assertNoLeaks(t, srcDSN)
}

// afterTargetMovesOn returns a channel that fires a random moment (up to
// 100ms) after the target's progress for origin has passed last. A child
// that exits meanwhile is handed back on exited for its caller to report.
func afterTargetMovesOn(t *testing.T, tgtConn *pgx.Conn, origin string, last canonical.Position, exited chan error) <-chan time.Time {
	t.Helper()
	deadline := time.Now().Add(waitDeadline)
	for originProgress(t, tgtConn, origin) <= last {
		require.True(t, time.Now().Before(deadline), "the replicate child applied nothing within %v", waitDeadline)
		select {
		case err := <-exited:
			exited <- err
			return nil
		case <-time.After(10 * time.Millisecond):
		}
	}
	return time.After(rand.N(100 * time.Millisecond))
}

// TestReplicateRefusals checks what Replicate refuses before it applies
// anything: a nil target, a second run on one Conn, a target that holds
// another source.
func TestReplicateRefusals(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srcDSN, _ := newDatabase(t)
	c, slot := streamConn(t, srcDSN)
	_, err := c.Replicate(ctx, nil, siphon.ReplicateOptions{})
	require.ErrorIs(t, err, siphon.ErrNilArgument)

	dstDSN, _ := newDatabase(t)
	target, err := siphon.Connect(ctx, dstDSN)
	require.NoError(t, err)
	defer target.Close()
	require.NoError(t, target.MarkAppliedPosition(ctx, "4242", "elsewhere", 0x1000))
	t.Cleanup(func() { target.ResetAppliedPosition(context.Background(), "4242", "elsewhere") })
	_, err = c.Replicate(ctx, target, siphon.ReplicateOptions{})
	var gap *siphon.ApplyGapError
	require.ErrorAs(t, err, &gap, "a target that holds another source")
	assert.Contains(t, gap.Holds, "4242_elsewhere")

	freshDSN, _ := newDatabase(t)
	fresh, err := siphon.Connect(ctx, freshDSN)
	require.NoError(t, err)
	defer fresh.Close()
	forgetAppliedPosition(t, freshDSN, systemIdentifier(t, connectOrFail(t, srcDSN)), slot)
	run := startReplicate(t, c, fresh, siphon.ReplicateOptions{})
	waitFor(t, "Replicate takes the slot", func() bool { return slotActive(t, srcDSN, slot) })
	_, err = c.Replicate(ctx, fresh, siphon.ReplicateOptions{})
	require.ErrorIs(t, err, siphon.ErrAlreadyStreaming, "one stream of the slot at a time")
	_, err = run.stop()
	require.NoError(t, err)
}

// slotActive reports whether slot is in use.
func slotActive(t *testing.T, dsn, slot string) bool {
	t.Helper()
	var active bool
	err := connectOrFail(t, dsn).QueryRow(context.Background(), "SELECT active FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&active)
	return err == nil && active
}
