package siphon_test

import (
	"context"
	"fmt"
	"log/slog"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/siphondb/siphon"
	"github.com/siphondb/siphon/canonical"
	"github.com/siphondb/siphon/siphontest"
)

func TestEnsureSlotCreatesPublicationThenSlot(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn, admin := newDatabase(t)
	execSQL(t, admin, `CREATE TABLE t1 (id int PRIMARY KEY)`, `CREATE TABLE t2 (id int PRIMARY KEY)`)
	logs := &logRecorder{}
	c := connect(t, dsn, siphon.WithSlot("first_slot"), siphon.WithPublication("first_pub"), siphon.WithLogger(logs.logger()))

	created, point, err := c.EnsureSlotForTest(ctx)
	require.NoError(t, err)
	assert.True(t, created)
	assert.NotZero(t, point)

	var allTables bool
	require.NoError(t, admin.QueryRow(ctx, "SELECT puballtables FROM pg_publication WHERE pubname = 'first_pub'").Scan(&allTables))
	assert.False(t, allTables, "never FOR ALL TABLES: a table created later must not start publishing updates by itself")
	assert.Equal(t, []string{"public.t1", "public.t2"}, publishedTables(t, admin, "first_pub"), "every table of today")
	var typ, plugin, confirmed string
	var temporary bool
	require.NoError(t, admin.QueryRow(ctx, `SELECT slot_type, plugin, temporary, confirmed_flush_lsn::text
		FROM pg_replication_slots WHERE slot_name = 'first_slot' AND database = current_database()`).
		Scan(&typ, &plugin, &temporary, &confirmed))
	assert.Equal(t, "logical", typ)
	assert.Equal(t, "pgoutput", plugin)
	assert.False(t, temporary)
	assert.Equal(t, point.String(), confirmed, "a new slot starts at its consistent point")

	created, point, err = c.EnsureSlotForTest(ctx)
	require.NoError(t, err)
	assert.False(t, created, "second call finds the slot")
	assert.Zero(t, point)
	assert.Len(t, logs.find(slog.LevelInfo, "replication slot created"), 1)
	assert.Len(t, logs.find(slog.LevelInfo, "publication created"), 1)

	require.NoError(t, c.Close())
	assertNoLeaks(t, dsn, "first_slot")
}

func TestEnsurePublicationNeverChangesAnExistingOne(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn, admin := newDatabase(t)
	execSQL(t, admin, `CREATE TABLE a (id int PRIMARY KEY)`, `CREATE TABLE "B" (id int PRIMARY KEY)`,
		`CREATE PUBLICATION inserts_only FOR ALL TABLES WITH (publish = 'insert')`,
		`CREATE PUBLICATION legacy_all FOR ALL TABLES`)

	two := connect(t, dsn, siphon.WithPublication("pub_tables"), siphon.WithTables("a", `"B"`))
	require.NoError(t, two.EnsurePublicationForTest(ctx))
	assert.Equal(t, []string{"public.B", "public.a"}, publishedTables(t, admin, "pub_tables"))
	require.NoError(t, two.EnsurePublicationForTest(ctx), "the same set again is fine")
	one := connect(t, dsn, siphon.WithPublication("pub_a"), siphon.WithTables("a"))
	require.NoError(t, one.EnsurePublicationForTest(ctx))

	all := connect(t, dsn, siphon.WithPublication("pub_all"))
	require.NoError(t, all.EnsurePublicationForTest(ctx))
	every := connect(t, dsn, siphon.WithPublication("pub_tables"))
	require.NoError(t, every.EnsurePublicationForTest(ctx), "a publication of every table of today is one of every table")

	for _, tc := range []struct {
		name, problem, fix string
		opts               []siphon.Option
	}{
		{"fewer tables", `publishes "public"."B", "public"."a", but WithTables names "public"."a"`, "ALTER PUBLICATION",
			[]siphon.Option{siphon.WithPublication("pub_tables"), siphon.WithTables("a")}},
		{"some tables, not all", `does not hold "public"."B", created after it`, "SyncPublication",
			[]siphon.Option{siphon.WithPublication("pub_a")}},
		{"all, not tables", `publishes all tables, but WithTables names "public"."a"`, "ALTER PUBLICATION",
			[]siphon.Option{siphon.WithPublication("legacy_all"), siphon.WithTables("a")}},
		{"inserts only", "does not publish every kind of change", "ALTER PUBLICATION",
			[]siphon.Option{siphon.WithPublication("inserts_only")}},
	} {
		c := connect(t, dsn, append(tc.opts, siphon.WithSlot("never_made"))...)
		_, _, err := c.EnsureSlotForTest(ctx)
		var mismatch *siphon.PublicationMismatchError
		require.ErrorAs(t, err, &mismatch, tc.name)
		assert.Contains(t, mismatch.Problem, tc.problem, tc.name)
		assert.Contains(t, err.Error(), tc.fix, "%s: says what to do", tc.name)
		require.NoError(t, c.Close())
	}
	assert.Equal(t, []string{"public.B", "public.a"}, publishedTables(t, admin, "pub_tables"), "left as it was")
	assert.Equal(t, []string{"public.a"}, publishedTables(t, admin, "pub_a"), "left as it was")

	_, err := siphon.Connect(ctx, dsn, siphon.WithPublication("pub_missing"), siphon.WithTables("public.nope"))
	var preflight *siphon.PreflightError
	assert.ErrorAs(t, err, &preflight, "a missing table is found before any publication is made")

	closeAll(t, two, one, all, every)
	assertNoLeaks(t, dsn) // no slot was made for a mismatched publication
}

func TestEnsureSlotRejectsAnotherSlotOfTheSameName(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := siphontest.Start(t)
	dsn, admin := newDatabase(t)
	otherDSN := srv.NewDatabase(t)
	other, err := pgx.Connect(ctx, otherDSN)
	require.NoError(t, err)
	defer other.Close(ctx)
	physical := streamSlot(t)
	execSQL(t, admin, "SELECT pg_create_logical_replication_slot('decoding_slot', 'test_decoding')",
		"SELECT pg_create_physical_replication_slot('"+physical+"')")
	execSQL(t, other, "SELECT pg_create_logical_replication_slot('elsewhere_slot', 'pgoutput')")
	defer execSQL(t, admin, "SELECT pg_drop_replication_slot('"+physical+"')")

	for slot, problem := range map[string]string{
		"decoding_slot":  `uses output plugin "test_decoding"`,
		"elsewhere_slot": "belongs to database",
		physical:         "is a physical slot",
	} {
		c := connect(t, dsn, siphon.WithSlot(slot))
		_, _, ensureErr := c.EnsureSlotForTest(ctx)
		_, streamErr := c.StreamChanges(ctx, 0, func(canonical.Change) error { return nil })
		for what, err := range map[string]error{"creating the slot": ensureErr, "streaming": streamErr} {
			var config *siphon.SlotConfigError
			require.ErrorAs(t, err, &config, "%s with slot %s", what, slot)
			assert.Equal(t, slot, config.Slot)
			assert.Contains(t, config.Problem, problem)
			assert.ErrorContains(t, err, "WithSlot")
		}
		require.NoError(t, c.Close())
	}
	assertNoLeaks(t, dsn, "decoding_slot")
}

// TestStreamRefusesASlotWithoutItsPublication drops the publication of a
// stream's slot: the stream stops with a *PublicationMissingError saying
// what to do, and streams nothing.
func TestStreamRefusesASlotWithoutItsPublication(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn, admin := newDatabase(t)
	execSQL(t, admin, "CREATE TABLE t (id int PRIMARY KEY)")
	c, slot, start := streamConnAt(t, dsn, siphon.WithPublication("pub_gone"))
	execSQL(t, admin, "INSERT INTO t VALUES (1)", "DROP PUBLICATION pub_gone")
	delivered := 0
	_, err := c.StreamChanges(ctx, start, func(canonical.Change) error { delivered++; return nil })
	var missing *siphon.PublicationMissingError
	require.ErrorAs(t, err, &missing)
	assert.Equal(t, siphon.PublicationMissingError{Publication: "pub_gone", Slot: slot}, *missing)
	assert.ErrorContains(t, err, "Detach")
	assert.Zero(t, delivered)
	require.NoError(t, c.DropSlot(ctx, slot))
	require.NoError(t, c.Close())
	assertNoLeaks(t, dsn)
}

// TestSlotCreationBlocked runs on a private server: a transaction holding
// an xid blocks slot creation in every database of a server.
func TestSlotCreationBlocked(t *testing.T) {
	t.Parallel()
	srv := siphontest.Start(t, siphontest.WithPrivateServer(), siphontest.WithSetting("max_prepared_transactions", "2"))
	for _, delay := range []time.Duration{50 * time.Millisecond, 0} { // 0: the default, 1s
		t.Run(fmt.Sprintf("gives up naming the blocker, RetryDelay %v", delay), func(t *testing.T) {
			testBlockedGivesUp(t, srv, delay)
		})
	}
	t.Run("names a prepared transaction", func(t *testing.T) { testBlockedByPreparedTransaction(t, srv) })
	t.Run("succeeds when the blocker commits", func(t *testing.T) { testBlockerCommits(t, srv) })
	t.Run("cancelled leaves nothing", func(t *testing.T) { testBlockedCancelled(t, srv) })
}

func testBlockedGivesUp(t *testing.T, srv *siphontest.Server, retryDelay time.Duration) {
	ctx := context.Background()
	dsn := srv.NewDatabase(t)
	pid := openBlocker(t, dsn, "SELECT txid_current(), '"+strings.Repeat("x", 300)+"'")
	logs := &logRecorder{}
	retry := siphon.SlotRetry{LockTimeout: 300 * time.Millisecond, MaxBlocked: 2 * time.Second, RetryDelay: retryDelay}
	c := connect(t, dsn, siphon.WithSlot("blocked_slot"), siphon.WithSlotRetry(retry), siphon.WithLogger(logs.logger()))

	started := time.Now()
	_, _, err := c.EnsureSlotForTest(ctx)
	elapsed := time.Since(started)
	t.Logf("RetryDelay %v: gave up after %v: %v", retryDelay, elapsed, err)

	var blocked *siphon.SlotBlockedError
	require.ErrorAs(t, err, &blocked)
	assert.Equal(t, "blocked_slot", blocked.Slot)
	// It keeps trying until MaxBlocked (less the 100ms shortest attempt), and
	// stops right after: 2.01-2.04s on an idle machine, more under heavy
	// load; the upper bound leaves a loaded machine room and still tells
	// giving up from trying on (MaxBlocked 2 s, one attempt 300 ms).
	assert.GreaterOrEqual(t, elapsed, retry.MaxBlocked-150*time.Millisecond)
	assert.Less(t, elapsed, retry.MaxBlocked+10*time.Second)
	assert.LessOrEqual(t, blocked.Waited, elapsed)
	require.NotEmpty(t, blocked.Blockers)
	b := blocked.Blockers[0]
	assert.Equal(t, pid, b.PID)
	assert.NotZero(t, b.XID)
	assert.Equal(t, "idle in transaction", b.State)
	assert.Equal(t, "blocker", b.Application)
	assert.False(t, b.TransactionStart.IsZero())
	assert.Equal(t, 200, len([]rune(b.Query)), "query cut to 200 characters")
	assert.Contains(t, err.Error(), `create slot "blocked_slot": blocked for`)
	assert.Contains(t, err.Error(), fmt.Sprintf("pid %d", pid))

	warnings := logs.find(slog.LevelWarn, "replication slot creation blocked, retrying")
	assert.Len(t, warnings, blocked.Attempts-1, "one warning per retried attempt")
	for _, w := range warnings {
		assert.Contains(t, w, fmt.Sprintf("blockers.1.pid=%d", pid))
	}
	require.NoError(t, c.Close())
	assertNoLeaks(t, dsn)
	assert.Empty(t, clusterSlots(t, dsn))
}

func testBlockedByPreparedTransaction(t *testing.T, srv *siphontest.Server) {
	ctx := context.Background()
	dsn := srv.NewDatabase(t)
	admin, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer admin.Close(ctx)
	execSQL(t, admin, "BEGIN", "SELECT txid_current()", "PREPARE TRANSACTION 'siphon_test_gid'")
	defer admin.Exec(ctx, "ROLLBACK PREPARED 'siphon_test_gid'")

	c := connect(t, dsn, siphon.WithSlot("prepared_slot"), siphon.WithSlotRetry(siphon.SlotRetry{
		LockTimeout: 300 * time.Millisecond, MaxBlocked: time.Second, RetryDelay: 50 * time.Millisecond}))
	_, _, err = c.EnsureSlotForTest(ctx)
	var blocked *siphon.SlotBlockedError
	require.ErrorAs(t, err, &blocked)
	require.NotEmpty(t, blocked.Blockers)
	assert.Equal(t, 0, blocked.Blockers[0].PID)
	assert.Equal(t, "prepared", blocked.Blockers[0].State)
	assert.Equal(t, "PREPARE TRANSACTION 'siphon_test_gid'", blocked.Blockers[0].Query)
	assert.Contains(t, err.Error(), "a prepared transaction")
	require.NoError(t, c.Close())
	assertNoLeaks(t, dsn)
}

func testBlockerCommits(t *testing.T, srv *siphontest.Server) {
	ctx := context.Background()
	dsn := srv.NewDatabase(t)
	blocker, err := connectAs(ctx, dsn, "blocker")
	require.NoError(t, err)
	defer blocker.Close(ctx)
	execSQL(t, blocker, "BEGIN", "SELECT txid_current()")
	logs := &logRecorder{}
	c := connect(t, dsn, siphon.WithSlot("patient_slot"), siphon.WithLogger(logs.logger()), siphon.WithSlotRetry(siphon.SlotRetry{
		LockTimeout: 300 * time.Millisecond, MaxBlocked: waitDeadline, RetryDelay: 50 * time.Millisecond}))

	done := make(chan error, 1)
	go func() { _, _, err := c.EnsureSlotForTest(ctx); done <- err }()
	waitFor(t, "a blocked attempt is logged", func() bool {
		return len(logs.find(slog.LevelWarn, "replication slot creation blocked, retrying")) > 0
	})
	execSQL(t, blocker, "COMMIT")

	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(waitDeadline):
		t.Fatal("slot creation did not finish after the blocker committed")
	}
	assert.Equal(t, []string{"patient_slot"}, clusterSlots(t, dsn))
	assert.Len(t, logs.find(slog.LevelInfo, "replication slot created"), 1)
	require.NoError(t, c.Close())
	assertNoLeaks(t, dsn, "patient_slot")
}

func testBlockedCancelled(t *testing.T, srv *siphontest.Server) {
	ctx := context.Background()
	dsn := srv.NewDatabase(t)
	pid := openBlocker(t, dsn, "SELECT txid_current()")
	admin, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer admin.Close(ctx)
	// A lock timeout far beyond the test: only siphon's cleanup can end the wait.
	c := connect(t, dsn, siphon.WithSlot("cancelled_slot"), siphon.WithSlotRetry(siphon.SlotRetry{LockTimeout: time.Minute}))

	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { _, _, err := c.EnsureSlotForTest(cctx); done <- err }()
	waitFor(t, "the walsender waits on the blocker", func() bool {
		var waiting bool
		err := admin.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_stat_activity WHERE backend_type = 'walsender'
			AND datname = current_database() AND wait_event_type = 'Lock')`).Scan(&waiting)
		return err == nil && waiting
	})
	cancel()
	select {
	case err := <-done:
		assert.ErrorIs(t, err, context.Canceled)
		var blocked *siphon.SlotBlockedError
		if assert.ErrorAs(t, err, &blocked, "still says who blocked") && assert.NotEmpty(t, blocked.Blockers) {
			assert.Equal(t, pid, blocked.Blockers[0].PID)
		}
	case <-time.After(waitDeadline):
		t.Fatal("cancelled slot creation did not return")
	}
	require.NoError(t, c.Close())
	assertNoLeaks(t, dsn)
	assert.Empty(t, clusterSlots(t, dsn))
}

func TestSlotCreationWaitsForTheSlotLock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn, _ := newDatabase(t)
	holder, err := connectAs(ctx, dsn, "lock_holder")
	require.NoError(t, err)
	defer holder.Close(ctx)
	var pid int
	require.NoError(t, holder.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid))
	_, err = holder.Exec(ctx, "SELECT pg_advisory_lock($1)", siphon.SlotLockKeyForTest)
	require.NoError(t, err)
	c := connect(t, dsn, siphon.WithSlot("waiting_slot"), siphon.WithSlotRetry(siphon.SlotRetry{
		LockTimeout: 300 * time.Millisecond, MaxBlocked: 500 * time.Millisecond}))

	_, _, err = c.EnsureSlotForTest(ctx)
	var blocked *siphon.SlotBlockedError
	require.ErrorAs(t, err, &blocked)
	require.Len(t, blocked.Blockers, 1, "the lock holder")
	assert.Equal(t, pid, blocked.Blockers[0].PID)
	assert.Equal(t, "lock_holder", blocked.Blockers[0].Application)
	_, err = c.SweepOrphanSlots(ctx)
	assert.ErrorContains(t, err, fmt.Sprintf("gave up waiting for the slot-management lock, by pid %d", pid))

	_, err = holder.Exec(ctx, "SELECT pg_advisory_unlock($1)", siphon.SlotLockKeyForTest)
	require.NoError(t, err)
	require.NoError(t, c.Close())
	// With the lock free, the slot is made. Not under the short bounds
	// above: creating a logical slot also waits for every transaction of
	// the server that holds a transaction ID, other tests' too.
	c = connect(t, dsn, siphon.WithSlot("waiting_slot"))
	created, _, err := c.EnsureSlotForTest(ctx)
	require.NoError(t, err)
	assert.True(t, created)
	require.NoError(t, c.Close())
	assertNoLeaks(t, dsn, "waiting_slot")
}

func TestConcurrentSlotCreatorsMakeOneSlot(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn, admin := newDatabase(t)
	const creators = 8
	conns := make([]*siphon.Conn, creators)
	for i := range conns {
		conns[i] = connect(t, dsn, siphon.WithSlot("shared_slot"), siphon.WithPublication("shared_pub"))
	}
	start := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	var created int
	errs := make([]error, creators)
	for i, c := range conns {
		wg.Go(func() {
			<-start
			made, _, err := c.EnsureSlotForTest(ctx)
			errs[i] = err
			if made {
				mu.Lock()
				created++
				mu.Unlock()
			}
		})
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		assert.NoError(t, err, "creator %d", i)
	}
	assert.Equal(t, 1, created, "exactly one creator made the slot")
	var slots, pubs int
	require.NoError(t, admin.QueryRow(ctx, "SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'shared_slot'").Scan(&slots))
	require.NoError(t, admin.QueryRow(ctx, "SELECT count(*) FROM pg_publication WHERE pubname = 'shared_pub'").Scan(&pubs))
	assert.Equal(t, 1, slots)
	assert.Equal(t, 1, pubs)
	closeAll(t, conns...)
	assertNoLeaks(t, dsn, "shared_slot")
}

func TestSnapshotSlot(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn, admin := newDatabase(t)
	execSQL(t, admin, "CREATE TABLE t (id int PRIMARY KEY)", "INSERT INTO t VALUES (1)")
	c := connect(t, dsn, siphon.WithSlot("snap_cdc"))

	snap, err := c.CreateSnapshotSlotForTest(ctx)
	require.NoError(t, err)
	assert.Regexp(t, `^siphon_snap_[0-9a-f]{16}$`, snap.Name)
	assert.NotRegexp(t, siphon.BaseSlotPatternForTest, snap.Name, "never swept")
	assert.NotEmpty(t, snap.SnapshotName)

	var cdcConfirmed string
	require.NoError(t, admin.QueryRow(ctx, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = 'snap_cdc'").Scan(&cdcConfirmed))
	cdcPos, err := pglogrepl.ParseLSN(cdcConfirmed)
	require.NoError(t, err)
	assert.LessOrEqual(t, uint64(cdcPos), uint64(snap.ConsistentPoint), "the change-stream slot exists first, so streaming continues the snapshot")
	var temporary bool
	require.NoError(t, admin.QueryRow(ctx, "SELECT temporary FROM pg_replication_slots WHERE slot_name = $1 AND database = current_database()", snap.Name).Scan(&temporary))
	assert.True(t, temporary)
	slots, err := c.Slots(ctx)
	require.NoError(t, err)
	kinds := map[string]siphon.SlotKind{}
	for _, s := range slots {
		kinds[s.Name] = s.Kind
	}
	assert.Equal(t, siphon.SlotChangeStream, kinds["snap_cdc"])
	assert.Equal(t, siphon.SlotSnapshot, kinds[snap.Name])

	execSQL(t, admin, "INSERT INTO t VALUES (2)")
	assert.Equal(t, 1, countInSnapshot(t, dsn, snap.SnapshotName), "the snapshot sees only rows committed before it")

	require.NoError(t, snap.Close(ctx))
	require.NoError(t, snap.Close(ctx), "Close twice is fine")
	var left int
	require.NoError(t, admin.QueryRow(ctx, "SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1", snap.Name).Scan(&left))
	assert.Zero(t, left, "the temporary slot is gone when Close returns")
	require.NoError(t, c.Close())
	assertNoLeaks(t, dsn, "snap_cdc")
}

func TestSlotPrivilegeRepair(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn, admin := newDatabase(t)
	suffix := fmt.Sprintf("%d", time.Now().UnixNano()%1_000_000_000)
	plain, super := "siphon_norepl_"+suffix, "siphon_su_norepl_"+suffix
	execSQL(t, admin, "CREATE ROLE "+plain+" LOGIN NOREPLICATION PASSWORD 'pw-plain'",
		"CREATE ROLE "+super+" LOGIN SUPERUSER NOREPLICATION PASSWORD 'pw-super'",
		"CREATE PUBLICATION priv_pub FOR ALL TABLES")
	t.Cleanup(func() { admin.Exec(context.Background(), "DROP ROLE IF EXISTS "+plain+", "+super) })

	// No role can grant itself REPLICATION (on 15 only superusers may
	// change it, from 16 only roles that have it), so the error says who
	// must grant it, and siphon changes nothing.
	logs := &logRecorder{}
	c := connect(t, strings.Replace(dsn, "postgres@", plain+":pw-plain@", 1),
		siphon.WithSlot("priv_slot"), siphon.WithPublication("priv_pub"), siphon.WithLogger(logs.logger()))
	_, _, err := c.EnsureSlotForTest(ctx)
	var privErr *siphon.PrivilegeError
	require.ErrorAs(t, err, &privErr)
	assert.Equal(t, plain, privErr.Role)
	assert.Contains(t, err.Error(), `lacks the REPLICATION attribute (needed for replication sessions: slots, snapshots, streams, backups): `+
		`have a superuser run ALTER ROLE "`+plain+`" WITH REPLICATION`)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	assert.Equal(t, "42501", pgErr.Code)
	assert.False(t, roleHasReplication(t, admin, plain))
	require.NoError(t, c.Close())

	// A superuser needs no REPLICATION attribute to create slots: nothing
	// to repair, and siphon changes nothing.
	su := connect(t, strings.Replace(dsn, "postgres@", super+":pw-super@", 1),
		siphon.WithSlot("priv_slot"), siphon.WithPublication("priv_pub"), siphon.WithLogger(logs.logger()))
	created, _, err := su.EnsureSlotForTest(ctx)
	require.NoError(t, err)
	assert.True(t, created)
	assert.False(t, roleHasReplication(t, admin, super))
	assert.Empty(t, logs.find(slog.LevelWarn, "granted the REPLICATION privilege to siphon's role"))
	require.NoError(t, su.Close())
	assertNoLeaks(t, dsn, "priv_slot")
}

// completeBase makes a base slot and completes it, as a Backup with
// BaseSlot does once its dump is written.
func completeBase(t *testing.T, c *siphon.Conn) *siphon.IncrementalBaseInfo {
	t.Helper()
	info := createBaseSlot(t, c)
	require.NoError(t, c.CaptureBaseEnd(context.Background(), info))
	return info
}

// loseWAL writes (messages, not rows: no table to capture) and recycles
// WAL until slot is invalidated (wal_status lost), on a server with a
// small max_slot_wal_keep_size.
func loseWAL(t *testing.T, admin *pgx.Conn, slot string) {
	t.Helper()
	waitFor(t, "the slot is invalidated", func() bool {
		execSQL(t, admin, "SELECT pg_logical_emit_message(false, 'filler', repeat('x', 1000)) FROM generate_series(1, 2000)",
			"SELECT pg_switch_wal()", "CHECKPOINT")
		var status string
		require.NoError(t, admin.QueryRow(context.Background(), "SELECT wal_status FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&status))
		return status == "lost"
	})
}

// TestSlotLimitRepair fills max_replication_slots with base slots: the
// repair drops the one that lost its WAL, never a live chain's base, and
// when nothing is siphon's to drop the error names the setting.
func TestSlotLimitRepair(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := siphontest.Start(t, siphontest.WithPrivateServer(), siphontest.WithSetting("max_replication_slots", "3"),
		siphontest.WithSetting("max_slot_wal_keep_size", "1MB"), siphontest.WithSetting("wal_keep_size", "0"))
	dsn := srv.NewDatabase(t)
	admin, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer admin.Close(ctx)
	logs := &logRecorder{}
	c := connect(t, dsn, siphon.WithSlot("limited_cdc"), siphon.WithLogger(logs.logger()))
	lost := completeBase(t, c)
	loseWAL(t, admin, lost.Slot)
	live := completeBase(t, c)
	pending := createBaseSlot(t, c) // a base being taken: its temporary slot
	pendingSlot := "siphon_pending_" + strings.TrimPrefix(pending.Slot, "siphon_")

	created, _, err := c.EnsureSlotForTest(ctx)
	require.NoError(t, err, "the base that lost its WAL dropped to make room")
	assert.True(t, created)
	assert.ElementsMatch(t, []string{"limited_cdc", live.Slot, pendingSlot}, clusterSlots(t, dsn), "the live base and the one being taken are kept")
	assert.Len(t, logs.find(slog.LevelWarn, "all replication slots were in use: dropped orphan slots"), 1)

	// Full of slots that are not siphon's orphans: nothing to drop, and the
	// error names the setting to raise.
	second := connect(t, dsn, siphon.WithSlot("limited_two"))
	_, _, err = second.EnsureSlotForTest(ctx)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "raise max_replication_slots")
	assert.Contains(t, err.Error(), "max_replication_slots = 3")
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	assert.Equal(t, "53400", pgErr.Code)
	assert.ElementsMatch(t, []string{"limited_cdc", live.Slot, pendingSlot}, clusterSlots(t, dsn), "nothing else dropped")
	err = c.CaptureBaseEnd(ctx, pending)
	assert.ErrorContains(t, err, "raise max_replication_slots", "completing a base takes one more slot for a moment")
	require.NoError(t, c.DropSlot(ctx, live.Slot))
	closeAll(t, c, second)
	assertNoLeaks(t, dsn, "limited_cdc")
}

// TestSweepOrphanSlots sweeps the base slots that lost their WAL, and
// nothing else: not live bases, a base being taken, the change-stream
// slot (even one named like a base slot), a snapshot slot, another name.
func TestSweepOrphanSlots(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := siphontest.Start(t, siphontest.WithPrivateServer(),
		siphontest.WithSetting("max_slot_wal_keep_size", "1MB"), siphontest.WithSetting("wal_keep_size", "0"))
	dsn := srv.NewDatabase(t)
	admin, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer admin.Close(ctx)
	cdc := "siphon_" + siphon.NewULIDForTest(time.Now())
	c := connect(t, dsn, siphon.WithSlot(cdc))
	_, _, err = c.EnsureSlotForTest(ctx)
	require.NoError(t, err)
	lost1, lost2 := completeBase(t, c), completeBase(t, c)
	loseWAL(t, admin, lost1.Slot)
	loseWAL(t, admin, lost2.Slot)
	busy, live := completeBase(t, c), completeBase(t, c)
	stop := activateSlot(t, dsn, busy.Slot, busy.WALStart)
	pending := createBaseSlot(t, c)
	snap, err := c.CreateSnapshotSlotForTest(ctx)
	require.NoError(t, err)
	execSQL(t, admin, "SELECT pg_create_physical_replication_slot('siphon_not_a_ulid')")
	pendingSlot := "siphon_pending_" + strings.TrimPrefix(pending.Slot, "siphon_")

	n, err := c.SweepOrphanSlots(ctx)
	require.NoError(t, err)
	assert.Equal(t, 2, n)
	assert.ElementsMatch(t, []string{cdc, snap.Name, busy.Slot, live.Slot, pendingSlot, "siphon_not_a_ulid"}, clusterSlots(t, dsn))

	// A slot that turns active between the scan and the drop is skipped.
	dropped, err := c.DropOrphansForTest(ctx, []string{busy.Slot, "siphon_gone"})
	require.NoError(t, err)
	assert.Empty(t, dropped)

	stop()
	n, err = c.SweepOrphanSlots(ctx)
	require.NoError(t, err)
	assert.Zero(t, n, "an inactive base that keeps its WAL is a live chain's")
	require.NoError(t, snap.Close(ctx))
	require.NoError(t, c.DropSlot(ctx, live.Slot))
	require.NoError(t, c.DropSlot(ctx, busy.Slot))
	require.NoError(t, c.Close())
	assert.ElementsMatch(t, []string{cdc, "siphon_not_a_ulid"}, clusterSlots(t, dsn), "the base being taken went with its Conn")
	assertNoLeaks(t, dsn, cdc)
}

func TestBaseSlotLifecycle(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := siphontest.Start(t, siphontest.WithPrivateServer())
	dsn := srv.NewDatabase(t)
	admin, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer admin.Close(ctx)
	c := connect(t, dsn)

	// A base abandoned before its end is captured leaves nothing.
	abandoned := connect(t, dsn)
	gone, err := abandoned.CreateBaseSlot(ctx)
	require.NoError(t, err)
	pendingOf := func(slot string) string { return "siphon_pending_" + strings.TrimPrefix(slot, "siphon_") }
	assert.Equal(t, []string{pendingOf(gone.Slot)}, clusterSlots(t, dsn), "a temporary slot pins the WAL while the base is taken")
	require.NoError(t, abandoned.Close())
	waitFor(t, "closing the Conn (or killing its process) drops it", func() bool { return len(clusterSlots(t, dsn)) == 0 })

	before := time.Now().Add(-time.Second)
	info, err := c.CreateBaseSlot(ctx)
	require.NoError(t, err)
	assert.Regexp(t, siphon.BaseSlotPatternForTest, info.Slot)
	assert.NotZero(t, info.WALStart)
	var restart, status string
	var temporary bool
	require.NoError(t, admin.QueryRow(ctx, `SELECT restart_lsn::text, wal_status, temporary FROM pg_replication_slots
		WHERE slot_name = $1 AND slot_type = 'physical'`, pendingOf(info.Slot)).Scan(&restart, &status, &temporary))
	assert.Equal(t, info.WALStart.String(), restart, "WAL reserved from WALStart")
	assert.Equal(t, "reserved", status)
	assert.True(t, temporary)

	execSQL(t, admin, "CREATE TABLE filler AS SELECT g AS id, repeat('x', 100) AS pad FROM generate_series(1, 20000) g")
	require.NoError(t, c.CaptureBaseEnd(ctx, info))
	assert.Greater(t, info.WALEnd, info.WALStart)
	require.NoError(t, admin.QueryRow(ctx, `SELECT restart_lsn::text, temporary FROM pg_replication_slots
		WHERE slot_name = $1 AND slot_type = 'physical'`, info.Slot).Scan(&restart, &temporary))
	assert.Equal(t, info.WALStart.String(), restart, "the permanent slot reserves the WAL from WALStart")
	assert.False(t, temporary)
	waitFor(t, "the temporary slot is gone", func() bool { return slices.Equal(clusterSlots(t, dsn), []string{info.Slot}) })

	slots, err := c.Slots(ctx)
	require.NoError(t, err)
	require.Len(t, slots, 1)
	assert.Equal(t, siphon.SlotBase, slots[0].Kind)
	assert.Equal(t, info.WALStart, slots[0].RestartPosition)
	assert.Greater(t, slots[0].RetainedBytes, int64(1_000_000), "the slot holds the WAL written since")
	assert.Equal(t, int64(-1), slots[0].SafeBytes, "max_slot_wal_keep_size is off")
	assert.WithinRange(t, slots[0].CreatedAt, before, time.Now().Add(time.Second))

	stop := activateSlot(t, dsn, info.Slot, info.WALStart)
	err = c.DropSlot(ctx, info.Slot)
	assert.ErrorIs(t, err, siphon.ErrSlotInUse)
	stop()
	require.NoError(t, c.DropSlot(ctx, info.Slot))
	require.NoError(t, c.DropSlot(ctx, info.Slot), "dropping a missing slot is fine")
	assert.Empty(t, clusterSlots(t, dsn))
	assert.ErrorContains(t, c.CaptureBaseEnd(ctx, info), "take a new base backup")
	assert.ErrorContains(t, c.DropSlot(ctx, "Bad-Name"), "not a slot siphon names")
	require.NoError(t, c.Close())
	assertNoLeaks(t, dsn)
}

func TestSlotsReportsRetainedWAL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn, admin := newDatabase(t)
	c := connect(t, dsn, siphon.WithSlot("health_cdc"))
	_, point, err := c.EnsureSlotForTest(ctx)
	require.NoError(t, err)

	health := func() siphon.SlotInfo {
		slots, err := c.Slots(ctx)
		require.NoError(t, err)
		for _, s := range slots {
			if s.Name == "health_cdc" {
				return s
			}
		}
		t.Fatal("health_cdc not listed")
		return siphon.SlotInfo{}
	}
	s := health()
	assert.Equal(t, siphon.SlotChangeStream, s.Kind)
	assert.False(t, s.Active)
	assert.Equal(t, point, s.ConfirmedPosition)
	assert.LessOrEqual(t, s.RestartPosition, s.ConfirmedPosition)
	assert.Equal(t, "reserved", s.WALStatus)

	execSQL(t, admin, "CREATE TABLE filler AS SELECT g AS id, repeat('x', 100) AS pad FROM generate_series(1, 20000) g")
	after := health()
	assert.Greater(t, after.RetainedBytes, s.RetainedBytes+1_000_000, "WAL written since is held for the slot")
	require.NoError(t, c.Close())
	assertNoLeaks(t, dsn, "health_cdc")
}

// TestBaseSlotNames checks that a base slot's name is siphon_ and a ULID.
func TestBaseSlotNames(t *testing.T) {
	t.Parallel()
	assert.Regexp(t, siphon.BaseSlotPatternForTest, "siphon_"+siphon.NewULIDForTest(time.Now()))
}

func closeAll(t *testing.T, conns ...*siphon.Conn) {
	t.Helper()
	for _, c := range conns {
		require.NoError(t, c.Close())
	}
}

// connectAs opens a session with application_name set.
func connectAs(ctx context.Context, dsn, application string) (*pgx.Conn, error) {
	config, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	config.RuntimeParams["application_name"] = application
	return pgx.ConnectConfig(ctx, config)
}

// openBlocker opens a transaction that holds an xid, having run query last,
// until the test ends, and returns its session's pid.
func openBlocker(t *testing.T, dsn, query string) int {
	t.Helper()
	ctx := context.Background()
	conn, err := connectAs(ctx, dsn, "blocker")
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close(context.Background()) })
	var pid int
	require.NoError(t, conn.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid))
	execSQL(t, conn, "BEGIN", "SELECT txid_current()", query)
	return pid
}

// clusterSlots lists every replication slot of the server, in name order.
func clusterSlots(t *testing.T, dsn string) []string {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, "SELECT slot_name::text FROM pg_replication_slots ORDER BY slot_name")
	require.NoError(t, err)
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return names
}

func createBaseSlot(t *testing.T, c *siphon.Conn) *siphon.IncrementalBaseInfo {
	t.Helper()
	info, err := c.CreateBaseSlot(context.Background())
	require.NoError(t, err)
	return info
}

// activateSlot streams the physical slot from a replication session until
// the returned stop function ends it and waits for the slot to go inactive.
func activateSlot(t *testing.T, dsn, slot string, from canonical.Position) (stop func()) {
	t.Helper()
	ctx := context.Background()
	config, err := pgconn.ParseConfig(dsn)
	require.NoError(t, err)
	config.RuntimeParams["replication"] = "true"
	conn, err := pgconn.ConnectConfig(ctx, config)
	require.NoError(t, err)
	require.NoError(t, pglogrepl.StartReplication(ctx, conn, slot, pglogrepl.LSN(from), pglogrepl.StartReplicationOptions{Mode: pglogrepl.PhysicalReplication}))
	waitSlotActive(t, dsn, slot, true)
	var once sync.Once
	stop = func() {
		once.Do(func() {
			conn.Close(ctx)
			waitSlotActive(t, dsn, slot, false)
		})
	}
	t.Cleanup(stop)
	return stop
}

func waitSlotActive(t *testing.T, dsn, slot string, active bool) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer conn.Close(ctx)
	waitFor(t, fmt.Sprintf("slot %s active=%v", slot, active), func() bool {
		var is bool
		err := conn.QueryRow(ctx, "SELECT active FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&is)
		return err == nil && is == active
	})
}

// countInSnapshot counts t's rows in a transaction that imports snapshot.
func countInSnapshot(t *testing.T, dsn, snapshot string) int {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer conn.Close(ctx)
	require.Regexp(t, regexp.MustCompile(`^[0-9A-F-]+$`), snapshot)
	execSQL(t, conn, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", "SET TRANSACTION SNAPSHOT '"+snapshot+"'")
	var n int
	require.NoError(t, conn.QueryRow(ctx, "SELECT count(*) FROM t").Scan(&n))
	execSQL(t, conn, "COMMIT")
	return n
}

// publishedTables lists the user tables a publication holds (the schema
// capture's table left out).
func publishedTables(t *testing.T, conn *pgx.Conn, publication string) []string {
	t.Helper()
	rows, err := conn.Query(context.Background(), `SELECT schemaname || '.' || tablename FROM pg_publication_tables
		WHERE pubname = $1 AND schemaname <> 'siphon' ORDER BY 1`, publication)
	require.NoError(t, err)
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return names
}

func roleHasReplication(t *testing.T, admin *pgx.Conn, role string) bool {
	t.Helper()
	var repl bool
	require.NoError(t, admin.QueryRow(context.Background(), "SELECT rolreplication FROM pg_roles WHERE rolname = $1", role).Scan(&repl))
	return repl
}

// logRecorder keeps log lines (text format) for tests to look at.
type logRecorder struct {
	mu    sync.Mutex
	lines []logLine
}

type logLine struct {
	level slog.Level
	msg   string
	text  string
}

func (r *logRecorder) logger() *slog.Logger { return slog.New(recordHandler{r: r}) }

// find returns the text of the lines at level with message msg.
func (r *logRecorder) find(level slog.Level, msg string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, l := range r.lines {
		if l.level == level && l.msg == msg {
			out = append(out, l.text)
		}
	}
	return out
}

type recordHandler struct {
	r     *logRecorder
	attrs []slog.Attr
}

func (recordHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h recordHandler) Handle(_ context.Context, rec slog.Record) error {
	var b strings.Builder
	rec.AddAttrs(h.attrs...)
	if err := slog.NewTextHandler(&b, nil).Handle(context.Background(), rec); err != nil {
		return err
	}
	h.r.mu.Lock()
	defer h.r.mu.Unlock()
	h.r.lines = append(h.r.lines, logLine{level: rec.Level, msg: rec.Message, text: b.String()})
	return nil
}

func (h recordHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return recordHandler{r: h.r, attrs: append(append([]slog.Attr(nil), h.attrs...), attrs...)}
}

func (h recordHandler) WithGroup(string) slog.Handler { return h }
