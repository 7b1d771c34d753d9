package natsjs_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats-server/v2/server"
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
	`BEGIN; ALTER TABLE other ADD COLUMN note text; INSERT INTO other VALUES (3, 'after the schema change'); COMMIT`,
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
// Publisher writes for it: a message per row change, per truncated table,
// per transactional message and per schema change, a marker after each
// transaction.
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
		case canonical.OpDDL:
			add(natsjs.DDLSubject(prefix), ch)
		case canonical.OpCommit:
			n := len(tx)
			add(natsjs.CommitSubject(prefix), ch)
			tx[n].end, tx[n].count = ch.Position, n
			out = append(out, tx...)
		}
	}
	return out
}

// checkMessages checks that the stream holds exactly the expected
// messages' changes, in order, with their headers: a message per change,
// or a message holding several of one transaction on one subject (with
// the headers of the first).
func checkMessages(t *testing.T, got []*jetstream.RawStreamMsg, want []expectedMsg, systemID, slot string) {
	t.Helper()
	defer func() {
		if t.Failed() { // what the stream holds, to tell a lost message from a repeated one
			var held strings.Builder
			for _, m := range got {
				fmt.Fprintf(&held, "\n%d %s commit %s index %s id %s", m.Sequence, m.Subject,
					m.Header.Get(natsjs.HeaderCommit), m.Header.Get(natsjs.HeaderIndex), m.Header.Get(nats.MsgIdHdr))
			}
			t.Logf("the stream holds:%s", held.String())
		}
	}()
	ids := map[string]bool{}
	k := 0
	for _, m := range got {
		changes := messageChanges(t, m)
		require.LessOrEqual(t, k+len(changes), len(want), "message %d: more changes than the slot's", m.Sequence)
		w := want[k]
		for i, ch := range changes {
			require.Equal(t, want[k+i].subject, m.Subject, "message %d, change %d", m.Sequence, i)
			require.Equal(t, w.commit, want[k+i].commit, "message %d holds changes of one transaction", m.Sequence)
			assert.Equal(t, want[k+i].change, ch, "message %d, change %d", m.Sequence, i)
		}
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
		k += len(changes)
	}
	require.Equal(t, len(want), k, "the stream holds every change")
}

// messageChanges returns the changes m holds: one, or as many as its
// HeaderChanges says.
func messageChanges(t *testing.T, m *jetstream.RawStreamMsg) []canonical.Change {
	t.Helper()
	if v := m.Header.Get(natsjs.HeaderChanges); v != "" {
		n, err := strconv.Atoi(v)
		require.NoError(t, err, "message %d", m.Sequence)
		require.Greater(t, n, 1, "message %d: %s is set only on a message of several changes", m.Sequence, natsjs.HeaderChanges)
		changes, err := natsjs.ParseChangesForTest(m.Data, n)
		require.NoError(t, err, "message %d: %s", m.Sequence, m.Data)
		return changes
	}
	ch, err := canonical.ParseChange(m.Data)
	require.NoError(t, err, "message %d: %s", m.Sequence, m.Data)
	return []canonical.Change{ch}
}

// TestPublishEveryKindOfChange publishes one transaction of each kind and
// checks the stream against the same slot's changes read directly: one
// message per change on its table's subject (the odd name escaped), one per
// truncated table, a marker per transaction, none for a non-transactional
// message, every header right.
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
		"t.public.items": true, "t.public.other": true, "t.message": true, "t.ddl": true, "t.commit": true,
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

// TestPublisherResumesInsideATransaction stops a Publisher half way
// through a large transaction and lets the duplicate window pass: the next
// one completes the transaction from what the stream holds, so the stream
// ends with every change once, without relying on deduplication. So it
// does with messages of several changes, even when the next Publisher
// gathers them by another number (it resumes after the last change the
// stream holds, not after a count of messages).
func TestPublisherResumesInsideATransaction(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name          string
		first, second int // MaxChangesPerMessage
	}{
		{"a message per change", 1, 1},
		{"messages of 7 changes, then of 50", 7, 50},
		{"messages of 50 changes, then one per change", 50, 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			resumeInsideATransaction(t, tt.first, tt.second)
		})
	}
}

func resumeInsideATransaction(t *testing.T, firstBatch, secondBatch int) {
	slot, direct := testSlot(t), testSlot(t)
	dsn, admin, _ := newSource(t, workDDL, slot, direct)
	const rows = 20000
	execSQL(t, admin, `INSERT INTO items VALUES (-1, 'before')`,
		`INSERT INTO items SELECT g, 'large' FROM generate_series(1, 20000) g`,
		`INSERT INTO other VALUES (1)`, `INSERT INTO items VALUES (-2, 'end')`)
	changes := slotChanges(t, dsn, direct, insertOf("items", "-2"))
	end := changes[len(changes)-1].Position

	srv := startNATS(t)
	nc, js := connectNATS(t, srv.ClientURL())
	const window = 200 * time.Millisecond
	cfg := natsjs.StreamConfig("RESUME", "r")
	cfg.Duplicates = window
	// The stream takes the first transaction (two messages) and a third
	// of the large one, and refuses the rest until its limit is lifted.
	cfg.MaxMsgs, cfg.Discard = int64(2+rows/firstBatch/3), jetstream.DiscardNew
	s, err := js.CreateStream(context.Background(), cfg)
	require.NoError(t, err)
	pubCfg := natsjs.Config{Stream: "RESUME", Prefix: "r", Slot: slot, MaxPending: 16, MaxChangesPerMessage: firstBatch}
	first, err := natsjs.NewPublisher(nc, pubCfg)
	require.NoError(t, err)
	run := runPublisher(t, first, dsn)
	waitFor(t, "the stream holds part of the large transaction", func() bool {
		info, err := s.Info(context.Background())
		return err == nil && info.State.Msgs == uint64(cfg.MaxMsgs)
	})
	held, err := run.stop()
	require.NoError(t, err)
	cfg.MaxMsgs = -1
	_, err = js.UpdateStream(context.Background(), cfg)
	require.NoError(t, err)
	stored := storedMessages(t, s)
	require.Len(t, stored, int(2+rows/firstBatch/3), "stopped inside the large transaction")
	last := stored[len(stored)-1]
	assert.Equal(t, "r.public.items", last.Subject, "the stream ends inside a transaction")
	assert.Equal(t, heldEnd(t, s, "r"), held, "Run returns the end of the last whole transaction")
	// Once the window has passed, JetStream would store a message sent
	// again as a new one.
	awaitForgotten(t, js, last)

	pubCfg.MaxChangesPerMessage = secondBatch
	second, err := natsjs.NewPublisher(nc, pubCfg)
	require.NoError(t, err)
	run = runPublisher(t, second, dsn)
	awaitHeld(t, s, "r", end)
	held, err = run.stop()
	require.NoError(t, err)
	assert.Equal(t, end, held)
	checkMessages(t, storedMessages(t, s), expectMessages("r", changes), sourceSystemID(t, admin), slot)
}

// awaitForgotten waits until the stream's duplicate window no longer holds
// m's Nats-Msg-Id (nor, the window being a time, any id stored before it).
// It asks the server itself: m sent again expecting another last message
// id is acknowledged as a duplicate while the id is held, and refused for
// the wrong last id once it is not (JetStream checks duplicates first), so
// the probe is never stored.
func awaitForgotten(t *testing.T, js jetstream.JetStream, m *jetstream.RawStreamMsg) {
	t.Helper()
	id := m.Header.Get(nats.MsgIdHdr)
	require.NotEmpty(t, id)
	duplicates := 0
	waitFor(t, "the duplicate window forgets "+id, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		ack, err := js.PublishMsg(ctx, &nats.Msg{Subject: m.Subject},
			jetstream.WithMsgID(id), jetstream.WithExpectLastMsgID("not-"+id))
		if err == nil {
			require.True(t, ack.Duplicate, "the probe was stored: %+v", ack)
			duplicates++
			return false
		}
		var apiErr *jetstream.APIError
		require.ErrorAs(t, err, &apiErr, "the probe")
		require.EqualValues(t, server.JSStreamWrongLastMsgIDErrF, apiErr.ErrorCode, "the probe: %v", err)
		return true
	})
	t.Logf("the duplicate window forgot %s after %d probes seen as duplicates", id, duplicates)
}

// TestPublisherSurvivesNATSRestart stops the NATS server while a Publisher
// runs and a workload commits, and starts it again once the Publisher has
// met the failure (a message not acknowledged): the Publisher waits,
// starts over, and the stream ends with every transaction once, in order.
func TestPublisherSurvivesNATSRestart(t *testing.T) {
	t.Parallel()
	slot, direct := testSlot(t), testSlot(t)
	dsn, admin, _ := newSource(t, workDDL, slot, direct)
	opts := natsOptions(t.TempDir())
	srv := startServer(t, opts)
	opts.Port = srv.Addr().(*net.TCPAddr).Port // the same address after the restart
	t.Cleanup(func() { stopServer(srv) })
	nc, js := connectNATS(t, srv.ClientURL())
	s := createStream(t, js, "RESTART", "n", 1)
	warned := newWarnings()
	pub, err := natsjs.NewPublisher(nc, natsjs.Config{Stream: "RESTART", Prefix: "n", Slot: slot,
		AckWait: time.Second, Logger: slog.New(warned)})
	require.NoError(t, err)
	run := runPublisher(t, pub, dsn)

	insert := func(from, to int) {
		for i := from; i < to; i++ {
			execSQL(t, admin, "INSERT INTO items VALUES ("+strconv.Itoa(i)+", 'n')")
		}
	}
	insert(0, 50)
	waitFor(t, "some transactions published", func() bool { return heldEnd(t, s, "n") > 0 })
	stopServer(srv)
	insert(50, 100) // while NATS is down
	waitFor(t, "the Publisher meets the failure", func() bool { return warned.n.Load() > 0 })
	srv = startServer(t, opts)
	insert(100, 150)
	changes := slotChanges(t, dsn, direct, insertOf("items", "149"))
	end := changes[len(changes)-1].Position
	awaitHeld(t, s, "n", end)
	_, err = run.stop()
	require.NoError(t, err)
	checkMessages(t, storedMessages(t, s), expectMessages("n", changes), sourceSystemID(t, admin), slot)
}

// TestPublisherRefusesAStreamNotItsOwn: a missing stream, one capturing
// other subjects, and one holding another slot's messages are each a
// *StreamMismatchError, which Run returns rather than retry.
func TestPublisherRefusesAStreamNotItsOwn(t *testing.T) {
	t.Parallel()
	slot, other := testSlot(t), testSlot(t)
	dsn, admin, _ := newSource(t, workDDL, slot, other)
	execSQL(t, admin, `INSERT INTO items VALUES (1, 'a')`)
	srv := startNATS(t)
	nc, js := connectNATS(t, srv.ClientURL())
	ctx := context.Background()
	_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "WIDE", Subjects: []string{"wide.>", "more.>"}})
	require.NoError(t, err)
	s := createStream(t, js, "TAKEN", "taken", 1)
	pub, err := natsjs.NewPublisher(nc, natsjs.Config{Stream: "TAKEN", Prefix: "taken", Slot: other})
	require.NoError(t, err)
	run := runPublisher(t, pub, dsn)
	awaitHeld(t, s, "taken", 1)
	_, err = run.stop()
	require.NoError(t, err)

	for _, tt := range []struct{ stream, prefix, problem string }{
		{"MISSING", "missing", "does not exist"},
		{"WIDE", "wide", `captures ["wide.>" "more.>"], not exactly ["wide.>"]`},
		{"TAKEN", "taken", "give each slot a stream of its own"},
	} {
		pub, err := natsjs.NewPublisher(nc, natsjs.Config{Stream: tt.stream, Prefix: tt.prefix, Slot: slot})
		require.NoError(t, err)
		ctx, cancel := context.WithTimeout(ctx, waitDeadline)
		_, err = pub.Run(ctx, dsn)
		cancel()
		var mismatch *natsjs.StreamMismatchError
		require.ErrorAs(t, err, &mismatch, tt.stream)
		assert.Equal(t, tt.stream, mismatch.Stream)
		assert.Contains(t, err.Error(), tt.problem)
	}
}

// TestNewPublisherChecksConfig: a config that cannot work is refused at
// once, saying what to fix.
func TestNewPublisherChecksConfig(t *testing.T) {
	t.Parallel()
	srv := startNATS(t)
	nc, _ := connectNATS(t, srv.ClientURL())
	_, err := natsjs.NewPublisher(nil, natsjs.Config{Stream: "S", Slot: "s"})
	assert.ErrorContains(t, err, "NATS connection is nil")
	for _, tt := range []struct {
		cfg     natsjs.Config
		problem string
	}{
		{natsjs.Config{Slot: "s"}, "Config.Stream is empty"},
		{natsjs.Config{Stream: "S"}, "Config.Slot is empty"},
		{natsjs.Config{Stream: "S", Slot: "s", Prefix: "a..b"}, `"a..b" is not a subject prefix`},
		{natsjs.Config{Stream: "S", Slot: "s", Prefix: "a.*"}, `"a.*" is not a subject prefix`},
		{natsjs.Config{Stream: "S", Slot: "s", MaxPending: -1}, "negative"},
		{natsjs.Config{Stream: "S", Slot: "s", MaxChangesPerMessage: -1}, "negative"},
	} {
		_, err := natsjs.NewPublisher(nc, tt.cfg)
		assert.ErrorContains(t, err, tt.problem)
	}
}

// TestPublisherRefusesAChangeTooLarge: a change whose message is larger
// than the server takes is a *MessageTooLargeError, which Run returns
// rather than retry.
func TestPublisherRefusesAChangeTooLarge(t *testing.T) {
	t.Parallel()
	slot := testSlot(t)
	dsn, admin, _ := newSource(t, workDDL, slot)
	execSQL(t, admin, `INSERT INTO items VALUES (1, repeat('x', 100000))`)
	opts := natsOptions(t.TempDir())
	opts.MaxPayload = 64 << 10
	srv := startServer(t, opts)
	t.Cleanup(func() { stopServer(srv) })
	nc, js := connectNATS(t, srv.ClientURL())
	createStream(t, js, "LARGE", "l", 1)
	pub, err := natsjs.NewPublisher(nc, natsjs.Config{Stream: "LARGE", Prefix: "l", Slot: slot})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), waitDeadline)
	defer cancel()
	_, err = pub.Run(ctx, dsn)
	var large *natsjs.MessageTooLargeError
	require.ErrorAs(t, err, &large)
	assert.Equal(t, "l.public.items", large.Subject)
	assert.Greater(t, large.Size, 100000)
	assert.Equal(t, int64(64<<10), large.Max)
}
