package canonical_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/siphondb/siphon/canonical"
)

var (
	orderColumns = []canonical.Column{
		{Name: "id", Type: "integer", TypeOID: 23},
		{Name: "customer", Type: "text", TypeOID: 25},
		{Name: "total", Type: "numeric(12,2)", TypeOID: 1700, Nullable: true},
	}
	t1 = time.Date(2026, 11, 30, 5, 0, 0, 123456000, time.UTC)
	t2 = t1.Add(time.Second)
)

// orderStream is three transactions and a message between two of them, as
// StreamChanges delivers them: row changes carry their begin's commit LSN
// and commit time.
func orderStream() []canonical.Change {
	row := func(vals ...string) canonical.Row {
		r := make(canonical.Row, len(vals))
		for i, v := range vals {
			r[i] = canonical.Text(v)
		}
		return r
	}
	change := func(op canonical.Op, xid uint32, pos canonical.Position, at time.Time, newRow, oldRow canonical.Row) canonical.Change {
		return canonical.Change{Op: op, XID: xid, Position: pos, CommitTime: at, Schema: "shop", Table: "orders", Columns: orderColumns, New: newRow, Old: oldRow}
	}
	return []canonical.Change{
		{Op: canonical.OpBegin, XID: 700, Position: 0x1000, CommitTime: t1},
		change(canonical.OpInsert, 700, 0x1000, t1, row("1", "alice", "10.50"), nil),
		change(canonical.OpInsert, 700, 0x1000, t1, canonical.Row{canonical.Text("2"), canonical.Text("bob"), canonical.Null()}, nil),
		{Op: canonical.OpCommit, XID: 700, Position: 0x1030, CommitTime: t1},
		{Op: canonical.OpMessage, Position: 0x1100, Message: &canonical.Message{Prefix: "app", Content: []byte("between")}},
		{Op: canonical.OpBegin, XID: 701, Position: 0x2000, CommitTime: t2},
		change(canonical.OpUpdate, 701, 0x2000, t2, canonical.Row{canonical.Text("1"), canonical.Text("alice"), canonical.Unchanged()}, row("1", "alice", "10.50")),
		change(canonical.OpDelete, 701, 0x2000, t2, nil, row("2", "bob", "")),
		{Op: canonical.OpCommit, XID: 701, Position: 0x2030, CommitTime: t2},
		{Op: canonical.OpBegin, XID: 702, Position: 0x3000, CommitTime: t2},
		{Op: canonical.OpTruncate, XID: 702, Position: 0x3000, CommitTime: t2, Truncated: []canonical.TableName{{Schema: "shop", Name: "orders"}}},
		{Op: canonical.OpCommit, XID: 702, Position: 0x3030, CommitTime: t2},
	}
}

// record records changes from the start Position and returns the recording.
func record(t *testing.T, from canonical.Position, changes []canonical.Change) []byte {
	t.Helper()
	var buf bytes.Buffer
	rec := canonical.NewRecorder(&buf, from)
	for _, ch := range changes {
		require.NoError(t, rec.Emit(ch))
	}
	require.NoError(t, rec.Close())
	return buf.Bytes()
}

// collect returns a handler that appends what it receives to *got.
func collect(got *[]canonical.Change) func(canonical.Change) error {
	return func(ch canonical.Change) error {
		*got = append(*got, ch)
		return nil
	}
}

func TestReplayDeliversWhatWasRecorded(t *testing.T) {
	t.Parallel()
	want := orderStream()
	data := record(t, 0xF00, want)

	dec := canonical.NewDecoder(bytes.NewReader(data))
	h, err := dec.Header()
	require.NoError(t, err)
	assert.Equal(t, canonical.KindChanges, h.Kind)
	assert.True(t, h.Checked, "a recording is checked")
	assert.Equal(t, canonical.Position(0xF00), h.Start)

	var got []canonical.Change
	end, err := canonical.Replay(context.Background(), bytes.NewReader(data), 0, collect(&got))
	require.NoError(t, err)
	assert.Equal(t, want, got, "every change, with its Position, XID, CommitTime and Columns")
	assert.Equal(t, canonical.Position(0x3030), end, "the end of the last transaction")
}

func TestReplayFromSkipsWhatWasHandled(t *testing.T) {
	t.Parallel()
	all := orderStream()
	data := record(t, 0xF00, all)
	cases := []struct {
		from canonical.Position
		want []canonical.Change
		end  canonical.Position
	}{
		{0, all, 0x3030},
		{0xF00, all, 0x3030},
		{0x1030, all[4:], 0x3030}, // the message, and the transactions after the first
		{0x1100, all[5:], 0x3030}, // the message is handled too
		{0x2030, all[9:], 0x3030},
		{0x3030, nil, 0x3030},
		{0x9000, nil, 0x9000}, // past the recording: nothing, and from stays
	}
	for _, tc := range cases {
		var got []canonical.Change
		end, err := canonical.Replay(context.Background(), bytes.NewReader(data), tc.from, collect(&got))
		require.NoError(t, err, "from %v", tc.from)
		assert.Equal(t, tc.want, got, "from %v", tc.from)
		assert.Equal(t, tc.end, end, "from %v", tc.from)
	}
}

func TestReplayResumesAfterAHandlerError(t *testing.T) {
	t.Parallel()
	all := orderStream()
	data := record(t, 0xF00, all)
	boom := errors.New("boom")
	var got []canonical.Change
	failOnce := func(ch canonical.Change) error {
		if ch.Op == canonical.OpDelete && boom != nil {
			return boom
		}
		got = append(got, ch)
		return nil
	}
	resume, err := canonical.Replay(context.Background(), bytes.NewReader(data), 0, failOnce)
	require.ErrorIs(t, err, boom)
	assert.EqualError(t, err, "canonical: replay: emit delete at 0/2000: boom")
	assert.Equal(t, canonical.Position(0x1030), resume, "the end of the last transaction handled")
	assert.Equal(t, all[:7], got, "up to the change the handler refused")

	// A consumer that kept the first transaction and dropped the one it
	// failed in resumes from that Position: nothing twice, nothing missed.
	boom, got = nil, got[:4]
	end, err := canonical.Replay(context.Background(), bytes.NewReader(data), resume, failOnce)
	require.NoError(t, err)
	assert.Equal(t, canonical.Position(0x3030), end)
	assert.Equal(t, all, got)
}

func TestReplayRefusesAFromBeforeTheRecording(t *testing.T) {
	t.Parallel()
	data := record(t, 0x1000, orderStream()[5:])
	called := false
	pos, err := canonical.Replay(context.Background(), bytes.NewReader(data), 0x800, func(canonical.Change) error { called = true; return nil })
	require.ErrorIs(t, err, canonical.ErrReplayGap)
	assert.Equal(t, canonical.Position(0x800), pos)
	assert.False(t, called, "nothing delivered")
	assert.EqualError(t, err, "canonical: replay from 0/800: from is before the recording's start (0/1000): the changes in between are not in it")
}

func TestReplayStopsWithCtx(t *testing.T) {
	t.Parallel()
	data := record(t, 0xF00, orderStream())
	ctx, cancel := context.WithCancel(context.Background())
	var got []canonical.Change
	pos, err := canonical.Replay(ctx, bytes.NewReader(data), 0, func(ch canonical.Change) error {
		got = append(got, ch)
		if ch.Op == canonical.OpCommit {
			cancel()
		}
		return nil
	})
	require.NoError(t, err, "cancellation is the normal stop, as for StreamChanges")
	assert.Equal(t, canonical.Position(0x1030), pos)
	assert.Len(t, got, 4, "one transaction")

	past, stop := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer stop()
	pos, err = canonical.Replay(past, bytes.NewReader(data), 0x1030, collect(&got))
	require.ErrorIs(t, err, context.DeadlineExceeded, "a deadline is not a stop asked for")
	assert.Equal(t, canonical.Position(0x1030), pos)
}

func TestReplayNeverCommitsADamagedTransaction(t *testing.T) {
	t.Parallel()
	data := record(t, 0xF00, orderStream())
	at := bytes.Index(data, []byte(`"new":["1","alice",null]`))
	require.Positive(t, at)
	damaged := bytes.Clone(data)
	damaged[at+len(`"new":["`)] = '7' // the update's id: 1 becomes 7

	var got []canonical.Change
	pos, err := canonical.Replay(context.Background(), bytes.NewReader(damaged), 0, collect(&got))
	require.ErrorIs(t, err, canonical.ErrChecksum)
	var de *canonical.DecodeError
	require.ErrorAs(t, err, &de)
	assert.Equal(t, canonical.Position(0x1030), pos)
	for _, ch := range got {
		assert.False(t, ch.Op == canonical.OpCommit && ch.XID == 701, "the damaged transaction is never committed")
	}
}

func TestReplayReadsIncrementalsAndHandWrittenStreams(t *testing.T) {
	t.Parallel()
	// A stream written by hand (no checksums), of kind incremental, as
	// BackupIncremental writes them.
	stream := `{"t":"header","format":"siphon.jsonl","version":1,"kind":"incremental","position":"0/10"}
{"t":"table","schema":"shop","name":"orders","columns":[{"name":"id","type":"integer","nullable":false}]}
{"t":"begin","xid":9,"position":"0/20","commit_time":"2026-11-30T05:00:00Z"}
{"t":"insert","schema":"shop","table":"orders","xid":9,"position":"0/20","new":["1"]}
{"t":"commit","xid":9,"position":"0/28","commit_time":"2026-11-30T05:00:00Z"}
{"t":"end","position":"0/30","records":4}
`
	var got []canonical.Change
	end, err := canonical.Replay(context.Background(), strings.NewReader(stream), 0, collect(&got))
	require.NoError(t, err)
	assert.Equal(t, canonical.Position(0x30), end, "the recording's end, which vouches for what follows the last commit")
	require.Len(t, got, 3)
	assert.Equal(t, []canonical.Column{{Name: "id", Type: "integer"}}, got[1].Columns)
	id, _ := got[1].Value("id")
	assert.Equal(t, canonical.Text("1"), id)
}

func TestReplayDeliversASnapshotAsOneTransaction(t *testing.T) {
	t.Parallel()
	table := &canonical.Table{Schema: "shop", Name: "orders", Columns: orderColumns, PrimaryKey: []string{"id"}}
	var buf bytes.Buffer
	enc := canonical.NewEncoder(&buf)
	require.NoError(t, enc.WriteHeader(canonical.Header{Kind: canonical.KindSnapshot, Start: 0x5000}))
	require.NoError(t, enc.WriteTable(table))
	rows := []canonical.Row{
		{canonical.Text("1"), canonical.Text("alice"), canonical.Text("10.50")},
		{canonical.Text("2"), canonical.Text("bob"), canonical.Null()},
	}
	for _, r := range rows {
		require.NoError(t, enc.WriteRow(table.TableName(), r))
	}
	require.NoError(t, enc.WriteEnd(0x5000))

	var got []canonical.Change
	end, err := canonical.Replay(context.Background(), bytes.NewReader(buf.Bytes()), 0, collect(&got))
	require.NoError(t, err)
	assert.Equal(t, canonical.Position(0x5000), end, "the snapshot's Position: the change stream continues from it")
	insert := func(r canonical.Row) canonical.Change {
		return canonical.Change{Op: canonical.OpInsert, Position: 0x5000, Schema: "shop", Table: "orders", Columns: orderColumns, New: r}
	}
	assert.Equal(t, []canonical.Change{
		{Op: canonical.OpBegin, Position: 0x5000}, insert(rows[0]), insert(rows[1]), {Op: canonical.OpCommit, Position: 0x5000},
	}, got)

	got = nil
	end, err = canonical.Replay(context.Background(), bytes.NewReader(buf.Bytes()), 0x5000, collect(&got))
	require.NoError(t, err)
	assert.Empty(t, got, "a snapshot at or before from was handled")
	assert.Equal(t, canonical.Position(0x5000), end)

	// Stopped before its commit, a snapshot has not been handled: the
	// Position to resume from is still from.
	ctx, cancel := context.WithCancel(context.Background())
	end, err = canonical.Replay(ctx, bytes.NewReader(buf.Bytes()), 0, func(ch canonical.Change) error {
		if ch.Op == canonical.OpInsert {
			cancel()
		}
		return nil
	})
	require.NoError(t, err)
	assert.Zero(t, end)
}

func TestSnapshotChanges(t *testing.T) {
	t.Parallel()
	table := &canonical.Table{Schema: "shop", Name: "orders", Columns: orderColumns}
	var got []canonical.Change
	sc := canonical.NewSnapshotChanges(0x5000, collect(&got))
	row := canonical.Row{canonical.Text("1"), canonical.Text("alice"), canonical.Text("10.50")}
	require.NoError(t, sc.Row(table, row))
	row[0] = canonical.Text("2") // CopyTables reuses its row slice
	require.NoError(t, sc.Row(table, row))
	require.NoError(t, sc.Commit())
	require.Len(t, got, 4)
	first, _ := got[1].Value("id")
	assert.Equal(t, canonical.Text("1"), first, "each row is kept as it was delivered")
	for _, ch := range got {
		assert.Zero(t, ch.XID, "XID zero marks a snapshot's changes")
		assert.Equal(t, canonical.Position(0x5000), ch.Position)
	}
	assert.ErrorIs(t, sc.Row(table, row), canonical.ErrOrder, "no row after the commit")
	assert.ErrorIs(t, sc.Commit(), canonical.ErrOrder, "one commit")

	got = nil
	require.NoError(t, canonical.NewSnapshotChanges(0x6000, collect(&got)).Commit())
	assert.Equal(t, []canonical.Op{canonical.OpBegin, canonical.OpCommit}, []canonical.Op{got[0].Op, got[1].Op},
		"an empty snapshot is still a transaction: its commit hands on the Position")

	boom := errors.New("boom")
	err := canonical.NewSnapshotChanges(0x6000, func(canonical.Change) error { return boom }).Row(table, row)
	require.ErrorIs(t, err, boom)
	assert.EqualError(t, err, "canonical: snapshot changes: emit begin at 0/6000: boom")
}

func TestRecorderTeeRecordsWhatTheHandlerHandled(t *testing.T) {
	t.Parallel()
	all := orderStream()
	var buf bytes.Buffer
	rec := canonical.NewRecorder(&buf, 0xF00)
	boom := errors.New("boom")
	var handled []canonical.Change
	emit := rec.Tee(func(ch canonical.Change) error {
		handled = append(handled, ch)
		if ch.Op == canonical.OpCommit && ch.XID == 701 {
			return boom
		}
		return nil
	})
	// A stream that stops in the middle of a transaction, resumes from the
	// last commit (the transaction comes again whole), and stops when the
	// handler refuses a commit.
	stream := append(append([]canonical.Change{}, all[:7]...), all[5:9]...)
	var err error
	for _, ch := range stream {
		if err = emit(ch); err != nil {
			break
		}
	}
	require.ErrorIs(t, err, boom, "the handler's error, as it is")
	assert.Equal(t, stream, handled, "the handler receives exactly what the stream delivers")
	require.NoError(t, rec.Close())
	require.NoError(t, rec.Close(), "Close twice")

	var got []canonical.Change
	end, err := canonical.Replay(context.Background(), bytes.NewReader(buf.Bytes()), 0, collect(&got))
	require.NoError(t, err)
	assert.Equal(t, all[:5], got, "the first transaction and the message: what was handled")
	assert.Equal(t, canonical.Position(0x1030), end, "where StreamChanges would have stopped")
}

func TestRecorderRefusesWhatDoesNotFitAStream(t *testing.T) {
	t.Parallel()
	all := orderStream()
	commitNotAfterBegin := all[3]
	commitNotAfterBegin.Position = 0x1000
	beginBeforeEnd := all[5]
	beginBeforeEnd.Position = 0x1010
	cases := []struct {
		name    string
		from    canonical.Position
		changes []canonical.Change
		err     error
		says    string
	}{
		{"a commit with no begin", 0, all[3:4], canonical.ErrOrder, "commit with no transaction in progress"},
		{"an insert with no begin", 0, all[1:2], canonical.ErrOrder, "insert with no transaction in progress"},
		{"a commit not after its begin", 0, append(all[:3:3], commitNotAfterBegin), canonical.ErrInvalidRecord, "0/1000 is not after 0/1000"},
		{"a begin before the last commit", 0, append(all[:4:4], beginBeforeEnd), canonical.ErrOrder, "before the end 0/1030"},
		{"a begin before the start", 0x2500, all[5:6], canonical.ErrOrder, "before the end 0/2500"},
		{"a message before the last commit", 0, append(all[:4:4], canonical.Change{Op: canonical.OpMessage, Position: 0x1010, Message: &canonical.Message{}}), canonical.ErrOrder, "before the end 0/1030"},
	}
	for _, tc := range cases {
		rec := canonical.NewRecorder(&bytes.Buffer{}, tc.from)
		var err error
		for _, ch := range tc.changes {
			if err = rec.Emit(ch); err != nil {
				break
			}
		}
		require.ErrorIs(t, err, tc.err, tc.name)
		assert.Contains(t, err.Error(), tc.says, tc.name)
		assert.ErrorIs(t, rec.Close(), tc.err, "%s: errors are final", tc.name)
	}
}
