package siphon_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/siphondb/siphon/canonical"
)

// eventInserts returns n inserts into the keyless events, with tx column
// tx and payloads {"e":0} to {"e":n-1}.
func eventInserts(tx, n int) []canonical.Change {
	var changes []canonical.Change
	for e := range n {
		changes = append(changes, ins(eventsName, tv(fmt.Sprint(tx)), tv(fmt.Sprintf(`{"e":%d}`, e)), null))
	}
	return changes
}

// notedItems returns inserts into items of the ids from first to last,
// each with note "n<id>" but for the ids in notes, and tx column tx.
func notedItems(first, last, tx int, notes map[int]string) []canonical.Change {
	var changes []canonical.Change
	for id := first; id <= last; id++ {
		note, ok := notes[id]
		if !ok {
			note = fmt.Sprintf("n%d", id)
		}
		changes = append(changes, ins(itemsName, tv(fmt.Sprint(id)), tv(fmt.Sprint(tx)), tv(note)))
	}
	return changes
}

// TestConsumeCanonicalCopyStreamAfterQueuedStatements applies, after a
// delete (whose statement is prepared then), one transaction that inserts
// 2000 items (a COPY, left open for the batches that follow), deletes one
// of them, then inserts 2000 more, one of which takes the deleted row's
// note, which a unique index on the target guards: the delete, queued
// between the batches, must reach the server before the second batch
// does, as it came before it in the source.
func TestConsumeCanonicalCopyStreamAfterQueuedStatements(t *testing.T) {
	t.Parallel()
	_, target, c := applyTarget(t, ledgerDDL[0])
	execSQL(t, target, "CREATE UNIQUE INDEX items_note ON items (note)", "INSERT INTO items VALUES (0, 0, 'n0')")
	s := newStream(t, canonical.KindIncremental, 0xd000000, "streamed", tableOf(t, inspect(t, c), itemsName))
	s.tx(del(itemsName, tv("0"), tv("0"), tv("n0")))
	changes := notedItems(1, 2000, 1, nil)
	changes = append(changes, del(itemsName, tv("5"), tv("1"), tv("n5")))
	changes = append(changes, notedItems(2001, 4000, 1, map[int]string{3000: "n5"})...)
	end := s.tx(changes...)

	require.NoError(t, consume(t, c, s.done()))
	assert.Equal(t, end, appliedPosition(t, c))
	assert.Equal(t, [][]*string{{ptr("3999"), ptr("3000")}},
		rawRows(t, target, "SELECT count(*)::text, (SELECT id::text FROM items WHERE note = 'n5') FROM items"))
}

// TestConsumeCanonicalCopyStreamsEndAndResume interleaves, in one unit,
// batches of inserts into items (copied, a COPY left open across them),
// runs of inserts into the keyless events (copied from the stream) and
// updates of last: every row arrives, in its order, and last holds the
// last transaction's value.
func TestConsumeCanonicalCopyStreamsEndAndResume(t *testing.T) {
	t.Parallel()
	_, target, c := applyTarget(t, ledgerDDL...)
	execSQL(t, target, "INSERT INTO last VALUES (true, 0)")
	schema := inspect(t, c)
	s := newStream(t, canonical.KindIncremental, 0xe000000, "streamed",
		tableOf(t, schema, itemsName), tableOf(t, schema, eventsName), tableOf(t, schema, lastName))
	id := 0
	for tx := 1; tx <= 8; tx++ {
		changes := notedItems(id+1, id+1500, tx, nil)
		id += 1500
		if tx%3 == 0 {
			changes = append(changes, eventInserts(tx, 100)...)
		}
		if tx%2 == 0 {
			changes = append(changes, upd(lastName, nil, tv("t"), tv(fmt.Sprint(tx))))
		}
		s.tx(changes...)
	}
	end := s.tx(notedItems(id+1, id+10, 9, nil)...)

	require.NoError(t, consume(t, c, s.done()))
	assert.Equal(t, end, appliedPosition(t, c))
	assert.Equal(t, [][]*string{{ptr("12010"), ptr("12010"), ptr("9")}},
		rawRows(t, target, "SELECT count(*)::text, max(id)::text, max(tx)::text FROM items"))
	assert.Equal(t, [][]*string{{ptr("3"), ptr("100")}, {ptr("6"), ptr("100")}},
		rawRows(t, target, "SELECT tx::text, count(*)::text FROM events GROUP BY tx ORDER BY tx"))
	assert.Equal(t, [][]*string{{ptr("8")}}, rawRows(t, target, "SELECT tx::text FROM last"))
}

// TestConsumeCanonicalCancelledWhileTheStreamStallsInACopy cancels an apply
// whose stream stalls inside a transaction whose first 4000 inserts went
// into a COPY left open, and lets the stream go on only after longer than
// work in the background outlives a cancel (5 s): the COPY fails as soon
// as ctx is done rather than wait for rows, so the session stays usable,
// and the complete transaction before is applied again and kept.
func TestConsumeCanonicalCancelledWhileTheStreamStallsInACopy(t *testing.T) {
	t.Parallel()
	_, target, c, s := itemsAndLastStream(t, 0xf000000, "stalled")
	first := s.tx(upd(lastName, nil, tv("t"), tv("1")))
	s.tx(notedItems(1, 4100, 2, nil)...)
	stream := s.done()
	at := bytes.Index(stream, []byte(`"n4100"`))
	require.Positive(t, at)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stalled, resume := make(chan struct{}), make(chan struct{})
	body := &pausingReader{r: bytes.NewReader(stream), at: at, pause: func() { close(stalled); <-resume }}
	done := make(chan error, 1)
	go func() { done <- c.ConsumeCanonical(ctx, body) }()
	<-stalled
	waitFor(t, "the COPY waits for rows", func() bool {
		var waits bool
		require.NoError(t, target.QueryRow(context.Background(), `SELECT EXISTS (SELECT FROM pg_stat_activity
			WHERE datname = current_database() AND state = 'active' AND wait_event = 'ClientRead' AND query LIKE '%COPY %')`).Scan(&waits))
		return waits
	})
	cancel()
	time.Sleep(6 * time.Second)
	close(resume)

	require.ErrorIs(t, <-done, context.Canceled)
	assert.Equal(t, first, appliedPosition(t, c))
	assert.Equal(t, [][]*string{{ptr("0")}}, rawRows(t, target, "SELECT count(*)::text FROM items"))
	assert.Equal(t, [][]*string{{ptr("1")}}, rawRows(t, target, "SELECT tx::text FROM last"))
}

// TestConsumeCanonicalUnitOpenedByACopyIsAtomic fails a source transaction,
// or a snapshot, whose first statement on the target is a COPY (which
// carries the unit's BEGIN in its query) and whose last is refused by a
// CHECK constraint the target has: the rows copied first must be rolled
// back with it, for a table with a key (a COPY in the background, once a
// unit before has copied the keys below), a keyless one (a COPY from the
// stream) and a snapshot.
func TestConsumeCanonicalUnitOpenedByACopyIsAtomic(t *testing.T) {
	t.Parallel()
	refused := upd(lastName, nil, tv("t"), tv("999"))
	for _, tc := range []struct {
		name string
		// stream writes the stream; the apply sees its end only from
		// pauseAt on, if set, so that the unit before ends there.
		stream  func(s *streamBuilder) (stream []byte, pauseAt string, kept canonical.Position)
		items   string // the rows kept
		snapped bool
	}{
		{name: "keyed", items: "500", stream: func(s *streamBuilder) ([]byte, string, canonical.Position) {
			kept := s.tx(notedItems(1, 500, 1, nil)...)
			s.tx(append(notedItems(501, 1000, 2, nil), refused)...)
			return s.done(), `"n501"`, kept
		}},
		{name: "keyless", items: "0", stream: func(s *streamBuilder) ([]byte, string, canonical.Position) {
			s.tx(append(eventInserts(1, 500), refused)...)
			return s.done(), "", 0
		}},
		{name: "snapshot", items: "0", snapped: true, stream: func(s *streamBuilder) ([]byte, string, canonical.Position) {
			for _, ch := range notedItems(1, 500, 1, nil) {
				s.row(itemsName, ch.New...)
			}
			for _, ch := range eventInserts(1, 500) {
				s.row(eventsName, ch.New...)
			}
			s.row(lastName, tv("t"), tv("999"))
			return s.bytes(s.pos), "", 0
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, target, c := applyTarget(t, ledgerDDL...)
			execSQL(t, target, "ALTER TABLE last ADD CONSTRAINT no_999 CHECK (tx <> 999)")
			kind := canonical.KindSnapshot
			if !tc.snapped {
				kind = canonical.KindIncremental
				execSQL(t, target, "INSERT INTO last VALUES (true, 0)")
			}
			schema := inspect(t, c)
			s := newStream(t, kind, 0x1000000, "atomic",
				tableOf(t, schema, itemsName), tableOf(t, schema, eventsName), tableOf(t, schema, lastName))
			stream, pauseAt, kept := tc.stream(s)
			body := io.Reader(bytes.NewReader(stream))
			split := make(chan bool, 1)
			if pauseAt != "" { // at the line of the begin before it
				at := bytes.Index(stream, []byte(pauseAt))
				at = bytes.LastIndexByte(stream[:at], '\n')
				at = bytes.LastIndexByte(stream[:at], '\n') + 1
				body = &pausingReader{r: body, at: at, pause: func() {
					split <- waitUntil(func() bool {
						got, err := c.AppliedPosition(context.Background())
						return err == nil && got == kept
					})
				}}
			} else {
				split <- true
			}

			var pgErr *pgconn.PgError
			require.ErrorAs(t, c.ConsumeCanonical(context.Background(), body), &pgErr)
			select {
			case ok := <-split:
				require.True(t, ok, "the unit before did not commit where the stream paused: the case tests nothing")
			case <-time.After(15 * time.Second):
				t.Fatal("the apply ended without reading where the stream pauses")
			}
			assert.Equal(t, "no_999", pgErr.ConstraintName)
			assert.Equal(t, kept, appliedPosition(t, c))
			assert.Equal(t, [][]*string{{ptr(tc.items), ptr("0")}},
				rawRows(t, target, "SELECT (SELECT count(*) FROM items)::text, (SELECT count(*) FROM events)::text"))
		})
	}
}
