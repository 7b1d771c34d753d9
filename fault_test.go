package siphon_test

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/siphondb/siphon"
	"github.com/siphondb/siphon/canonical"
)

// The environment of the fault child, the test binary in child mode
// "cdc-loop".
const (
	faultChildSource = "SIPHON_FAULT_CHILD_SOURCE"
	faultChildTarget = "SIPHON_FAULT_CHILD_TARGET"
	faultChildSlot   = "SIPHON_FAULT_CHILD_SLOT"
	faultChildSystem = "SIPHON_FAULT_CHILD_SYSTEM_ID"
	// faultChildCatchUp set makes the child catch up every backlog
	// through the SQL interface, in small chunks, and report it.
	faultChildCatchUp = "SIPHON_FAULT_CHILD_CATCHUP"
)

// faultEndPrefix is the prefix of the transactional message in the last
// source transaction: the child stops once that transaction is applied.
const faultEndPrefix = "fault.end"

// The child reports its progress on stdout, a line per event, so the
// parent can tell where a kill landed: "S" the stream starts, "B <commit
// LSN>" a transaction begins, "C" it is applied in the target. The last
// child ends with "end <position>".
const (
	markStart  = "S"
	markBegin  = "B"
	markCommit = "C"
)

// With faultChildCatchUp, the child also reports "U" when a stream starts
// catching up through the SQL interface and "W" when the walsender starts
// (from the stream's log).
const (
	markCatchUp   = "U"
	markWalsender = "W"
)

var faultDDL = []string{
	// Keyless, inserts only: a transaction applied twice leaves duplicates.
	`CREATE TABLE fault_events (seq int8 NOT NULL, worker int NOT NULL, note text)`,
	`ALTER TABLE fault_events REPLICA IDENTITY FULL`,
	`CREATE TABLE fault_accounts (id int8 PRIMARY KEY, balance int8 NOT NULL, note text)`,
}

// TestKillAtRandomPointsAppliesEachTransactionOnce runs the whole change
// data capture loop (StreamChanges into ConsumeCanonical, acknowledging a
// transaction only once the target has applied it) in a child process,
// SIGKILLs it at random moments while the source keeps committing, then
// lets a last child catch up: the target must hold exactly the source's
// data, every transaction applied once, and nothing may be left behind.
func TestKillAtRandomPointsAppliesEachTransactionOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rounds := envInt(t, "SIPHON_KILL_ROUNDS", 30)
	srcDSN, srcConn, tgtDSN, tgtConn, slot, systemID := faultDatabases(t)

	env := []string{faultChildSource + "=" + srcDSN, faultChildTarget + "=" + tgtDSN,
		faultChildSlot + "=" + slot, faultChildSystem + "=" + systemID}
	began := time.Now()
	// A pace the child about keeps up with: it is mostly busy applying when
	// killed, and the last child has little to catch up.
	load := startWorkload(t, srcDSN, time.Millisecond, false, (&faultTransactions{}).next)

	origin := fmt.Sprintf("siphon_%s_%s_%s", dbOID(t, tgtConn), systemID, slot)
	tally := killTally{landed: map[string]int{}}
	for i := range rounds {
		out := runKilledChild(t, env, killMark(i), rand.N(350*time.Millisecond))
		awaitReleased(t, srcConn, tgtConn, slot)
		tally.record(t, i+1, out, srcConn, tgtConn, slot, origin)
	}
	require.NoError(t, load.stop())
	var endLSN string
	require.NoError(t, srcConn.QueryRow(ctx, `
		WITH r AS (INSERT INTO fault_accounts VALUES (-1, 0, 'end') RETURNING 1)
		SELECT pg_logical_emit_message(true, $1, 'end')::text FROM r`, faultEndPrefix).Scan(&endLSN))

	end := runLastChild(t, env)
	t.Logf("%d rounds (%d moved the slot on, %d past the target), %d source transactions, %v: kills %v",
		rounds, tally.acked, tally.ahead, load.committed, time.Since(began).Round(time.Millisecond), tally.landed)

	assertTargetAt(t, tgtDSN, systemID, slot, end, endLSN)
	assertAppliedOnce(t, srcConn, tgtConn)
	assertNoLeaks(t, srcDSN, slot)
}

// assertTargetAt checks that the target tgtDSN has applied the source
// (systemID, slot) up to end, the last commit, which ends after the
// message written at endLSN.
func assertTargetAt(t *testing.T, tgtDSN, systemID, slot string, end canonical.Position, endLSN string) {
	t.Helper()
	ctx := context.Background()
	tgt, err := siphon.Connect(ctx, tgtDSN)
	require.NoError(t, err)
	applied, err := tgt.AppliedPositionFor(ctx, systemID, slot)
	tgt.Close()
	require.NoError(t, err)
	assert.Equal(t, end, applied, "the target stands at the source's last commit")
	msgLSN, err := canonical.ParsePosition(endLSN)
	require.NoError(t, err)
	assert.Greater(t, applied, msgLSN, "the last commit ends after its message")
}

// assertAppliedOnce checks that the target holds the source's fault
// tables exactly: every source transaction applied once (the keyless
// events would show a duplicate).
func assertAppliedOnce(t *testing.T, srcConn, tgtConn *pgx.Conn) {
	t.Helper()
	for _, table := range []string{"fault_events", "fault_accounts"} {
		assert.Equal(t, digest(t, srcConn, table), digest(t, tgtConn, table), table)
	}
	assert.Equal(t, [][]*string(nil), rawRows(t, tgtConn,
		"SELECT seq::text, count(*)::text FROM fault_events GROUP BY seq HAVING count(*) > 1 ORDER BY seq LIMIT 10"),
		"no source transaction applied twice")
}

// faultDatabases makes a source and a target database holding the fault
// tables, a slot name for the test and no applied position of it on the
// target. The slot exists before the first source transaction, so the
// stream holds every one of them.
func faultDatabases(t *testing.T) (srcDSN string, srcConn *pgx.Conn, tgtDSN string, tgtConn *pgx.Conn, slot, systemID string) {
	t.Helper()
	srcDSN, srcConn = newDatabase(t)
	tgtDSN, tgtConn = newDatabase(t)
	execSQL(t, srcConn, faultDDL...)
	execSQL(t, tgtConn, faultDDL...)
	slot = streamSlot(t)
	systemID = systemIdentifier(t, srcConn)
	forgetAppliedPosition(t, tgtDSN, systemID, slot)
	src, err := siphon.Connect(context.Background(), srcDSN, siphon.WithSlot(slot))
	require.NoError(t, err)
	_, err = src.CurrentPosition(context.Background())
	src.Close()
	require.NoError(t, err)
	return srcDSN, srcConn, tgtDSN, tgtConn, slot, systemID
}

// killTally counts where kills landed and how the slot moved.
type killTally struct {
	landed        map[string]int
	acked, ahead  int // rounds that moved the slot on, past the target
	lastConfirmed canonical.Position
}

// record notes round's kill, once the killed child's sessions are gone.
func (k *killTally) record(t *testing.T, round int, out string, srcConn, tgtConn *pgx.Conn, slot, origin string) {
	t.Helper()
	where := killedWhere(t, out, tgtConn, origin)
	k.landed[where]++
	// A slot acknowledged past the target is fine only when a heartbeat
	// vouches for the gap; the next child finds out (a ResumeGapError
	// fails it), so this is only counted.
	confirmed, applied := slotConfirmed(t, srcConn, slot), originProgress(t, tgtConn, origin)
	if confirmed > k.lastConfirmed {
		k.acked++
	}
	if confirmed > applied {
		k.ahead++
	}
	k.lastConfirmed = confirmed
	n := 0
	for line := range strings.Lines(out) {
		if line == markCommit+"\n" {
			n++
		}
	}
	t.Logf("round %d: %d transactions applied, killed %s; target at %v, slot at %v", round, n, where, applied, confirmed)
}

// Where a kill landed, as killedWhere tells it.
const (
	killedBeforeAny  = "before the first transaction"
	killedBetween    = "between transactions"
	killedMidPending = "mid-transaction, not applied"
	killedMidApplied = "mid-transaction, applied but not acknowledged"
)

// killedWhere tells from a killed child's output, and the target's origin
// once the child's sessions are gone, where the kill landed.
func killedWhere(t *testing.T, out string, tgtConn *pgx.Conn, origin string) string {
	t.Helper()
	lines := slices.DeleteFunc(strings.Split(strings.TrimSuffix(out, "\n"), "\n"), func(l string) bool {
		return l == markCatchUp || l == markWalsender
	})
	last := ""
	if len(lines) > 0 {
		last = lines[len(lines)-1]
	}
	switch {
	case last == "" || last == markStart:
		return killedBeforeAny
	case last == markCommit:
		return killedBetween
	}
	lsn, ok := strings.CutPrefix(last, markBegin+" ")
	require.True(t, ok, "child output line %q", last)
	commitLSN, err := canonical.ParsePosition(lsn)
	require.NoError(t, err)
	if originProgress(t, tgtConn, origin) > commitLSN {
		return killedMidApplied
	}
	return killedMidPending
}

func init() { childModes["cdc-loop"] = faultChild }

// runKilledChild starts the child, SIGKILLs it delay after it first
// reported mark (markStart: its stream starts; markBegin: a transaction
// begins), and returns what it reported. The kill is timed from the
// child's report, not from its start: on a loaded machine (the race
// detector, a shared CI runner) a child may take longer to start, and its
// stream to deliver, than any delay. The child must not exit by itself.
func runKilledChild(t *testing.T, env []string, mark string, delay time.Duration) string {
	t.Helper()
	cmd := childCmd("cdc-loop", env...)
	stdout := &markWatcher{mark: mark, seen: make(chan struct{})}
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = stdout, &stderr
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	select {
	case err := <-exited:
		t.Fatalf("child exited before it reported %q: %v\nstdout: %s\nstderr: %s", mark, err, stdout, &stderr)
	case <-time.After(waitDeadline):
		t.Fatalf("the child did not report %q within %v\nstderr: %s", mark, waitDeadline, &stderr)
	case <-stdout.seen:
	}
	select {
	case err := <-exited:
		t.Fatalf("child exited before it was killed: %v\nstdout: %s\nstderr: %s", err, stdout, &stderr)
	case <-time.After(delay):
	}
	require.NoError(t, cmd.Process.Kill())
	<-exited
	if stderr.Len() > 0 {
		t.Logf("killed child's stderr: %s", &stderr)
	}
	return stdout.String()
}

// killMark is the report runKilledChild times round's kill from: every
// other kill lands a random moment after the stream starts (in its setup,
// its catch-up, anywhere), the others after it delivered a transaction.
func killMark(round int) string {
	if round%2 == 1 {
		return markBegin
	}
	return markStart
}

// markWatcher is a fault child's stdout: it keeps what the child
// reported, and closes seen once the child reported a line of mark.
type markWatcher struct {
	mu      sync.Mutex
	out     bytes.Buffer
	mark    string
	seen    chan struct{}
	closed  bool
	scanned int // bytes of out already looked at
}

func (w *markWatcher) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	n, _ := w.out.Write(b)
	for !w.closed {
		line, _, ok := strings.Cut(w.out.String()[w.scanned:], "\n")
		if !ok {
			break
		}
		w.scanned += len(line) + 1
		if line == w.mark || strings.HasPrefix(line, w.mark+" ") {
			w.closed = true
			close(w.seen)
		}
	}
	return n, nil
}

func (w *markWatcher) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.out.String()
}

// runLastChild runs the child until it has applied the last source
// transaction and returns that transaction's Position.
func runLastChild(t *testing.T, env []string) canonical.Position {
	t.Helper()
	out := runChild(t, "the last child", "cdc-loop", env...)
	_, line, ok := strings.Cut(out, "\nend ")
	require.True(t, ok, "no end line in %q", out)
	pos, err := canonical.ParsePosition(strings.TrimSpace(line))
	require.NoError(t, err)
	return pos
}

// awaitReleased waits until the killed child's walsender has released the
// slot and its target sessions are gone, so that the next child spends its
// short life streaming rather than waiting (it would cope either way).
func awaitReleased(t *testing.T, srcConn, tgtConn *pgx.Conn, slot string) {
	t.Helper()
	var active bool
	var sessions int
	waitUntil(func() bool {
		require.NoError(t, srcConn.QueryRow(context.Background(),
			"SELECT active FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&active))
		require.NoError(t, tgtConn.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND application_name = 'siphon'`).Scan(&sessions))
		return !active && sessions == 0
	})
	require.False(t, active, "slot active")
	require.Zero(t, sessions, "siphon sessions on the target")
}

// faultChild is the fault test's child process: the change data capture
// loop from the target's applied Position, retried while a killed
// predecessor still holds the slot or the target's origin. It runs until
// the transaction holding the end message is applied.
func faultChild() error {
	// Bounded by waitDeadline without progress (a transaction begun or
	// applied), not in all: under load the last child applies most of the
	// workload.
	stall := newStallDeadline(waitDeadline)
	ctx, cancel := stall.context(context.Background())
	defer cancel()
	slot, systemID := os.Getenv(faultChildSlot), os.Getenv(faultChildSystem)
	// Acknowledge at once, so that kills land after acknowledgements too
	// and an acknowledgement ahead of the target would show.
	opts := []siphon.Option{siphon.WithSlot(slot), siphon.WithStatusInterval(time.Millisecond)}
	catchUp := os.Getenv(faultChildCatchUp) != ""
	if catchUp {
		opts = append(opts, siphon.WithLogger(slog.New(markHandler{})))
	}
	src, err := siphon.Connect(ctx, os.Getenv(faultChildSource), opts...)
	if err != nil {
		return err
	}
	defer src.Close()
	if catchUp {
		src.SetCatchUpForTest(siphon.CatchUpForTest{MinChunk: 256 << 10, MaxChunk: 256 << 10, Workers: 2})
	}
	tgt, err := siphon.Connect(ctx, os.Getenv(faultChildTarget))
	if err != nil {
		return err
	}
	defer tgt.Close()
	for attempt := 1; ; attempt++ {
		end, err := captureOnce(ctx, src, tgt, systemID, slot, stall.writer(os.Stdout))
		if err == nil {
			fmt.Printf("end %v\n", end)
			return nil
		}
		retry := errors.Is(err, siphon.ErrSlotInUse) || errors.Is(err, siphon.ErrApplyInProgress) ||
			errors.As(err, new(*siphon.StreamInterruptedError))
		if !retry || attempt == 5 {
			return fmt.Errorf("attempt %d: %w", attempt, err)
		}
		fmt.Fprintf(os.Stderr, "attempt %d: %v; retrying\n", attempt, err)
		select {
		case <-ctx.Done():
			return err
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// captureOnce streams from the target's applied Position into
// ConsumeCanonical through a pipe, and returns the Position of the
// transaction holding the end message once it is applied.
func captureOnce(ctx context.Context, src, tgt *siphon.Conn, systemID, slot string, progress io.Writer) (canonical.Position, error) {
	from, err := tgt.AppliedPositionFor(ctx, systemID, slot)
	if err != nil {
		return 0, err
	}
	pr, pw := io.Pipe()
	var (
		consumeErr error
		consumed   = make(chan struct{})
	)
	go func() {
		defer close(consumed)
		consumeErr = tgt.ConsumeCanonical(ctx, pr)
		pr.CloseWithError(cmp.Or(consumeErr, errConsumerStopped))
	}()
	enc := canonical.NewEncoder(pw)
	err = enc.WriteHeader(canonical.Header{Kind: canonical.KindChanges, Engine: canonical.EnginePostgres,
		Start: from, SystemID: systemID, Slot: slot, Created: time.Now().UTC()})
	if err == nil {
		err = enc.Flush()
	}
	last, ending := from, false
	streamCtx, stop := context.WithCancel(ctx)
	defer stop()
	if err == nil {
		fmt.Fprintln(progress, markStart)
		_, err = src.StreamChanges(streamCtx, from, func(ch canonical.Change) error {
			switch ch.Op {
			case canonical.OpBegin:
				fmt.Fprintln(progress, markBegin, ch.Position)
			case canonical.OpMessage:
				ending = ending || ch.Message.Prefix == faultEndPrefix
			}
			if err := enc.WriteChange(&ch); err != nil {
				return err
			}
			if ch.Op != canonical.OpCommit {
				return nil
			}
			// Acknowledge (return nil) only once the target holds it.
			if err := enc.Flush(); err != nil {
				return err
			}
			if err := awaitApplied(ctx, tgt, systemID, slot, ch.Position, consumed); err != nil {
				return err
			}
			last = ch.Position
			fmt.Fprintln(progress, markCommit)
			if ending {
				stop()
			}
			return nil
		})
	}
	if err == nil && !ending {
		err = context.Cause(ctx)
	}
	if err == nil {
		err = enc.WriteEnd(last)
		pw.Close()
		<-consumed
		return last, cmp.Or(err, consumeErr)
	}
	pw.CloseWithError(err)
	<-consumed
	return 0, errors.Join(err, consumeErr)
}

// markHandler prints markCatchUp and markWalsender on stdout when the
// stream logs that it starts catching up, or that the walsender starts.
type markHandler struct{}

func (markHandler) Enabled(context.Context, slog.Level) bool { return true }

func (markHandler) Handle(_ context.Context, rec slog.Record) error {
	switch rec.Message {
	case catchUpStarted:
		fmt.Println(markCatchUp)
	case "stream started":
		fmt.Println(markWalsender)
	}
	return nil
}

func (h markHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h markHandler) WithGroup(string) slog.Handler      { return h }

// errConsumerStopped: ConsumeCanonical returned while the stream went on.
var errConsumerStopped = errors.New("the consumer stopped")

// awaitApplied waits until the target has applied pos.
func awaitApplied(ctx context.Context, tgt *siphon.Conn, systemID, slot string, pos canonical.Position, consumed <-chan struct{}) error {
	deadline := time.After(waitDeadline)
	for {
		applied, err := tgt.AppliedPositionFor(ctx, systemID, slot)
		if err != nil || applied >= pos {
			return err
		}
		select {
		case <-consumed:
			return errConsumerStopped
		case <-deadline:
			return fmt.Errorf("the target did not apply %v within %v (it stands at %v)", pos, waitDeadline, applied)
		case <-time.After(time.Millisecond):
		}
	}
}
