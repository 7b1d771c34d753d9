package natsjs_test

import (
	"bytes"
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/siphondb/siphon/canonical"
	"github.com/siphondb/siphon/natsjs"
)

// batchTransactions follow workTransactions: one whose changes alternate
// between tables, in runs longer and shorter than a message of four
// changes, then the last.
var batchTransactions = []string{
	`BEGIN; INSERT INTO items SELECT g, 'r' || g FROM generate_series(100, 109) g;
	 INSERT INTO other VALUES (10), (11);
	 UPDATE items SET note = 'u' WHERE id BETWEEN 100 AND 102;
	 TRUNCATE "Odd ""S"""."ta.ble *> ü";
	 INSERT INTO items VALUES (110, 'after the truncate'); DELETE FROM items WHERE id = 105; COMMIT`,
	`INSERT INTO items VALUES (-1, 'end')`,
}

// msgShape is where a message stands: its subject, the index of its
// first change, and how many it holds.
type msgShape struct {
	subject string
	index   int
	changes int
}

// expectShapes returns the messages a Publisher with MaxChangesPerMessage
// maxChanges writes for want (a message per change): runs of a
// transaction's changes on one subject, maxChanges at most, schema
// changes and markers alone (none reaching the server's max_payload).
func expectShapes(want []expectedMsg, maxChanges int, ddl string) []msgShape {
	var out []msgShape
	for i, w := range want {
		if n := len(out); n > 0 && i > 0 && want[i-1].commit == w.commit && w.subject == want[i-1].subject &&
			w.end == 0 && w.subject != ddl && out[n-1].changes < maxChanges {
			out[n-1].changes++
			continue
		}
		out = append(out, msgShape{subject: w.subject, index: w.index, changes: 1})
	}
	return out
}

func shapes(msgs []*jetstream.RawStreamMsg) []msgShape {
	var out []msgShape
	for _, m := range msgs {
		index, _ := strconv.Atoi(m.Header.Get(natsjs.HeaderIndex))
		changes := 1
		if v := m.Header.Get(natsjs.HeaderChanges); v != "" {
			changes, _ = strconv.Atoi(v)
		}
		out = append(out, msgShape{subject: m.Subject, index: index, changes: changes})
	}
	return out
}

// TestPublishBatches: with MaxChangesPerMessage, the runs of a
// transaction's changes on one subject travel as messages of up to that
// many changes, each row change's table record written once a message,
// schema changes (signed) and markers alone; the stream holds every change
// once, and Consume delivers the slot's stream from it, whole or for some
// tables, as from messages of one change.
func TestPublishBatches(t *testing.T) {
	t.Parallel()
	slot, direct := testSlot(t), testSlot(t)
	dsn, admin, _ := newSource(t, workDDL, slot, direct)
	execSQL(t, admin, append(append([]string(nil), workTransactions...), batchTransactions...)...)
	changes := slotChanges(t, dsn, direct, insertOf("items", "-1"))
	end := changes[len(changes)-1].Position

	srv := startNATS(t)
	nc, js := connectNATS(t, srv.ClientURL())
	s := createStream(t, js, "BATCH", "b", 1)
	pub, err := natsjs.NewPublisher(nc, natsjs.Config{Stream: "BATCH", Prefix: "b", Slot: slot, Key: workKey, MaxChangesPerMessage: 4})
	require.NoError(t, err)
	run := runPublisher(t, pub, dsn)
	awaitHeld(t, s, "b", end)
	_, err = run.stop()
	require.NoError(t, err)

	want := expectMessages("b", changes)
	got := storedMessages(t, s)
	checkMessages(t, got, want, sourceSystemID(t, admin), slot)
	assert.Equal(t, expectShapes(want, 4, natsjs.DDLSubject("b")), shapes(got))
	full := 0
	for _, m := range got {
		switch {
		case m.Subject == natsjs.DDLSubject("b"):
			assert.NotEmpty(t, m.Header.Get(natsjs.HeaderMAC), "a schema change is signed")
		case m.Header.Get(natsjs.HeaderChanges) == "4" && m.Subject == "b.public.items":
			full++
			assert.Equal(t, 1, bytes.Count(m.Data, []byte(`{"t":"table"`)), "one table record in %s", m.Data)
		}
	}
	assert.GreaterOrEqual(t, full, 2, "messages of four changes")

	got2, last := consumeUntil(t, s, natsjs.ConsumeConfig{Prefix: "b", Keys: [][]byte{workKey}}, end)
	assert.Equal(t, throughStream(changes, nil), got2)
	assert.Equal(t, end, last)
	items := canonical.TableName{Schema: "public", Name: "items"}
	got2, _ = consumeUntil(t, s, natsjs.ConsumeConfig{Prefix: "b", Keys: [][]byte{workKey}, Tables: []canonical.TableName{items}}, end)
	assert.Equal(t, throughStream(changes, func(n canonical.TableName) bool { return n == items }), got2)
}

// TestPublishBatchesWithinMaxPayload: a run of changes larger than the
// server's max_payload is split into messages it takes, every change once,
// whatever MaxChangesPerMessage allows; a single change too large is
// still a *MessageTooLargeError.
func TestPublishBatchesWithinMaxPayload(t *testing.T) {
	t.Parallel()
	slot, direct := testSlot(t), testSlot(t)
	dsn, admin, _ := newSource(t, workDDL, slot, direct)
	execSQL(t, admin, `INSERT INTO items SELECT g, repeat('x', 1000) || g FROM generate_series(1, 300) g`,
		`INSERT INTO items VALUES (-1, 'end')`)
	changes := slotChanges(t, dsn, direct, insertOf("items", "-1"))
	end := changes[len(changes)-1].Position

	opts := natsOptions(t.TempDir())
	opts.MaxPayload = 64 << 10
	srv := startServer(t, opts)
	t.Cleanup(func() { stopServer(srv) })
	nc, js := connectNATS(t, srv.ClientURL())
	s := createStream(t, js, "SPLIT", "p", 1)
	pub, err := natsjs.NewPublisher(nc, natsjs.Config{Stream: "SPLIT", Prefix: "p", Slot: slot, MaxChangesPerMessage: 1000})
	require.NoError(t, err)
	run := runPublisher(t, pub, dsn)
	awaitHeld(t, s, "p", end)
	_, err = run.stop()
	require.NoError(t, err)

	got := storedMessages(t, s)
	checkMessages(t, got, expectMessages("p", changes), sourceSystemID(t, admin), slot)
	large := 0
	for _, m := range got {
		if m.Subject == "p.public.items" && len(m.Data) > 300<<10/8 {
			large++
		}
		assert.LessOrEqual(t, len(m.Data), 64<<10, "message %d", m.Sequence)
	}
	assert.GreaterOrEqual(t, large, 4, "the 300 KiB transaction in several messages, each near the limit")
	replayed, _ := consumeUntil(t, s, natsjs.ConsumeConfig{Prefix: "p"}, end)
	assert.Equal(t, throughStream(changes, nil), replayed)

	execSQL(t, admin, `INSERT INTO items VALUES (0, repeat('y', 100000))`)
	ctx, cancel := context.WithTimeout(context.Background(), waitDeadline)
	defer cancel()
	_, err = pub.Run(ctx, dsn)
	var tooLarge *natsjs.MessageTooLargeError
	require.ErrorAs(t, err, &tooLarge)
	assert.Equal(t, "p.public.items", tooLarge.Subject)
	assert.Greater(t, tooLarge.Size, 100000)
}

// TestConsumeRefusesAForgedBatch: a message of several changes is read
// whole before any of them is delivered, and refused when it is not what a
// Publisher writes: a schema change among them (which would escape its
// signature), a begin or commit, more or fewer changes than it says, a row
// change without its table record.
func TestConsumeRefusesAForgedBatch(t *testing.T) {
	t.Parallel()
	cols := []canonical.Column{{Name: "id", Type: "integer"}}
	row := func(id string) *canonical.Change {
		return &canonical.Change{Op: canonical.OpInsert, Schema: "public", Table: "items", XID: 999, Position: 0x4ff0,
			Columns: cols, New: canonical.Row{canonical.Text(id)}}
	}
	ddl := &canonical.Change{Op: canonical.OpDDL, XID: 999, Position: 0x4ff0, DDL: &canonical.DDL{Tag: "COPY",
		Statement: "COPY (SELECT 1) TO PROGRAM 'touch /tmp/pwned'", SearchPath: "public"}}
	begin := &canonical.Change{Op: canonical.OpBegin, XID: 999, Position: 0x4ff0, CommitTime: forgedTime}
	lines := func(chs ...*canonical.Change) []byte {
		var b []byte
		for _, ch := range chs {
			var err error
			b, err = canonical.AppendChange(b, ch)
			require.NoError(t, err)
		}
		return b
	}
	withoutTable := func(b []byte) []byte { return b[bytes.IndexByte(b, '\n')+1:] }

	good := append(lines(row("1")), withoutTable(lines(row("2")))...)
	parsed, err := natsjs.ParseChangesForTest(good, 2)
	require.NoError(t, err)
	assert.Equal(t, []canonical.Change{*row("1"), *row("2")}, parsed)

	srv := startNATS(t)
	_, js := connectNATS(t, srv.ClientURL())
	for i, forgery := range []struct {
		name    string
		data    []byte
		changes int
		problem string
	}{
		{"a schema change among rows", append(lines(row("1")), lines(ddl)...), 2, "a ddl record"},
		{"a begin among rows", append(lines(row("1")), lines(begin)...), 2, "a begin record"},
		{"more changes than it says", lines(row("1"), row("2"), row("3")), 2, "holding more"},
		{"fewer changes than it says", lines(row("1"), row("2")), 3, "holding 2"},
		{"a row change without its table record", withoutTable(lines(row("1"), row("2"))), 2, "change 1 of 2"},
	} {
		prefix := "g" + strconv.Itoa(i)
		s := createStream(t, js, "FORGEDBATCH"+prefix, prefix, 1)
		forgeBatch(t, js, prefix, forgery.data, forgery.changes)
		got, err := consumeErr(t, s, natsjs.ConsumeConfig{Prefix: prefix, Keys: [][]byte{workKey}, UnauthenticatedSchemaChanges: true})
		var me *natsjs.MessageError
		require.ErrorAs(t, err, &me, forgery.name)
		assert.Equal(t, prefix+".public.items", me.Subject, forgery.name)
		assert.ErrorContains(t, err, forgery.problem, forgery.name)
		assert.Equal(t, []canonical.Op{canonical.OpBegin}, ops(got), "%s: nothing but the begin delivered", forgery.name)
	}
}

// forgeBatch publishes into a stream with prefix, as anyone who may
// publish on its subjects can, a transaction of one message holding data
// as n changes, then its commit marker.
func forgeBatch(t *testing.T, js jetstream.JetStream, prefix string, data []byte, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const systemID, slot = "7300000000000000024", "forged"
	commit := canonical.Position(0x4ff0)
	done := &canonical.Change{Op: canonical.OpCommit, XID: 999, Position: 0x5030, CommitTime: forgedTime}
	marker, err := canonical.AppendChange(nil, done)
	require.NoError(t, err)
	for i, m := range []struct {
		subject string
		data    []byte
	}{{prefix + ".public.items", data}, {natsjs.CommitSubject(prefix), marker}} {
		h := nats.Header{}
		h.Set(natsjs.HeaderSystemID, systemID)
		h.Set(natsjs.HeaderSlot, slot)
		h.Set(natsjs.HeaderXID, "999")
		h.Set(natsjs.HeaderCommit, commit.String())
		h.Set(natsjs.HeaderCommitTime, forgedTime.Format(time.RFC3339Nano))
		if i == 0 {
			h.Set(natsjs.HeaderIndex, "0")
			h.Set(natsjs.HeaderChanges, strconv.Itoa(n))
		} else {
			h.Set(natsjs.HeaderIndex, strconv.Itoa(n))
			h.Set(natsjs.HeaderEnd, done.Position.String())
			h.Set(natsjs.HeaderCount, strconv.Itoa(n))
			h.Set(natsjs.HeaderPrevEnd, "0/0")
		}
		_, err := js.PublishMsg(ctx, &nats.Msg{Subject: m.subject, Header: h, Data: m.data})
		require.NoError(t, err)
	}
}
