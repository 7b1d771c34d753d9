package siphon_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/siphondb/siphon/canonical"
)

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
			for e := 0; e < 100; e++ {
				changes = append(changes, ins(eventsName, tv(fmt.Sprint(tx)), tv(fmt.Sprintf(`{"e":%d}`, e)), null))
			}
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
