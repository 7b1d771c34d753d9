package siphon_test

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/siphondb/siphon"
	"github.com/siphondb/siphon/canonical"
)

// TestBackupRefusesATableRewrittenAfterItsSnapshot: TRUNCATE and a
// rewriting ALTER TABLE are not MVCC-safe, so one that commits after the
// backup's snapshot and before the table is locked would leave pg_dump
// reading the table as empty through the snapshot (a migration holding an
// earlier table makes that window as long as it runs). Without the
// guard's check the backup succeeded with the table empty: after the
// ALTER, its 100 rows, which the source still holds, were lost to every
// restore of the chain.
func TestBackupRefusesATableRewrittenAfterItsSnapshot(t *testing.T) {
	t.Parallel()
	skipUnlessDumpClients(t)
	for _, rewrite := range []string{"TRUNCATE c", "ALTER TABLE c ALTER COLUMN v TYPE bigint"} {
		t.Run(rewrite, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			dsn, src := newDatabase(t)
			execSQL(t, src,
				"CREATE TABLE b (id int PRIMARY KEY)",
				"CREATE TABLE c (id int PRIMARY KEY, v int)",
				"INSERT INTO c SELECT g, g FROM generate_series(1, 100) g")
			c, _ := backupConn(t, dsn)
			c.SetBackupHooksForTest(siphon.BackupHooksForTest{AfterSnapshot: func() { execSQL(t, src, rewrite) }})
			var out bytes.Buffer
			err := c.Backup(ctx, siphon.BackupOptions{}, &out)
			var conflict *siphon.BackupConflictError
			require.ErrorAs(t, err, &conflict, "a backup of a table rewritten after its snapshot")
			assert.Equal(t, canonical.TableName{Schema: "public", Name: "c"}, conflict.Table)
			assert.Contains(t, err.Error(), "rewritten after the backup's snapshot")
			assert.True(t, siphon.Retryable(err))
			assert.Zero(t, out.Len(), "the refused backup wrote something")

			// Run again, the backup holds what the source holds.
			c.SetBackupHooksForTest(siphon.BackupHooksForTest{})
			data := backup(t, c, siphon.BackupOptions{})
			dstDSN, dst := newDatabase(t)
			target, _ := backupConn(t, dstDSN)
			require.NoError(t, target.Restore(ctx, siphon.RestoreOptions{}, bytes.NewReader(data)))
			assert.Equal(t, tableDigests(t, src), tableDigests(t, dst), "every table's rows")
		})
	}
}

// TestBackupGivesUpBehindAStatementThatWaitsForIt: the backup's guard
// holds its tables from before pg_dump starts, so a TRUNCATE after that
// waits until the backup ends, and never leaves pg_dump a table emptied
// under its snapshot. One that queues before pg_dump asks for its table
// waits for the guard, pg_dump waits behind it, and the guard waits for
// pg_dump: the server sees no cycle. pg_dump gives up after its lock
// wait, the backup returns a retryable *BackupConflictError naming the
// table, and the TRUNCATE goes on, not failed.
func TestBackupGivesUpBehindAStatementThatWaitsForIt(t *testing.T) {
	t.Parallel()
	skipUnlessDumpClients(t)
	for _, jobs := range []int{1, 2} {
		t.Run(fmt.Sprintf("jobs=%d", jobs), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			dsn, src := newDatabase(t)
			execSQL(t, src,
				"CREATE TABLE a (id int PRIMARY KEY)",
				"CREATE TABLE b (id int PRIMARY KEY)",
				"INSERT INTO b SELECT generate_series(1, 100)")
			c, _ := backupConn(t, dsn)
			truncate := connectOrFail(t, dsn)
			truncated := make(chan error, 1)
			c.SetBackupHooksForTest(siphon.BackupHooksForTest{LockWait: time.Second, AfterGuard: func() {
				go func() { _, err := truncate.Exec(ctx, "TRUNCATE b"); truncated <- err }()
				waitLocked(t, src, "the TRUNCATE", "b") // for the guard
			}})
			err := c.Backup(ctx, siphon.BackupOptions{Jobs: jobs, TempDir: t.TempDir()}, &bytes.Buffer{})
			var conflict *siphon.BackupConflictError
			require.ErrorAs(t, err, &conflict)
			assert.Equal(t, canonical.TableName{Schema: "public", Name: "b"}, conflict.Table)
			assert.Contains(t, err.Error(), "pg_dump gave up waiting behind it")
			assert.True(t, siphon.Retryable(err))
			require.NoError(t, <-truncated, "the user's TRUNCATE failed")
			var rows int
			require.NoError(t, src.QueryRow(ctx, "SELECT count(*) FROM b").Scan(&rows))
			assert.Zero(t, rows, "the TRUNCATE did not go on")
		})
	}
}

// TestBackupOutlivesTheDatabasesTimeouts: a database whose sessions get
// short timeouts (ALTER DATABASE ... SET) still gets its full backup: the
// guard that holds the tables is idle in its transaction while pg_dump
// starts, and must not be ended half way, which would let go of its locks.
func TestBackupOutlivesTheDatabasesTimeouts(t *testing.T) {
	t.Parallel()
	skipUnlessDumpClients(t)
	ctx := context.Background()
	dsn, src := newDatabase(t)
	execSQL(t, src, "CREATE TABLE b (id int PRIMARY KEY)", "INSERT INTO b SELECT generate_series(1, 100)")
	shortDatabaseTimeouts(t, src)
	c, _ := backupConn(t, dsn)
	c.SetBackupHooksForTest(siphon.BackupHooksForTest{AfterGuard: func() { time.Sleep(1500 * time.Millisecond) }})
	data := backup(t, c, siphon.BackupOptions{})
	dstDSN, dst := newDatabase(t)
	target, _ := backupConn(t, dstDSN)
	require.NoError(t, target.Restore(ctx, siphon.RestoreOptions{}, bytes.NewReader(data)))
	assert.Equal(t, tableDigests(t, src), tableDigests(t, dst), "every table's rows")
}
