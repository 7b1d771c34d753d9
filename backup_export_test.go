package siphon

import "time"

// What the external tests of Backup need from the inside.

// BackupHooksForTest: AfterSnapshot runs once a Backup's snapshot exists,
// AfterGuard once its tables are locked, both before pg_dump starts;
// LockWait, when set, is how long pg_dump waits for a table lock.
type BackupHooksForTest struct {
	AfterSnapshot, AfterGuard func()
	LockWait                  time.Duration
}

// SetBackupHooksForTest sets what c's Backups do for a test; call it
// before the Backup.
func (c *Conn) SetBackupHooksForTest(h BackupHooksForTest) {
	c.backupTest = backupTestHooks{afterSnapshot: h.AfterSnapshot, afterGuard: h.AfterGuard, lockWait: h.LockWait}
}
