package siphon_test

import (
	"bytes"
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/siphondb/siphon"
	"github.com/siphondb/siphon/canonical"
	"github.com/siphondb/siphon/siphontest"
)

// skipUnlessDumpClients skips a test that takes, restores or verifies
// pg_dump backups when this machine's pg_dump or pg_restore is of an older
// release than the test server (the tests run on every supported release;
// the client programs may be older).
func skipUnlessDumpClients(t *testing.T) {
	t.Helper()
	siphontest.Start(t).SkipUnlessDumpClients(t)
}

// serverRelease returns the test server's major release: 16 for 16.4.
func serverRelease(t *testing.T) int {
	t.Helper()
	num, err := siphontest.Start(t).VersionNum(context.Background())
	require.NoError(t, err)
	return num / 10000
}

// TestLocalChangesOnlyLeavesOutAppliedChanges applies a change from
// database A to database B with ConsumeCanonical, then makes a change on B
// itself: a stream of B with WithLocalChangesOnly delivers B's own change
// only, so B never sends A's change back to A; a stream without it delivers
// both.
func TestLocalChangesOnlyLeavesOutAppliedChanges(t *testing.T) {
	t.Parallel()
	siphontest.Start(t).SkipUnlessRelease(t, 16)
	ctx := context.Background()
	dsnA, connA := newDatabase(t)
	dsnB, connB := newDatabase(t)
	for _, conn := range []*pgx.Conn{connA, connB} {
		execSQL(t, conn, `CREATE TABLE t (id int PRIMARY KEY, made text)`)
	}
	a, slotA, fromA := streamConnAt(t, dsnA)
	local, _, fromLocal := streamConnAt(t, dsnB, siphon.WithLocalChangesOnly())
	every, _, fromEvery := streamConnAt(t, dsnB)
	var systemID string
	require.NoError(t, connA.QueryRow(ctx, "SELECT system_identifier::text FROM pg_control_system()").Scan(&systemID))
	forgetAppliedPosition(t, dsnB, systemID, slotA)

	execSQL(t, connA, `INSERT INTO t VALUES (1, 'on A')`)
	var changesOfA bytes.Buffer
	_, err := a.BackupIncremental(ctx, fromA, &changesOfA)
	require.NoError(t, err)
	require.NoError(t, every.ConsumeCanonical(ctx, &changesOfA))
	execSQL(t, connB, `INSERT INTO t VALUES (2, 'on B')`)
	emitMarker(t, connB, "end")

	got, _ := streamUntil(t, local, fromLocal, "end")
	assert.Equal(t, []string{"2"}, insertedIDs(t, got), "WithLocalChangesOnly: the change made on B only (ConsumeCanonical applies through a replication origin)")
	got, _ = streamUntil(t, every, fromEvery, "end")
	assert.Equal(t, []string{"1", "2"}, insertedIDs(t, got), "by default: the change applied from A too")
}

// TestLocalChangesOnlyRefusedBefore16 checks that a server without origin
// filtering refuses WithLocalChangesOnly with an *OptionError naming the
// release it needs, before BackupIncremental writes anything.
func TestLocalChangesOnlyRefusedBefore16(t *testing.T) {
	t.Parallel()
	if release := serverRelease(t); release >= 16 {
		t.Skipf("PostgreSQL %d filters by origin: the refusal is for releases before 16", release)
	}
	dsn, admin := newDatabase(t)
	execSQL(t, admin, `CREATE TABLE t (id int PRIMARY KEY)`)
	c, _, from := streamConnAt(t, dsn, siphon.WithLocalChangesOnly())

	_, err := c.StreamChanges(context.Background(), from, func(canonical.Change) error { return nil })
	assertNeedsRelease(t, err, "WithLocalChangesOnly", "16")
	var w bytes.Buffer
	_, err = c.BackupIncremental(context.Background(), from, &w)
	assertNeedsRelease(t, err, "WithLocalChangesOnly", "16")
	assert.Zero(t, w.Len(), "nothing written")
}

// TestFailoverSlot checks that WithFailoverSlot creates the persistent slot
// as a failover slot, and that the default is an ordinary one.
func TestFailoverSlot(t *testing.T) {
	t.Parallel()
	siphontest.Start(t).SkipUnlessRelease(t, 17)
	dsn, admin := newDatabase(t)
	_, failoverSlot, _ := streamConnAt(t, dsn, siphon.WithFailoverSlot())
	_, plainSlot, _ := streamConnAt(t, dsn)
	for slot, want := range map[string]bool{failoverSlot: true, plainSlot: false} {
		var failover bool
		require.NoError(t, admin.QueryRow(context.Background(),
			"SELECT failover FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&failover))
		assert.Equal(t, want, failover, slot)
	}
}

// TestFailoverSlotRefusedBefore17 checks that a server without failover
// slots refuses WithFailoverSlot with an *OptionError naming the release it
// needs, before it creates the publication or the slot.
func TestFailoverSlotRefusedBefore17(t *testing.T) {
	t.Parallel()
	if release := serverRelease(t); release >= 17 {
		t.Skipf("PostgreSQL %d has failover slots: the refusal is for releases before 17", release)
	}
	dsn, admin := newDatabase(t)
	c, slot := streamConn(t, dsn, siphon.WithFailoverSlot())
	_, err := c.CurrentPosition(context.Background())
	assertNeedsRelease(t, err, "WithFailoverSlot", "17")
	var created int
	require.NoError(t, admin.QueryRow(context.Background(), `SELECT
		(SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1) +
		(SELECT count(*) FROM pg_publication)`, slot).Scan(&created))
	assert.Zero(t, created, "neither the slot nor the publication created")
}

func assertNeedsRelease(t *testing.T, err error, option, release string) {
	t.Helper()
	var optErr *siphon.OptionError
	require.True(t, errors.As(err, &optErr), "an *OptionError, got %v", err)
	assert.Equal(t, option, optErr.Option)
	assert.Contains(t, optErr.Problem, "needs PostgreSQL "+release+" or later")
}

// insertedIDs returns the id column of the inserts among changes.
func insertedIDs(t *testing.T, changes []canonical.Change) []string {
	t.Helper()
	var ids []string
	for _, ch := range changes {
		if ch.Op == canonical.OpInsert {
			v, ok := ch.Value("id")
			require.True(t, ok)
			id, _ := v.Text()
			ids = append(ids, id)
		}
	}
	return ids
}

// TestIdleSlotTimeoutMakesALostSlot runs a server whose
// idle_replication_slot_timeout (PostgreSQL 18) invalidates slots idle for
// a second: a stream from the invalidated slot is a *ResumeGapError saying
// the slot is lost, not a silent start somewhere else.
func TestIdleSlotTimeoutMakesALostSlot(t *testing.T) {
	t.Parallel()
	siphontest.Start(t).SkipUnlessRelease(t, 18)
	srv := siphontest.Start(t, siphontest.WithPrivateServer(), siphontest.WithSetting("idle_replication_slot_timeout", "1"))
	dsn := srv.NewDatabase(t)
	admin := connectOrFail(t, dsn)
	execSQL(t, admin, `CREATE TABLE t (id int PRIMARY KEY)`)
	c, slot, from := streamConnAt(t, dsn)
	waitFor(t, "the idle slot invalidated", func() bool {
		var reason *string
		execSQL(t, admin, "CHECKPOINT") // where idle slots are invalidated
		require.NoError(t, admin.QueryRow(context.Background(),
			"SELECT invalidation_reason FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&reason))
		return reason != nil && *reason == "idle_timeout"
	})

	_, err := c.StreamChanges(context.Background(), from, func(canonical.Change) error { return nil })
	var gap *siphon.ResumeGapError
	require.True(t, errors.As(err, &gap), "a *ResumeGapError, got %v", err)
	assert.Equal(t, siphon.GapSlotLost, gap.Reason)
}
