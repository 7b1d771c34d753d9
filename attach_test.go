package siphon_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/siphondb/siphon"
	"github.com/siphondb/siphon/canonical"
	"github.com/siphondb/siphon/siphontest"
)

// appWorkload is an application that keeps updating and deleting rows of a
// keyed table and of keyless ones while siphon attaches, and counts the
// statements that fail.
type appWorkload struct {
	stop     chan struct{}
	done     sync.WaitGroup
	failures atomic.Int64
	ran      atomic.Int64
	mu       sync.Mutex
	errs     []string
	tables   []string
}

func startApp(t *testing.T, dsn string, tables ...string) *appWorkload {
	t.Helper()
	conn := connectOrFail(t, dsn)
	a := &appWorkload{stop: make(chan struct{}), tables: tables}
	a.done.Add(1)
	go func() {
		defer a.done.Done()
		for i := 0; ; i++ {
			select {
			case <-a.stop:
				return
			default:
			}
			a.mu.Lock()
			table := a.tables[i%len(a.tables)]
			a.mu.Unlock()
			for _, sql := range []string{
				fmt.Sprintf("INSERT INTO %s (k, note) VALUES (%d, 'new')", table, 1000+i),
				fmt.Sprintf("UPDATE %s SET note = 'updated %d' WHERE k %% 7 = %d", table, i, i%7),
				fmt.Sprintf("DELETE FROM %s WHERE k = %d", table, 1000+i-50),
			} {
				if _, err := conn.Exec(context.Background(), sql); err != nil {
					a.failures.Add(1)
					a.mu.Lock()
					a.errs = append(a.errs, err.Error())
					a.mu.Unlock()
				}
				a.ran.Add(1)
			}
		}
	}()
	t.Cleanup(a.halt)
	return a
}

// also makes the application write to another table from now on.
func (a *appWorkload) also(table string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.tables = append(a.tables, table)
}

// waitRan waits until the application ran n more statements.
func (a *appWorkload) waitRan(t *testing.T, n int64) {
	t.Helper()
	target := a.ran.Load() + n
	waitFor(t, fmt.Sprintf("the application runs %d statements", n), func() bool { return a.ran.Load() >= target })
}

func (a *appWorkload) halt() {
	select {
	case <-a.stop:
	default:
		close(a.stop)
	}
	a.done.Wait()
}

// TestAttachNeverBreaksTheApplication attaches siphon with default options
// to a database whose application keeps updating and deleting rows of a
// keyed table and of a keyless one, and later creates a keyless table and a
// keyed one and writes to them: not one application statement fails. The
// keyless tables are not captured (the publication names its tables, and
// siphon says at Warn which it left out), the keyed table is; without the
// schema capture (which adds it as it is created, see
// TestSchemaCaptureLifecycle), a keyed table created later stops the next
// stream start with a *PublicationMismatchError naming it, and
// SyncPublication adds it.
func TestAttachNeverBreaksTheApplication(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn, admin := newDatabase(t)
	execSQL(t, admin,
		`CREATE TABLE orders (k int PRIMARY KEY, note text)`,
		`CREATE TABLE app_log (k int, note text)`, // no key, no replica identity
		`INSERT INTO orders SELECT g, 'o' FROM generate_series(1, 100) g`,
		`INSERT INTO app_log SELECT g, 'l' FROM generate_series(1, 100) g`)
	app := startApp(t, dsn, "orders", "app_log")
	app.waitRan(t, 30)

	logs := &logRecorder{}
	c, _ := streamConn(t, dsn, siphon.WithLogger(logs.logger()), siphon.WithoutSchemaCapture())
	start, err := c.CurrentPosition(ctx)
	require.NoError(t, err)
	warned := logs.find(slog.LevelWarn, "tables without a usable replica identity are not captured (see WithKeylessTables)")
	require.Len(t, warned, 1)
	assert.Contains(t, warned[0], "app_log")
	app.waitRan(t, 60)

	// Tables the application creates after siphon attached.
	execSQL(t, admin, `CREATE TABLE app_events (k int, note text)`)
	app.also("app_events")
	app.waitRan(t, 60)

	// Everything the application committed so far, up to a marker.
	emitMarker(t, admin, "attached")
	changes, _ := streamUntil(t, c, start, "attached")
	tables := map[string]int{}
	for _, ch := range changes {
		if ch.Table != "" {
			tables[ch.Table]++
		}
	}
	assert.Positive(t, tables["orders"], "the keyed table is captured")
	assert.Zero(t, tables["app_log"], "the keyless table is not")
	assert.Zero(t, tables["app_events"], "nor the keyless table created later")

	execSQL(t, admin, `CREATE TABLE app_new (k int PRIMARY KEY, note text)`)
	app.also("app_new")
	app.waitRan(t, 60)
	_, err = c.StreamChanges(ctx, start, func(canonical.Change) error { return nil })
	var drift *siphon.PublicationMismatchError
	require.ErrorAs(t, err, &drift, "a keyed table created later is drift, never silent")
	assert.Equal(t, []canonical.TableName{{Schema: "public", Name: "app_new"}}, drift.Missing)
	added, err := c.SyncPublication(ctx)
	require.NoError(t, err)
	assert.Equal(t, []canonical.TableName{{Schema: "public", Name: "app_new"}}, added)
	assert.Equal(t, []string{"public.app_new", "public.orders"}, publishedTables(t, admin, "siphon"))
	app.waitRan(t, 60)

	app.halt()
	assert.Zero(t, app.failures.Load(), "application statements failed: %v", app.errs)
	assert.Greater(t, app.ran.Load(), int64(200))
	require.NoError(t, c.Detach(ctx))
	require.NoError(t, c.Close())
	assertNoLeaks(t, dsn)
	assert.Empty(t, publishedTables(t, admin, "siphon"), "Detach dropped the publication")
}

// TestKeylessPolicies attaches with each policy for keyless tables: inserts
// only (a companion publication; the application's updates still work and
// are not captured), REPLICA IDENTITY FULL (siphon sets it; updates and
// deletes are captured whole); and a WithTables table without a key is
// refused until a policy is chosen. A published table that loses its
// primary key leaves the publication at once with the schema capture, and
// is drift that SyncPublication mends without it.
func TestKeylessPolicies(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ddl := []string{`CREATE TABLE keyed (k int PRIMARY KEY, note text)`, `CREATE TABLE logs (k int, note text)`}
	stream := func(c *siphon.Conn, start canonical.Position, admin *pgx.Conn) map[string][]canonical.Op {
		execSQL(t, admin, `INSERT INTO logs VALUES (1, 'a'), (2, 'b')`, `UPDATE logs SET note = 'c' WHERE k = 1`,
			`DELETE FROM logs WHERE k = 2`, `SELECT pg_logical_emit_message(true, 'keyless.end', '')`)
		ops := map[string][]canonical.Op{}
		runCtx, cancel := context.WithCancel(ctx)
		defer cancel()
		_, err := c.StreamChanges(runCtx, start, func(ch canonical.Change) error {
			switch {
			case ch.Op == canonical.OpMessage && ch.Message.Prefix == "keyless.end":
				cancel()
			case ch.Table != "":
				ops[ch.Table] = append(ops[ch.Table], ch.Op)
			}
			return nil
		})
		require.NoError(t, err)
		return ops
	}

	dsn, admin := newDatabase(t)
	execSQL(t, admin, ddl...)
	inserts, _ := streamConn(t, dsn, siphon.WithKeylessTables(siphon.KeylessInsertsOnly))
	require.NoError(t, inserts.InstallSchemaCapture(ctx))
	start, err := inserts.CurrentPosition(ctx)
	require.NoError(t, err)
	assert.Equal(t, []string{"public.keyed"}, publishedTables(t, admin, "siphon"))
	assert.Equal(t, []string{"public.logs"}, publishedTables(t, admin, "siphon_inserts"))
	assert.Equal(t, []canonical.Op{canonical.OpInsert, canonical.OpInsert}, stream(inserts, start, admin)["logs"],
		"inserts captured; the update and delete worked and are not")
	require.NoError(t, inserts.Detach(ctx))
	assert.Empty(t, publishedTables(t, admin, "siphon_inserts"), "Detach drops the companion too")

	dsn, admin = newDatabase(t)
	execSQL(t, admin, ddl...)
	full, _ := streamConn(t, dsn, siphon.WithKeylessTables(siphon.KeylessFull))
	start, err = full.CurrentPosition(ctx)
	require.NoError(t, err)
	var identity string
	require.NoError(t, admin.QueryRow(ctx, "SELECT relreplident::text FROM pg_class WHERE relname = 'logs'").Scan(&identity))
	assert.Equal(t, "f", identity, "siphon set REPLICA IDENTITY FULL")
	assert.Equal(t, []canonical.Op{canonical.OpInsert, canonical.OpInsert, canonical.OpUpdate, canonical.OpDelete},
		stream(full, start, admin)["logs"])
	require.NoError(t, full.Detach(ctx))

	named, _ := streamConn(t, dsn, siphon.WithPublication("named_keyless"), siphon.WithTables("keyed", "logs"))
	execSQL(t, admin, `ALTER TABLE logs REPLICA IDENTITY DEFAULT`)
	_, err = named.CurrentPosition(ctx)
	var noIdentity *siphon.ReplicaIdentityError
	require.ErrorAs(t, err, &noIdentity, "a named table without a key needs a policy")
	assert.Equal(t, []canonical.TableName{{Schema: "public", Name: "logs"}}, noIdentity.Tables)
	assert.Contains(t, err.Error(), "WithKeylessTables")
	assert.Empty(t, publishedTables(t, admin, "named_keyless"), "nothing made")

	// A published table loses its primary key. The schema capture takes it
	// out in the same transaction, as KeylessSkip says: the application's
	// updates never fail.
	dsn, admin = newDatabase(t)
	execSQL(t, admin, ddl...)
	captured, _ := streamConn(t, dsn)
	require.NoError(t, captured.InstallSchemaCapture(ctx))
	_, err = captured.CurrentPosition(ctx)
	require.NoError(t, err)
	execSQL(t, admin, `ALTER TABLE keyed DROP CONSTRAINT keyed_pkey`, `UPDATE keyed SET note = 'x'`)
	assert.Empty(t, publishedTables(t, admin, "siphon"))
	require.NoError(t, captured.Detach(ctx))

	// Without the capture, the updates fail until SyncPublication takes it
	// out.
	dsn, admin = newDatabase(t)
	execSQL(t, admin, ddl...)
	skip, _ := streamConn(t, dsn, siphon.WithoutSchemaCapture())
	_, err = skip.CurrentPosition(ctx)
	require.NoError(t, err)
	execSQL(t, admin, `ALTER TABLE keyed DROP CONSTRAINT keyed_pkey`)
	_, err = admin.Exec(ctx, `UPDATE keyed SET note = 'x'`)
	require.Error(t, err, "PostgreSQL refuses the update of a published table without identity")
	_, err = skip.CurrentPosition(ctx)
	var drift *siphon.PublicationMismatchError
	require.ErrorAs(t, err, &drift)
	assert.Equal(t, []canonical.TableName{{Schema: "public", Name: "keyed"}}, drift.Unsafe)
	added, err := skip.SyncPublication(ctx)
	require.NoError(t, err)
	assert.Empty(t, added)
	assert.Empty(t, publishedTables(t, admin, "siphon"))
	execSQL(t, admin, `UPDATE keyed SET note = 'x'`)
	require.NoError(t, skip.Detach(ctx))
}

// TestConnectChecks covers what Connect refuses at once: a DSN with a wrong
// part, named without the password; a server with wal_level replica, for a
// Conn given a source option (one without gets it from its first read of
// changes, while it may still apply); a closed Conn; and a nil callback.
func TestConnectChecks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for dsn, part := range map[string]string{
		"garbage":                                "word 1 is not keyword=value",
		"postgress://u:pw-s3cret@localhost/db":   `the URL scheme is "postgress"`,
		"postgres://u:pw-s3cret@localhost:99999": `the port "99999" is not a number from 1 to 65535`,
	} {
		_, err := siphon.Connect(ctx, dsn)
		require.ErrorIs(t, err, siphon.ErrInvalidDSN, dsn)
		assert.Contains(t, err.Error(), part)
		assert.NotContains(t, err.Error(), "pw-s3cret")
	}

	srv := siphontest.Start(t, siphontest.WithPrivateServer(), siphontest.WithSetting("wal_level", "replica"))
	dsn := srv.NewDatabase(t)
	_, err := siphon.Connect(ctx, dsn, siphon.WithSlot("needs_logical"))
	var preflight *siphon.PreflightError
	require.ErrorAs(t, err, &preflight)
	assert.Equal(t, siphon.CheckWALLevel, preflight.Check.Name)
	assert.Contains(t, err.Error(), "ALTER SYSTEM SET wal_level = logical")

	target, err := siphon.Connect(ctx, dsn)
	require.NoError(t, err, "a Conn that may only apply connects")
	report, err := target.Preflight(ctx)
	require.NoError(t, err)
	check, ok := report.Check(siphon.CheckWALLevel)
	require.True(t, ok)
	assert.Equal(t, siphon.CheckFailed, check.Status)
	_, err = target.CurrentPosition(ctx)
	require.ErrorAs(t, err, &preflight, "its first read of changes says why")
	_, err = target.StreamChanges(ctx, 0, nil)
	require.ErrorIs(t, err, siphon.ErrNilArgument)
	require.NoError(t, target.Close())
	_, err = target.InspectSchema(ctx)
	require.ErrorIs(t, err, siphon.ErrClosed)
	_, err = target.CurrentPosition(ctx)
	require.ErrorIs(t, err, siphon.ErrClosed)
}

// TestPreflightReportsTheFixes runs Preflight on an application database
// with a keyless table, a role without REPLICATION nor the right to set
// session_replication_role, and a full slot table: each is reported with
// the exact fix, and Preflight changed nothing.
func TestPreflightReportsTheFixes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := siphontest.Start(t, siphontest.WithPrivateServer(), siphontest.WithSetting("max_replication_slots", "2"))
	dsn := srv.NewDatabase(t)
	admin := connectOrFail(t, dsn)
	execSQL(t, admin, `CREATE TABLE orders (k int PRIMARY KEY)`, `CREATE TABLE app_log (k int)`,
		`SELECT pg_create_physical_replication_slot('other_a')`, `SELECT pg_create_physical_replication_slot('other_b')`)
	plain := plainRole(t, dsn, admin)
	c, err := siphon.Connect(ctx, plain)
	require.NoError(t, err)
	defer c.Close()
	report, err := c.Preflight(ctx)
	require.NoError(t, err)
	t.Logf("%s", report)

	fix := func(name siphon.CheckName) siphon.Check {
		check, ok := report.Check(name)
		require.True(t, ok, name)
		return check
	}
	assert.Equal(t, siphon.CheckOK, fix(siphon.CheckWALLevel).Status)
	assert.Equal(t, siphon.CheckFailed, fix(siphon.CheckReplicationRole).Status)
	assert.Contains(t, fix(siphon.CheckReplicationRole).Fix, "WITH REPLICATION")
	assert.Equal(t, siphon.CheckFailed, fix(siphon.CheckSlots).Status)
	assert.Contains(t, fix(siphon.CheckSlots).Fix, "raise max_replication_slots")
	assert.Equal(t, siphon.CheckWarning, fix(siphon.CheckReplicaIdentity).Status)
	assert.Contains(t, fix(siphon.CheckReplicaIdentity).Found, "public.app_log")
	assert.Contains(t, fix(siphon.CheckReplicaIdentity).Fix, "WithKeylessTables(KeylessFull)")
	assert.Equal(t, siphon.CheckWarning, fix(siphon.CheckApplyRole).Status)
	assert.Contains(t, fix(siphon.CheckApplyRole).Fix, "GRANT SET ON PARAMETER session_replication_role TO")
	assert.Equal(t, siphon.CheckWarning, fix(siphon.CheckSlotWALLimit).Status)
	assert.Contains(t, fix(siphon.CheckRelease).Found, "PostgreSQL")
	for _, name := range []siphon.CheckName{siphon.CheckPgDump, siphon.CheckPgRestore, siphon.CheckPublication, siphon.CheckOrigins, siphon.CheckEncoding} {
		assert.NotEmpty(t, fix(name).Found, name)
	}
	assert.NotEmpty(t, report.Failed())
	assert.True(t, strings.Contains(report.String(), "failed   replication slots"), report.String())
	assert.Equal(t, []string{"other_a", "other_b"}, clusterSlots(t, dsn), "Preflight changed nothing")
	assert.Empty(t, publishedTables(t, admin, "siphon"))
}
