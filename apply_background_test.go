package siphon_test

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/siphondb/siphon"
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

	err := consumeCancelledWhileLocked(t, dsn, target, c, stream, "SELECT * FROM items WHERE id = 2 FOR UPDATE")
	require.ErrorIs(t, err, context.Canceled)
	assert.Equal(t, third, appliedPosition(t, c))
	assert.Equal(t, [][]*string{{ptr("2"), ptr("2"), ptr("updated")}},
		rawRows(t, target, "SELECT id::text, tx::text, note FROM items ORDER BY id"))
}

// consumeCancelledWhileLocked consumes stream, which holds the value "ten"
// in its last, incomplete, transaction, and an update that waits for the
// rows lock (a query) locks in another session: once the update waits,
// and the stream is read up to "ten", it cancels the call, frees the rows
// 300 ms later, then lets the rest of the stream be read, and returns
// what the call returned.
func consumeCancelledWhileLocked(t *testing.T, dsn string, target *pgx.Conn, c *siphon.Conn, stream []byte, lock string) error {
	t.Helper()
	locker := connectOrFail(t, dsn)
	execSQL(t, locker, "BEGIN", lock)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
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
	return <-done
}

// itemsAndLastStream makes a target holding the tables items and last (one
// row, its tx 0), and starts a stream of both tables from start.
func itemsAndLastStream(t *testing.T, start canonical.Position, slot string) (string, *pgx.Conn, *siphon.Conn, *streamBuilder) {
	t.Helper()
	dsn, target, c := applyTarget(t, ledgerDDL[0], ledgerDDL[3])
	execSQL(t, target, "INSERT INTO last VALUES (true, 0)")
	schema := inspect(t, c)
	return dsn, target, c, newStream(t, canonical.KindIncremental, start, slot, tableOf(t, schema, itemsName), tableOf(t, schema, lastName))
}

// insertItems returns inserts into items of the ids from first to last,
// their tx column tx, and note "bad" for the id bad.
func insertItems(first, last, tx, bad int) []canonical.Change {
	var changes []canonical.Change
	for id := first; id <= last; id++ {
		note := "new"
		if id == bad {
			note = "bad"
		}
		changes = append(changes, ins(itemsName, tv(fmt.Sprint(id)), tv(fmt.Sprint(tx)), tv(note)))
	}
	return changes
}

// TestConsumeCanonicalFailureInAQueuedCopy fails the second of several
// batches of inserts copied in the background one after another (a CHECK
// constraint the target has and the source had not): the unit is applied
// again a transaction at a time, so the three transactions before the one
// with the bad row are kept with their Position, and the error names the
// constraint, not the batches queued behind the failed one.
func TestConsumeCanonicalFailureInAQueuedCopy(t *testing.T) {
	t.Parallel()
	_, target, c := applyTarget(t, ledgerDDL[0])
	execSQL(t, target, `ALTER TABLE items ADD CONSTRAINT no_bad CHECK (note IS DISTINCT FROM 'bad')`)
	s := newStream(t, canonical.KindIncremental, 0xa000000, "queued", tableOf(t, inspect(t, c), itemsName))
	// Transactions of 800 inserts: batches of up to 2000 rows span them,
	// and the bad row, in the fourth, is in the second batch.
	var ends []canonical.Position
	for tx := 1; tx <= 9; tx++ {
		ends = append(ends, s.tx(insertItems(800*(tx-1)+1, 800*tx, tx, 2900)...))
	}
	third, fourth := ends[2], ends[3]-0x38 // its commit's start, as errors give it
	err := consume(t, c, s.done())
	require.Error(t, err)
	assert.Contains(t, err.Error(), "no_bad")
	assert.NotContains(t, err.Error(), "not run")
	assert.Contains(t, err.Error(), "applied again a transaction at a time: the transaction committed at "+fourth.String())
	assert.Equal(t, third, appliedPosition(t, c))
	assert.Equal(t, [][]*string{{ptr("2400"), ptr("3")}},
		rawRows(t, target, "SELECT count(*)::text, max(tx)::text FROM items"))
}

// TestConsumeCanonicalDamageReadAheadKeepsWhatCameBefore cuts a stream
// inside a transaction that follows full units (transactions of 1000
// inserts, as many as a unit holds at most, whose batches are still being
// copied when it commits, so the apply decodes the stream ahead
// meanwhile): the damage is reported once the transactions before it are
// applied, and they are kept. The first unit was committed whole, as one
// target transaction, before the damage was read.
func TestConsumeCanonicalDamageReadAheadKeepsWhatCameBefore(t *testing.T) {
	t.Parallel()
	_, target, c := applyTarget(t, ledgerDDL[0])
	s := newStream(t, canonical.KindIncremental, 0xb000000, "ahead", tableOf(t, inspect(t, c), itemsName))
	full := siphon.MaxUnitChangesForTest / 1000
	for tx := 1; tx <= full; tx++ {
		s.tx(insertItems(1000*(tx-1)+1, 1000*tx, tx, 0)...)
	}
	last := s.tx(insertItems(1000*full+1, 1000*full+100, full+1, 0)...)
	s.tx(insertItems(1000*full+101, 1000*full+200, full+2, 0)...)
	stream := s.done()
	cut := bytes.Index(stream, []byte(fmt.Sprintf(`"%d"`, 1000*full+150)))
	require.Positive(t, cut)

	require.ErrorIs(t, consume(t, c, stream[:cut]), canonical.ErrTruncated)
	assert.Equal(t, last, appliedPosition(t, c))
	assert.Equal(t, [][]*string{{ptr(fmt.Sprint(1000*full + 100)), ptr(fmt.Sprint(full + 1)), ptr("1")}},
		rawRows(t, target, "SELECT count(*)::text, max(tx)::text, (SELECT count(DISTINCT xmin::text) FROM items WHERE tx <= 2)::text FROM items"))
}

// TestConsumeCanonicalCancelledWithCopiesQueued cancels an apply while an
// update sent ahead waits for a row another session holds and a COPY of
// inserts is queued behind it: once the row is free, the queued COPY does
// not start, and the unit's complete source transactions are applied again
// and kept; the incomplete last one is not.
func TestConsumeCanonicalCancelledWithCopiesQueued(t *testing.T) {
	t.Parallel()
	dsn, target, c, s := itemsAndLastStream(t, 0xc000000, "cancelled")
	s.tx(insertItems(101, 200, 1, 0)...)
	s.tx(upd(lastName, nil, tv("t"), tv("2")))
	s.tx(insertItems(201, 300, 3, 0)...)
	fourth := s.tx(upd(lastName, nil, tv("t"), tv("4")))
	s.tx(ins(itemsName, tv("1000"), tv("5"), tv("ten")))
	stream := s.done()

	err := consumeCancelledWhileLocked(t, dsn, target, c, stream, "SELECT * FROM last FOR UPDATE")
	require.ErrorIs(t, err, context.Canceled)
	assert.Equal(t, fourth, appliedPosition(t, c))
	assert.Equal(t, [][]*string{{ptr("1"), ptr("100")}, {ptr("3"), ptr("100")}},
		rawRows(t, target, "SELECT tx::text, count(*)::text FROM items GROUP BY tx ORDER BY tx"))
	assert.Equal(t, [][]*string{{ptr("4")}}, rawRows(t, target, "SELECT tx::text FROM last"))
}
