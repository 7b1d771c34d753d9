package siphon_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/siphondb/siphon/canonical"
)

// TestConsumeCanonicalCancelledWhileAStatementWaits cancels an apply while
// a statement it sent ahead waits for a row another session holds, and the
// stream is read on: once the row is free the statement ends, and the
// three complete source transactions are kept with their Position, as when
// ctx is cancelled between records; the fourth, incomplete, is not.
func TestConsumeCanonicalCancelledWhileAStatementWaits(t *testing.T) {
	t.Parallel()
	dsn, target, c := applyTarget(t, ledgerDDL[0])
	execSQL(t, target, "INSERT INTO items VALUES (1, 0, 'one'), (2, 0, 'two'), (3, 0, 'three')")
	s := newStream(t, canonical.KindIncremental, 0x9000000, "cancelled", tableOf(t, inspect(t, c), itemsName))
	s.tx(del(itemsName, tv("1"), tv("0"), tv("one")))
	s.tx(upd(itemsName, nil, tv("2"), tv("2"), tv("updated")))
	third := s.tx(del(itemsName, tv("3"), tv("0"), tv("three")))
	s.tx(ins(itemsName, tv("10"), tv("4"), tv("ten")))
	stream := s.done()

	locker := connectOrFail(t, dsn)
	execSQL(t, locker, "BEGIN", "SELECT * FROM items WHERE id = 2 FOR UPDATE")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// The stream stops inside the fourth transaction's insert.
	at := bytes.Index(stream, []byte(`"ten"`))
	require.Positive(t, at)
	open := make(chan struct{})
	gate := &pausingReader{r: bytes.NewReader(stream), at: at, pause: func() { <-open }}
	done := make(chan error, 1)
	go func() { done <- c.ConsumeCanonical(ctx, gate) }()
	waitFor(t, "the update waits for the row", func() bool {
		var waits bool
		require.NoError(t, target.QueryRow(context.Background(), `SELECT EXISTS (SELECT FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE 'UPDATE%')`).Scan(&waits))
		return waits
	})
	cancel()
	time.Sleep(300 * time.Millisecond)
	execSQL(t, locker, "ROLLBACK")
	close(open)

	require.ErrorIs(t, <-done, context.Canceled)
	assert.Equal(t, third, appliedPosition(t, c))
	assert.Equal(t, [][]*string{{ptr("2"), ptr("2"), ptr("updated")}},
		rawRows(t, target, "SELECT id::text, tx::text, note FROM items ORDER BY id"))
}
