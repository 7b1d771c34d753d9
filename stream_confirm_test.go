package siphon_test

import (
	"context"
	"io"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/siphondb/siphon"
	"github.com/siphondb/siphon/canonical"
)

// TestStreamReturnsOnceTheServerConfirmed holds the walsender still
// (SIGSTOP) while the stream stops: a stream that only sent its final
// status update and closed would return with the slot behind, and the
// walsender, terminated while stopped, would never read the update. The
// stream returns only once the server confirmed the last transaction it
// handled, so the slot stands there the moment StreamChanges returns, and
// BackupIncremental's slot stands at its since.
func TestStreamReturnsOnceTheServerConfirmed(t *testing.T) {
	t.Parallel()
	dsn, admin := newDatabase(t)
	execSQL(t, admin, "CREATE TABLE t (id int PRIMARY KEY)")
	// No periodic status update could confirm anything meanwhile.
	c, slot, start := streamConnAt(t, dsn, siphon.WithStatusInterval(time.Hour))

	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	commits := make(chan canonical.Position, 1)
	type result struct {
		pos canonical.Position
		err error
	}
	done := make(chan result, 1)
	go func() {
		pos, err := c.StreamChanges(ctx, start, func(ch canonical.Change) error {
			if ch.Op == canonical.OpCommit {
				commits <- ch.Position
			}
			return nil
		})
		done <- result{pos, err}
	}()
	execSQL(t, admin, "INSERT INTO t VALUES (1)")
	var last canonical.Position
	select {
	case last = <-commits:
	case <-time.After(time.Minute):
		t.Fatal("the transaction was not streamed")
	}
	var walsender int
	require.NoError(t, admin.QueryRow(context.Background(), "SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&walsender))
	if err := syscall.Kill(walsender, syscall.SIGSTOP); err != nil {
		t.Skipf("cannot stop the walsender (pid %d) of this server: %v", walsender, err)
	}
	resumed := false
	resume := func() {
		if !resumed {
			require.NoError(t, syscall.Kill(walsender, syscall.SIGCONT))
			resumed = true
		}
	}
	defer resume()
	stop()
	var res result
	select {
	case res = <-done:
		resume()
		t.Fatal("StreamChanges returned while the walsender could not have confirmed anything")
	case <-time.After(500 * time.Millisecond):
		resume() // the stream is still waiting for the confirmation
	}
	select {
	case res = <-done:
	case <-time.After(time.Minute):
		t.Fatal("StreamChanges did not return once the walsender went on")
	}
	require.NoError(t, res.err, "cancelling is the normal stop")
	assert.Equal(t, last, res.pos)
	assert.Equal(t, last, slotConfirmed(t, admin, slot), "the slot stands at the last transaction handled the moment the stream returns")

	// BackupIncremental acknowledges its since, and nothing past it.
	execSQL(t, admin, "INSERT INTO t VALUES (2)")
	end, err := c.BackupIncremental(context.Background(), last, io.Discard)
	require.NoError(t, err)
	assert.Greater(t, end, last)
	assert.Equal(t, last, slotConfirmed(t, admin, slot), "a link's changes stay in the slot until the next link starts from its end")
	_, err = c.BackupIncremental(context.Background(), end, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, end, slotConfirmed(t, admin, slot), "starting from a link's end confirms it")

	require.NoError(t, c.Close())
	assertNoLeaks(t, dsn, slot)
}
