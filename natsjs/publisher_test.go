package natsjs_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/siphondb/siphon/canonical"
	"github.com/siphondb/siphon/natsjs"
)

// workDDL are the tables of the publishing tests: an odd schema and table
// name (quotes, a dot, a space, wildcard characters, Unicode) among plain
// ones.
var workDDL = []string{
	`CREATE TABLE items (id int PRIMARY KEY, note text)`,
	`CREATE SCHEMA "Odd ""S"""`,
	`CREATE TABLE "Odd ""S"""."ta.ble *> ü" (id int PRIMARY KEY, v text)`,
	`CREATE TABLE other (id int PRIMARY KEY)`,
}

// oddTable is the odd table's name.
var oddTable = canonical.TableName{Schema: `Odd "S"`, Name: "ta.ble *> ü"}

// workTransactions are one of each kind of change, in their own
// transactions; the last inserts into items.
var workTransactions = []string{
	`INSERT INTO items VALUES (1, 'a'), (2, 'b'), (3, NULL)`,
	`BEGIN; UPDATE items SET note = 'x' WHERE id = 1; DELETE FROM items WHERE id = 2;
	 INSERT INTO "Odd ""S"""."ta.ble *> ü" VALUES (1, 'ü'); COMMIT`,
	`TRUNCATE items, "Odd ""S"""."ta.ble *> ü"`,
	`BEGIN; SELECT pg_logical_emit_message(true, 'app', 'hello'); INSERT INTO other VALUES (1); COMMIT`,
	`SELECT pg_logical_emit_message(false, 'app', 'no transaction: not published')`,
	`INSERT INTO other VALUES (2)`,
	`INSERT INTO items VALUES (10, 'end')`,
}

// expectedMsg is a message a Publisher must write for a slot's change.
type expectedMsg struct {
	subject    string
	change     canonical.Change // as the body holds it
	xid        uint32
	commit     canonical.Position
	commitTime time.Time
	index      int
	end        canonical.Position // a marker's
	count      int
}

// expectMessages turns a slot's change stream into the messages a
// Publisher writes for it: a message per row change, per truncated table
// and per transactional message, a marker after a transaction that has any.
func expectMessages(prefix string, changes []canonical.Change) []expectedMsg {
	var out []expectedMsg
	var begin canonical.Change
	var tx []expectedMsg
	add := func(subject string, ch canonical.Change) {
		if ch.Op != canonical.OpCommit {
			ch.CommitTime = time.Time{} // only begin and commit records carry it
		}
		tx = append(tx, expectedMsg{subject: subject, change: ch, xid: begin.XID, commit: begin.Position,
			commitTime: begin.CommitTime, index: len(tx)})
	}
	for _, ch := range changes {
		switch ch.Op {
		case canonical.OpBegin:
			begin, tx = ch, nil
		case canonical.OpInsert, canonical.OpUpdate, canonical.OpDelete:
			add(natsjs.TableSubject(prefix, ch.TableName()), ch)
		case canonical.OpTruncate:
			for _, t := range ch.Truncated {
				one := ch
				one.Truncated = []canonical.TableName{t}
				add(natsjs.TableSubject(prefix, t), one)
			}
		case canonical.OpMessage:
			if ch.Message.Transactional {
				add(natsjs.MessageSubject(prefix), ch)
			}
		case canonical.OpCommit:
			if len(tx) == 0 {
				continue
			}
			n := len(tx)
			add(natsjs.CommitSubject(prefix), ch)
			tx[n].end, tx[n].count = ch.Position, n
			out = append(out, tx...)
		}
	}
	return out
}

// checkMessages checks that the stream holds exactly the expected
// messages, in order, with their headers.
func checkMessages(t *testing.T, got []*jetstream.RawStreamMsg, want []expectedMsg, systemID, slot string) {
	t.Helper()
	require.Len(t, got, len(want))
	ids := map[string]bool{}
	for i, m := range got {
		w := want[i]
		require.Equal(t, w.subject, m.Subject, "message %d", m.Sequence)
		ch, err := canonical.ParseChange(m.Data)
		require.NoError(t, err, "message %d: %s", m.Sequence, m.Data)
		assert.Equal(t, w.change, ch, "message %d", m.Sequence)
		h := m.Header
		id := natsjs.MsgID(systemID, slot, w.commit, w.index)
		assert.Equal(t, id, h.Get(nats.MsgIdHdr), "message %d", m.Sequence)
		assert.False(t, ids[id], "message id %s twice", id)
		ids[id] = true
		assert.Equal(t, systemID, h.Get(natsjs.HeaderSystemID))
		assert.Equal(t, slot, h.Get(natsjs.HeaderSlot))
		assert.Equal(t, strconv.FormatUint(uint64(w.xid), 10), h.Get(natsjs.HeaderXID))
		assert.Equal(t, w.commit.String(), h.Get(natsjs.HeaderCommit))
		assert.Equal(t, w.commitTime.UTC().Format(time.RFC3339Nano), h.Get(natsjs.HeaderCommitTime))
		assert.Equal(t, strconv.Itoa(w.index), h.Get(natsjs.HeaderIndex))
		if w.end != 0 {
			assert.Equal(t, w.end.String(), h.Get(natsjs.HeaderEnd))
			assert.Equal(t, strconv.Itoa(w.count), h.Get(natsjs.HeaderCount))
		}
	}
}

// TestPublishEveryKindOfChange publishes one transaction of each kind and
// checks the stream against the same slot's changes read directly: one
// message per change on its table's subject (the odd name escaped), one per
// truncated table, a marker per transaction, none for a non-transactional
// message or a transaction with nothing to publish, every header right.
func TestPublishEveryKindOfChange(t *testing.T) {
	t.Parallel()
	slot, direct := testSlot(t), testSlot(t)
	dsn, admin, _ := newSource(t, workDDL, slot, direct)
	execSQL(t, admin, workTransactions...)

	srv := startNATS(t)
	nc, js := connectNATS(t, srv.ClientURL())
	s := createStream(t, js, "WORK", "t", 1)
	pub, err := natsjs.NewPublisher(nc, natsjs.Config{Stream: "WORK", Prefix: "t", Slot: slot})
	require.NoError(t, err)

	changes := slotChanges(t, dsn, direct, insertOf("items", "10"))
	end := changes[len(changes)-1].Position
	run := runPublisher(t, pub, dsn)
	awaitHeld(t, s, "t", end)
	held, err := run.stop()
	require.NoError(t, err)
	assert.Equal(t, end, held, "Run returns the end of the last transaction the stream holds")

	want := expectMessages("t", changes)
	got := storedMessages(t, s)
	checkMessages(t, got, want, sourceSystemID(t, admin), slot)
	subjects := map[string]bool{}
	for _, m := range got {
		subjects[m.Subject] = true
	}
	assert.Equal(t, map[string]bool{
		"t.public.items": true, "t.public.other": true, "t.message": true, "t.commit": true,
		"t.Odd%20%22S%22.ta%2Eble%20%2A%3E%20%C3%BC": true,
	}, subjects)
	table, err := natsjs.ParseTableSubject("t", "t.Odd%20%22S%22.ta%2Eble%20%2A%3E%20%C3%BC")
	require.NoError(t, err)
	assert.Equal(t, oddTable, table)
}

// sourceSystemID returns the system identifier of admin's server.
func sourceSystemID(t testing.TB, admin *pgx.Conn) string {
	t.Helper()
	var id string
	require.NoError(t, admin.QueryRow(context.Background(), "SELECT system_identifier::text FROM pg_control_system()").Scan(&id))
	return id
}

// insertOf reports whether ch inserts the row of table whose first column
// is id.
func insertOf(table string, id string) func(canonical.Change) bool {
	return func(ch canonical.Change) bool {
		return ch.Op == canonical.OpInsert && ch.Table == table && ch.New[0].String() == id
	}
}
