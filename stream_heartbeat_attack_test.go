package siphon_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/siphondb/siphon"
	"github.com/siphondb/siphon/canonical"
)

// TestForgedHeartbeatsSkipNoChange: a role that may only connect to the
// source database (pg_logical_emit_message is granted to PUBLIC) writes
// messages with siphon's heartbeat prefix for the stream's slot, whose
// name and position pg_replication_slots shows her. The first claims that
// nothing was published from the consumer's last transaction up to 2 kB
// past the WAL written so far, into the next transaction (of 100 rows);
// the consumer then fails on that transaction, and the second, written
// once that stream ended, claims that nothing was published up to where
// the slot stands. The consumer resumes from its last commit and gets the
// transaction it failed on. Before, the stream confirmed the first claim
// once its walsender had read that far, past the start of the
// transaction, and the resume was refused as behind the slot; with the
// slot past the transaction's end (as when siphon confirmed as far as its
// walsender had read), the second claim vouched for the resume and the
// transaction was skipped, with nothing to say so.
func TestForgedHeartbeatsSkipNoChange(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn, admin := newDatabase(t)
	execSQL(t, admin, "CREATE TABLE accounts (id int PRIMARY KEY, balance int)")
	_, malloryDSN := loginRole(t, dsn, admin, "mallory", "")
	mallory := connectOrFail(t, malloryDSN)
	c, slot, start := streamConnAt(t, dsn, siphon.WithTables("accounts"))

	// forge writes, as her, a heartbeat for the database's slot as she
	// sees it, whose last and at are SQL expressions of the slot's
	// confirmed position (confirmed) and the WAL insert position (insert).
	forge := func(last, at string) {
		t.Helper()
		writeHeartbeat(t, mallory, "slot_name", last, at, `FROM (SELECT slot_name, confirmed_flush_lsn AS confirmed,
			pg_current_wal_insert_lsn() AS insert FROM pg_replication_slots WHERE database = current_database()) s`)
	}

	execSQL(t, admin, "INSERT INTO accounts VALUES (1, 100)")
	errTargetDown := errors.New("the target is down")
	var handled canonical.Position // the end of the last transaction the consumer handled
	_, err := c.StreamChanges(ctx, start, func(ch canonical.Change) error {
		switch {
		case ch.Op == canonical.OpCommit && handled == 0:
			handled = ch.Position
			// Her claim, read by the stream right after this transaction:
			// nothing published since it, up to 2 kB into the next one.
			forge("'"+handled.String()+"'", "insert + 2048")
			execSQL(t, admin, "INSERT INTO accounts SELECT i, 200 FROM generate_series(2, 101) i")
		case ch.Op == canonical.OpBegin && handled != 0:
			return errTargetDown // the consumer fails on the second transaction
		}
		return nil
	})
	require.ErrorIs(t, err, errTargetDown)
	require.NotZero(t, handled)
	confirmed := slotConfirmed(t, admin, slot)
	assert.Less(t, confirmed, insertPosition(t, admin), "the slot stands no further than WAL that was written")

	// Her second claim, for where the slot stands now.
	forge("'0/0'", "confirmed")
	emitMarker(t, admin, "after")
	changes, _ := streamUntil(t, c, handled, "after")
	txs := transactions(t, changes)
	require.Len(t, txs, 1, "the transaction the consumer failed on comes again")
	id, _ := txs[0].changes[0].Value("id")
	assert.Equal(t, "2", id.String())

	require.NoError(t, c.Close())
	assertNoLeaks(t, dsn, slot)
}
