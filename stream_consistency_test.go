package siphon_test

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/siphondb/siphon"
	"github.com/siphondb/siphon/canonical"
	"github.com/siphondb/siphon/internal/sqltext"
)

// workloadSchema has a table per way of logging old rows.
var workloadSchema = []string{
	`CREATE TABLE w_kv (id int PRIMARY KEY, v text, n numeric, ts timestamptz)`,
	`CREATE TABLE w_toast (id int PRIMARY KEY, a int, big text)`,
	`CREATE TABLE w_full (a int, b text)`,
	`ALTER TABLE w_full REPLICA IDENTITY FULL`,
	`CREATE TABLE w_idx (a int NOT NULL, b text NOT NULL, c text)`,
	`CREATE UNIQUE INDEX w_idx_ab ON w_idx (a, b)`,
	`ALTER TABLE w_idx REPLICA IDENTITY USING INDEX w_idx_ab`,
}

// worker runs random transactions on its own key range.
type worker struct {
	rng    *rand.Rand
	conn   *pgx.Conn
	base   int
	next   int
	kv     []int // ids present in w_kv
	toast  []int
	full   []int
	idx    []int
	truncs bool // this worker may truncate w_full
}

var textPool = []string{"", "plain", "it's", `a "quoted" word`, "two  spaces", "ünïcødé ✓", "back\\slash", "tab\there"}

func (w *worker) text() string {
	return textPool[w.rng.IntN(len(textPool))] + fmt.Sprint(w.rng.IntN(100))
}

func pick(rng *rand.Rand, ids []int) (int, int) {
	i := rng.IntN(len(ids))
	return i, ids[i]
}

// op returns one random statement and what it does to the worker's ids
// when its transaction commits.
func (w *worker) op() (string, func()) {
	w.next++
	id := w.base + w.next
	switch r := w.rng.IntN(20); {
	case r < 5 || len(w.kv) == 0:
		n := "NULL"
		if w.rng.IntN(3) > 0 {
			n = fmt.Sprintf("%d.%03d", w.rng.IntN(1e6), w.rng.IntN(1000))
		}
		return fmt.Sprintf(`INSERT INTO w_kv VALUES (%d, %s, %s, '2026-01-01 00:00:00+00'::timestamptz + interval '%d seconds')`,
			id, sqltext.Literal(w.text()), n, w.rng.IntN(1e8)), func() { w.kv = append(w.kv, id) }
	case r < 8:
		_, k := pick(w.rng, w.kv)
		return fmt.Sprintf(`UPDATE w_kv SET v = %s WHERE id = %d`, sqltext.Literal(w.text()), k), func() {}
	case r < 9:
		_, k := pick(w.rng, w.kv)
		return fmt.Sprintf(`UPDATE w_kv SET id = %d WHERE id = %d`, id, k), func() { replaceID(w.kv, k, id) }
	case r < 10:
		_, k := pick(w.rng, w.kv)
		return fmt.Sprintf(`DELETE FROM w_kv WHERE id = %d`, k), func() { w.kv = removeID(w.kv, k) }
	case r < 11:
		return fmt.Sprintf(`INSERT INTO w_toast VALUES (%d, 0, (SELECT string_agg(md5(random()::text), '') FROM generate_series(1, 200)))`, id),
			func() { w.toast = append(w.toast, id) }
	case r < 12 && len(w.toast) > 0:
		_, k := pick(w.rng, w.toast)
		return fmt.Sprintf(`UPDATE w_toast SET a = a + 1 WHERE id = %d`, k), func() {}
	case r < 14 && w.truncs:
		return fmt.Sprintf(`INSERT INTO w_full VALUES (%d, %s)`, id, sqltext.Literal(w.text())), func() { w.full = append(w.full, id) }
	case r < 15 && len(w.full) > 0:
		_, k := pick(w.rng, w.full)
		return fmt.Sprintf(`UPDATE w_full SET b = %s WHERE a = %d`, sqltext.Literal(w.text()), k), func() {}
	case r < 16 && len(w.full) > 0:
		_, k := pick(w.rng, w.full)
		return fmt.Sprintf(`DELETE FROM w_full WHERE a = %d`, k), func() { w.full = removeID(w.full, k) }
	case r < 17:
		return fmt.Sprintf(`INSERT INTO w_idx VALUES (%d, %s, %s)`, id, sqltext.Literal(fmt.Sprint("k", id)), sqltext.Literal(w.text())),
			func() { w.idx = append(w.idx, id) }
	case r < 18 && len(w.idx) > 0:
		_, k := pick(w.rng, w.idx)
		if w.rng.IntN(2) == 0 {
			return fmt.Sprintf(`UPDATE w_idx SET c = %s WHERE a = %d`, sqltext.Literal(w.text()), k), func() {}
		}
		return fmt.Sprintf(`DELETE FROM w_idx WHERE a = %d`, k), func() { w.idx = removeID(w.idx, k) }
	case r < 19 && w.truncs && w.rng.IntN(4) == 0:
		return `TRUNCATE w_full`, func() { w.full = nil }
	default:
		return fmt.Sprintf(`SELECT pg_logical_emit_message(true, 'app', %s)`, sqltext.Literal(w.text())), func() {}
	}
}

func replaceID(ids []int, old, id int) {
	if i := slices.Index(ids, old); i >= 0 {
		ids[i] = id
	}
}

func removeID(ids []int, id int) []int {
	return slices.DeleteFunc(ids, func(x int) bool { return x == id })
}

// transaction runs one random transaction; it commits (returning its xid
// and whether it changed anything) or, one time in ten, rolls back. Some statements run in a subtransaction
// that is rolled back.
func (w *worker) transaction(ctx context.Context) (xid uint32, committed bool, err error) {
	tx, err := w.conn.Begin(ctx)
	if err != nil {
		return 0, false, err
	}
	defer tx.Rollback(ctx)
	var full int64
	if err := tx.QueryRow(ctx, "SELECT txid_current()").Scan(&full); err != nil {
		return 0, false, err
	}
	saved := [4][]int{slices.Clone(w.kv), slices.Clone(w.toast), slices.Clone(w.full), slices.Clone(w.idx)}
	defer func() {
		if !committed {
			w.kv, w.toast, w.full, w.idx = saved[0], saved[1], saved[2], saved[3]
		}
	}()
	effective := false
	for range 1 + w.rng.IntN(4) {
		stmt, effect := w.op()
		if w.rng.IntN(8) == 0 {
			if _, err := tx.Exec(ctx, "SAVEPOINT s"); err != nil {
				return 0, false, err
			}
			if _, err := tx.Exec(ctx, stmt); err != nil {
				return 0, false, err
			}
			if _, err := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT s"); err != nil {
				return 0, false, err
			}
			continue
		}
		if _, err := tx.Exec(ctx, stmt); err != nil {
			return 0, false, fmt.Errorf("%s: %w", stmt, err)
		}
		effect()
		effective = true
	}
	if w.rng.IntN(10) == 0 {
		return 0, false, tx.Rollback(ctx)
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, false, err
	}
	// A transaction whose statements were all rolled back to a savepoint
	// changed nothing: it is not streamed.
	return uint32(full), effective, nil
}

// runWorkload runs n random transactions from each of workers concurrent
// sessions and returns the xids of those that committed.
func runWorkload(ctx context.Context, dsn string, seed uint64, workers, n int) ([]uint32, error) {
	var (
		mu   sync.Mutex
		xids []uint32
		wg   sync.WaitGroup
		errs = make([]error, workers)
	)
	for k := range workers {
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			return nil, err
		}
		w := &worker{rng: rand.New(rand.NewPCG(seed, uint64(k))), conn: conn, base: (k + 1) * 10_000_000, truncs: k == 0}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer conn.Close(context.Background())
			for range n {
				xid, ok, err := w.transaction(ctx)
				var pgErr *pgconn.PgError
				if errors.As(err, &pgErr) && pgErr.Code == "40P01" { // deadlock: the transaction rolled back
					continue
				}
				if err != nil {
					errs[k] = err
					return
				}
				if ok {
					mu.Lock()
					xids = append(xids, xid)
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	return xids, errors.Join(errs...)
}

// describe renders a change the way describeTestDecoding renders the
// test_decoding line for it: old rows with their NULL columns left out (as
// test_decoding prints them).
func describe(ch canonical.Change) string {
	row := func(r canonical.Row, skipNulls bool) string {
		var b strings.Builder
		for i, v := range r {
			switch {
			case v.IsNull() && skipNulls:
				continue
			case v.IsNull():
				fmt.Fprintf(&b, " %s=null", ch.Columns[i].Name)
			case v.IsUnchanged():
				fmt.Fprintf(&b, " %s=unchanged", ch.Columns[i].Name)
			default:
				s, _ := v.Text()
				fmt.Fprintf(&b, " %s=%q", ch.Columns[i].Name, s)
			}
		}
		return b.String()
	}
	table := ch.Schema + "." + ch.Table
	switch ch.Op {
	case canonical.OpInsert:
		return "INSERT " + table + row(ch.New, false)
	case canonical.OpUpdate:
		if ch.Old != nil {
			return "UPDATE " + table + " old:" + row(ch.Old, true) + " new:" + row(ch.New, false)
		}
		return "UPDATE " + table + row(ch.New, false)
	case canonical.OpDelete:
		return "DELETE " + table + row(ch.Old, true)
	case canonical.OpTruncate:
		var names []string
		for _, n := range ch.Truncated {
			names = append(names, n.String())
		}
		return fmt.Sprintf("TRUNCATE %s cascade=%v restart=%v", strings.Join(names, ","), ch.Cascade, ch.RestartIdentity)
	case canonical.OpMessage:
		return fmt.Sprintf("MESSAGE %v %s %q", ch.Message.Transactional, ch.Message.Prefix, ch.Message.Content)
	}
	return ch.Op.String()
}

// describeTestDecoding renders a test_decoding output line like describe.
func describeTestDecoding(t *testing.T, line string) string {
	t.Helper()
	if rest, ok := strings.CutPrefix(line, "message: transactional: "); ok {
		// message: transactional: 1 prefix: app, sz: 5 content:hello
		tx, rest, _ := strings.Cut(rest, " prefix: ")
		prefix, rest, _ := strings.Cut(rest, ", sz: ")
		_, content, _ := strings.Cut(rest, " content:")
		return fmt.Sprintf("MESSAGE %v %s %q", tx == "1", prefix, content)
	}
	rest, ok := strings.CutPrefix(line, "table ")
	require.True(t, ok, "unexpected test_decoding line %q", line)
	tables, rest, ok := strings.Cut(rest, ": ")
	require.True(t, ok, line)
	op, rest, _ := strings.Cut(rest, ":")
	if op == "TRUNCATE" {
		return fmt.Sprintf("TRUNCATE %s cascade=%v restart=%v", strings.ReplaceAll(tables, ", ", ","),
			strings.Contains(rest, "cascade"), strings.Contains(rest, "restart_seqs"))
	}
	p := &tdParser{t: t, s: rest}
	switch op {
	case "INSERT":
		return "INSERT " + tables + p.tuple("")
	case "DELETE":
		return "DELETE " + tables + p.tuple("")
	case "UPDATE":
		if p.skip(" old-key:") {
			old := p.tuple(" new-tuple:")
			require.True(t, p.skip(" new-tuple:"), line)
			return "UPDATE " + tables + " old:" + old + " new:" + p.tuple("")
		}
		return "UPDATE " + tables + p.tuple("")
	}
	t.Fatalf("unexpected test_decoding line %q", line)
	return ""
}

// tdParser reads test_decoding's " name[type]:value" columns.
type tdParser struct {
	t *testing.T
	s string
}

func (p *tdParser) skip(prefix string) bool {
	rest, ok := strings.CutPrefix(p.s, prefix)
	if ok {
		p.s = rest
	}
	return ok
}

func (p *tdParser) tuple(stop string) string {
	var b strings.Builder
	for p.s != "" && (stop == "" || !strings.HasPrefix(p.s, stop)) {
		require.True(p.t, p.skip(" "), "column separator in %q", p.s)
		name, rest, ok := strings.Cut(p.s, "[")
		require.True(p.t, ok, p.s)
		_, rest, ok = strings.Cut(rest, "]:")
		require.True(p.t, ok, p.s)
		p.s = rest
		switch {
		case p.skip("null"):
			fmt.Fprintf(&b, " %s=null", name)
		case p.skip("unchanged-toast-datum"):
			fmt.Fprintf(&b, " %s=unchanged", name)
		case strings.HasPrefix(p.s, "'"):
			var v strings.Builder
			i := 1
			for ; i < len(p.s); i++ {
				if p.s[i] == '\'' {
					if i+1 < len(p.s) && p.s[i+1] == '\'' {
						v.WriteByte('\'')
						i++
						continue
					}
					break
				}
				v.WriteByte(p.s[i])
			}
			p.s = p.s[i+1:]
			fmt.Fprintf(&b, " %s=%q", name, v.String())
		default:
			end := strings.IndexByte(p.s, ' ')
			if end < 0 {
				end = len(p.s)
			}
			fmt.Fprintf(&b, " %s=%q", name, p.s[:end])
			p.s = p.s[end:]
		}
	}
	return b.String()
}

type describedTx struct {
	XID     uint32
	Changes []string
}

// TestStreamMatchesTestDecoding runs a random workload and checks that the
// stream reports, transaction by transaction, what the test_decoding
// plugin reports for the same WAL: same xids in the same commit order, same
// operations on the same tables with the same values, unchanged TOAST
// values and old rows.
func TestStreamMatchesTestDecoding(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn, admin := newDatabase(t)
	execSQL(t, admin, workloadSchema...)
	c, slot, from := streamConnAt(t, dsn)
	tdSlot := slot + "_td"
	execSQL(t, admin, "SELECT pg_create_logical_replication_slot('"+tdSlot+"', 'test_decoding')")

	seed := uint64(time.Now().UnixNano())
	t.Logf("workload seed %d", seed)
	committed, err := runWorkload(ctx, dsn, seed, 3, 80)
	require.NoError(t, err)
	emitMarker(t, admin, "end")

	changes, _ := streamUntil(t, c, from, "end")
	var got []describedTx
	for _, tx := range transactions(t, changes) {
		d := describedTx{XID: tx.begin.XID}
		for _, ch := range tx.changes {
			d.Changes = append(d.Changes, describe(ch))
		}
		got = append(got, d)
	}

	// test_decoding prints values with the settings of the session that
	// reads its slot: read it with siphon's.
	sess := siphonSession(t, dsn)
	var want []describedTx
	var cur *describedTx
	deadline := time.Now().Add(waitDeadline)
	for done := false; !done; {
		require.True(t, time.Now().Before(deadline), "test_decoding did not reach the marker")
		rows, err := sess.Query(ctx, `SELECT data FROM pg_logical_slot_get_changes($1, NULL, NULL, 'include-xids', '1', 'skip-empty-xacts', '0')`, tdSlot)
		require.NoError(t, err)
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		for _, line := range lines {
			switch {
			case strings.HasPrefix(line, "BEGIN "):
				var xid uint32
				_, err := fmt.Sscanf(line, "BEGIN %d", &xid)
				require.NoError(t, err)
				cur = &describedTx{XID: xid}
			case strings.HasPrefix(line, "COMMIT "):
				// Empty transactions are printed (with skip-empty-xacts,
				// test_decoding would print a message-only transaction
				// without BEGIN and COMMIT); pgoutput skips them.
				if len(cur.Changes) > 0 {
					want = append(want, *cur)
				}
				cur = nil
			case cur == nil && strings.Contains(line, "prefix: "+markerPrefix+","):
				done = true
			case cur == nil:
				require.Contains(t, line, "transactional: 0", "only non-transactional messages come outside transactions")
			default:
				cur.Changes = append(cur.Changes, describeTestDecoding(t, line))
			}
		}
		if !done {
			// WAL is decoded up to the flushed position, which trails
			// commits under synchronous_commit=off: wait for the walwriter.
			execSQL(t, sess, "SELECT pg_sleep(0.02)")
		}
	}

	require.Len(t, got, len(committed), "one streamed transaction per committed one")
	require.Equal(t, len(want), len(got))
	for i := range want {
		require.Equal(t, want[i], got[i], "transaction %d of %d", i, len(want))
	}
	n := 0
	for _, tx := range got {
		n += len(tx.Changes)
	}
	t.Logf("%d transactions, %d changes compared", len(got), n)
	var xids []uint32
	for _, tx := range got {
		xids = append(xids, tx.XID)
	}
	assert.ElementsMatch(t, committed, xids)

	execSQL(t, admin, "SELECT pg_drop_replication_slot('"+tdSlot+"')")
	require.NoError(t, c.Close())
	assertNoLeaks(t, dsn, slot)
}

var errInjected = errors.New("injected emit failure")

// TestStreamInterruptionsDeliverExactlyOnce interrupts the consumer at
// random points (emit errors, ctx cancellation, pg_terminate_backend of the
// walsender, plain timeouts) while a workload runs, and resumes each time
// from the Position of the last OpCommit the consumer handled (what a
// consumer that crashed would have; StreamChanges returns the same): every
// committed transaction is handled exactly once, in commit order.
// Heartbeats run often, so resumes also cross idle slot advances.
func TestStreamInterruptionsDeliverExactlyOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn, admin := newDatabase(t)
	execSQL(t, admin, workloadSchema...)
	execSQL(t, admin, "CREATE TABLE unpub (x text)")
	var onStart atomic.Pointer[func()]
	c, slot, start := streamConnAt(t, dsn, siphon.WithTables("w_kv", "w_toast", "w_full", "w_idx"),
		siphon.WithStatusInterval(20*time.Millisecond), siphon.WithHeartbeat(30*time.Millisecond),
		siphon.WithLogger(slog.New(startHandler{&onStart})))

	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 99))

	type workloadResult struct {
		xids []uint32
		err  error
	}
	workDone := make(chan workloadResult, 1)
	go func() {
		xids, err := runWorkload(ctx, dsn, seed, 2, 150)
		if err == nil {
			// Unpublished changes, then the end marker.
			_, err = admin.Exec(ctx, "INSERT INTO unpub SELECT repeat('u', 100) FROM generate_series(1, 2000)")
		}
		workDone <- workloadResult{xids, err}
	}()
	killer, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer killer.Close(ctx)

	var (
		handled   []uint32             // xids whose OpCommit emit returned nil
		ends      []canonical.Position // their end positions
		committed []uint32
		lastEnd   = start            // the consumer's own record
		resume    = start            // where the next run starts
		pending   []canonical.Change // the open transaction
		seenEnd   bool
		barren    int // runs in a row that delivered nothing
		runs      = map[string]int{}
		markerOut = false
	)
	// The consumer fails only when waitDeadline passes with nothing more
	// handled (nor the workload's end, nor a resume behind the slot once
	// idle): a loaded machine makes many slow runs.
	stall, progress := newStallDeadline(waitDeadline), -1
	for !seenEnd {
		if n := len(handled) + len(committed) + runs["resume behind the slot"]; n != progress {
			stall.progressed()
			progress = n
		}
		require.False(t, stall.stalled(), "the consumer did not finish (runs %v)", runs)
		if committed == nil {
			select {
			case res := <-workDone:
				require.NoError(t, res.err)
				committed = res.xids
			default:
			}
		}
		// Once the workload is done, runs see an idle slot that heartbeats
		// advance; end when a resume from behind it has happened.
		if committed != nil && !markerOut && runs["resume behind the slot"] > 0 {
			emitMarker(t, admin, "end")
			markerOut = true
		}
		if resume < slotConfirmed(t, killer, slot) {
			runs["resume behind the slot"]++ // vouched for by a heartbeat
		}
		// Runs also end a random while after their stream started, even
		// when idle: counted from the start, not from the call, so that a
		// slow start does not use the run up; and a run's while doubles
		// with each run before it that delivered nothing, so that one
		// whose walsender takes longer than it to decode its way to the
		// first change (a loaded machine, a shared server's WAL) still
		// makes progress, where a fixed while would cut every run short.
		runCtx, cancel := context.WithCancel(ctx)
		end := time.Duration(20+rng.IntN(300)) * time.Millisecond << min(barren, 8)
		fire := sync.OnceFunc(func() {
			time.AfterFunc(end, cancel)
		})
		onStart.Store(&fire)
		pending = nil
		delivered := false
		pos, err := c.StreamChanges(runCtx, resume, func(ch canonical.Change) error {
			delivered = true
			if ch.Op == canonical.OpMessage && ch.Message.Prefix == markerPrefix {
				seenEnd = true
				cancel()
				return nil
			}
			switch rng.IntN(60) {
			case 0:
				return errInjected
			case 1:
				cancel()
			case 2:
				_, err := killer.Exec(ctx, "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1", slot)
				require.NoError(t, err)
			}
			pending = append(pending, ch)
			if ch.Op == canonical.OpCommit {
				// The consumer's transaction commits: it handled this one.
				handled = append(handled, ch.XID)
				ends = append(ends, ch.Position)
				lastEnd = ch.Position
				pending = nil
			}
			return nil
		})
		cancel()
		var intr *siphon.StreamInterruptedError
		switch {
		case err == nil || errors.Is(err, context.DeadlineExceeded): // cancelled, or the run's time is up
			runs["cancel"]++
		case errors.Is(err, errInjected):
			runs["emit error"]++
		case errors.As(err, &intr):
			runs["interrupted"]++
			assert.Equal(t, intr.Position, pos)
		case errors.Is(err, siphon.ErrSlotInUse):
			runs["slot in use"]++
		default:
			logResumeGap(t, killer, slot, err)
			require.NoError(t, err, "unexpected error after runs %v", runs)
		}
		require.Equal(t, lastEnd, pos, "the returned position is the last handled transaction's end")
		resume = lastEnd
		if delivered {
			barren = 0
		} else {
			barren++
		}
	}
	t.Logf("runs: %v, transactions handled: %d", runs, len(handled))
	assert.Greater(t, runs["emit error"]+runs["cancel"]+runs["interrupted"], 3, "the consumer was interrupted several times")
	assert.Positive(t, runs["resume behind the slot"], "a resume from the last OpCommit crossed an idle slot advance")
	assert.Equal(t, len(handled), len(uniq(handled)), "no transaction handled twice")
	assert.ElementsMatch(t, committed, handled, "every committed transaction handled")
	assert.True(t, slices.IsSorted(ends), "in commit order")

	require.NoError(t, c.Close())
	assertNoLeaks(t, dsn, slot)
}

// startHandler calls the function onStart holds when a stream logs that it
// starts (through the walsender or, catching up, the SQL interface).
type startHandler struct{ onStart *atomic.Pointer[func()] }

func (h startHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h startHandler) Handle(_ context.Context, rec slog.Record) error {
	if rec.Message == "stream started" || rec.Message == catchUpStarted {
		if f := h.onStart.Load(); f != nil {
			(*f)()
		}
	}
	return nil
}

func (h startHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h startHandler) WithGroup(string) slog.Handler      { return h }

func uniq(xs []uint32) []uint32 {
	seen := map[uint32]bool{}
	var out []uint32
	for _, x := range xs {
		if !seen[x] {
			seen[x] = true
			out = append(out, x)
		}
	}
	return out
}

// logResumeGap logs, for a resume refused as behind the slot, the slot's
// heartbeats that the WAL holds from the resume on (pg_walinspect), in WAL
// order with their records' positions: which one moved the slot, and what
// the stream read before it.
func logResumeGap(t *testing.T, conn *pgx.Conn, slot string, err error) {
	t.Helper()
	var gap *siphon.ResumeGapError
	if !errors.As(err, &gap) || gap.Reason != siphon.GapBehindSlot {
		return
	}
	ctx := context.Background()
	if _, err := conn.Exec(ctx, "CREATE EXTENSION IF NOT EXISTS pg_walinspect"); err != nil {
		t.Logf("no pg_walinspect to show the WAL: %v", err)
		return
	}
	var restart, confirmed, flush string
	if err := conn.QueryRow(ctx, `SELECT restart_lsn::text, confirmed_flush_lsn::text, pg_current_wal_flush_lsn()::text
		FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&restart, &confirmed, &flush); err != nil {
		t.Logf("read the slot: %v", err)
		return
	}
	t.Logf("slot %s: restart_lsn %s, confirmed %s; resume from %v, confirmed when refused %v; WAL flushed to %s",
		slot, restart, confirmed, gap.Requested, gap.Confirmed, flush)
	rows, err := conn.Query(ctx, `SELECT start_lsn::text, end_lsn::text, description
		FROM pg_get_wal_records_info(greatest($1::text::pg_lsn, $2::text::pg_lsn), least($3::text::pg_lsn + 16777216, $4::text::pg_lsn))
		WHERE resource_manager = 'LogicalMessage' AND description LIKE '%siphon.heartbeat%'`,
		gap.Requested.String(), restart, gap.Confirmed.String(), flush)
	if err != nil {
		t.Logf("read the WAL: %v", err)
		return
	}
	defer rows.Close()
	for rows.Next() {
		var start, end, desc string
		if err := rows.Scan(&start, &end, &desc); err != nil {
			t.Logf("read the WAL: %v", err)
			return
		}
		_, payload, _ := strings.Cut(desc, "): ") // the payload's bytes, in hex, separated by spaces
		content, _ := hex.DecodeString(strings.ReplaceAll(payload, " ", ""))
		if strings.Contains(string(content), `"`+slot+`"`) {
			t.Logf("heartbeat record %s-%s: %s", start, end, content)
		}
	}
	if err := rows.Err(); err != nil {
		t.Logf("read the WAL: %v", err)
	}
}
