package siphon

import (
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/siphondb/siphon/canonical"
	"github.com/siphondb/siphon/internal/walwire"
)

// The stream loop's rules, driven with hand-made items and no server: what
// is delivered, skipped and acknowledged, where a bound ends the stream,
// and when a resume is a gap. The tests against a server show that the
// walsender's messages meet these rules; these show each rule alone.

const testSlot = "unit_slot"

// newTestState is a streamState for cfg whose emit records what it gets.
func newTestState(cfg streamConfig) (*streamState, *[]canonical.Change) {
	var got []canonical.Change
	st := &streamState{cfg: cfg, slot: testSlot, lastEnd: cfg.from, seen: cfg.from, stats: &connStats{},
		ddl:  newSchemaChanges(false, nil, slog.New(slog.NewTextHandler(io.Discard, nil))),
		emit: func(ch canonical.Change) error { got = append(got, ch); return nil }}
	st.acked.Store(uint64(cfg.from))
	return st, &got
}

// txItems is one source transaction whose commit record starts at commit
// and ends at end, with one insert into table.
func txItems(commit, end canonical.Position, table string) []walwire.Item {
	return []walwire.Item{
		{Kind: walwire.KindChange, Change: canonical.Change{Op: canonical.OpBegin, Position: commit}},
		{Kind: walwire.KindChange, Change: canonical.Change{Op: canonical.OpInsert, Position: commit, Schema: "public", Table: table}},
		{Kind: walwire.KindChange, Change: canonical.Change{Op: canonical.OpCommit, Position: end}},
	}
}

func messageItem(pos canonical.Position, transactional bool, prefix string, content []byte) walwire.Item {
	return walwire.Item{Kind: walwire.KindChange, Change: canonical.Change{Op: canonical.OpMessage, Position: pos,
		Message: &canonical.Message{Transactional: transactional, Prefix: prefix, Content: content}}}
}

func heartbeatItem(t *testing.T, pos canonical.Position, slot string, last, at canonical.Position) walwire.Item {
	t.Helper()
	content, err := json.Marshal(heartbeatContent{Slot: slot, Last: last, At: at})
	require.NoError(t, err)
	return messageItem(pos, false, heartbeatPrefix, content)
}

// feed hands items to st until one ends the stream or fails; it returns
// how many were handled, and the last result.
func feed(st *streamState, items ...walwire.Item) (int, bool, error) {
	for i := range items {
		done, err := st.handle(&items[i])
		if done || err != nil {
			return i + 1, done, err
		}
	}
	return len(items), false, nil
}

func ops(changes []canonical.Change) []canonical.Op {
	var out []canonical.Op
	for _, ch := range changes {
		out = append(out, ch.Op)
	}
	return out
}

func TestStreamStateSkipsWhatTheConsumerHas(t *testing.T) {
	t.Parallel()
	st, got := newTestState(streamConfig{from: 0x200})
	items := append(txItems(0x100, 0x180, "before"), txItems(0x200, 0x280, "at")...) // commit starts before from, at from
	items = append(items, messageItem(0x1f0, false, "app", nil), messageItem(0x300, false, "app", []byte("after")))
	_, done, err := feed(st, items...)
	require.NoError(t, err)
	assert.False(t, done)
	require.Equal(t, []canonical.Op{canonical.OpBegin, canonical.OpInsert, canonical.OpCommit, canonical.OpMessage}, ops(*got))
	assert.Equal(t, "at", (*got)[1].Table, "a transaction whose commit starts at from is the consumer's next")
	assert.Equal(t, canonical.Position(0x300), (*got)[3].Position, "a message before from is skipped, one after it delivered")
	assert.Equal(t, canonical.Position(0x280), st.resumePos())
	assert.Equal(t, canonical.Position(0x280), st.ackedPos(), "acknowledged once its OpCommit is emitted")
}

func TestStreamStateAcknowledgement(t *testing.T) {
	t.Parallel()
	t.Run("holdAck keeps the slot at from", func(t *testing.T) {
		st, _ := newTestState(streamConfig{from: 0x100, holdAck: true})
		_, _, err := feed(st, txItems(0x200, 0x280, "t")...)
		require.NoError(t, err)
		st.syncDurable()
		assert.Equal(t, canonical.Position(0x100), st.ackedPos())
		assert.Equal(t, canonical.Position(0x280), st.resumePos())
	})
	t.Run("a durable position moves it only as far as the consumer committed", func(t *testing.T) {
		var durable atomic.Uint64
		st, _ := newTestState(streamConfig{from: 0x100, durable: &durable})
		_, _, err := feed(st, append(txItems(0x200, 0x280, "a"), txItems(0x300, 0x380, "b")...)...)
		require.NoError(t, err)
		st.syncDurable()
		assert.Equal(t, canonical.Position(0x100), st.ackedPos(), "nothing durable yet")
		durable.Store(0x280)
		st.syncDurable()
		assert.Equal(t, canonical.Position(0x280), st.ackedPos())
		_, _, err = feed(st, heartbeatItem(t, 0x400, testSlot, 0x380, 0x3f0))
		require.NoError(t, err)
		assert.Equal(t, canonical.Position(0x280), st.ackedPos(), "a heartbeat does not vouch past what is not durable")
		durable.Store(0x900)
		st.syncDurable()
		assert.Equal(t, canonical.Position(0x380), st.ackedPos(), "never past the last transaction handled, whatever the consumer says")
	})
	t.Run("a heartbeat moves it past the last transaction", func(t *testing.T) {
		st, got := newTestState(streamConfig{from: 0x100})
		_, _, err := feed(st, append(txItems(0x200, 0x280, "a"),
			heartbeatItem(t, 0x300, "another_slot", 0x280, 0x2f0),
			heartbeatItem(t, 0x400, testSlot, 0x200, 0x3f0), // written before the last transaction was handled
		)...)
		require.NoError(t, err)
		assert.Equal(t, canonical.Position(0x280), st.ackedPos(), "another slot's heartbeat, or a stale one, vouches for nothing")
		_, _, err = feed(st, heartbeatItem(t, 0x500, testSlot, 0x280, 0x4f0))
		require.NoError(t, err)
		assert.Equal(t, canonical.Position(0x4f0), st.ackedPos())
		assert.Equal(t, canonical.Position(0x280), st.resumePos(), "the resume Position stays the last transaction's end")
		assert.Len(t, *got, 3, "heartbeats are never emitted")
	})
	t.Run("a heartbeat naming a position past its own moves nothing", func(t *testing.T) {
		// Any role may write a message with the heartbeat's prefix: one
		// that claims the slot may move past WAL the stream has not read
		// (the transactions there would be skipped by the next stream).
		st, _ := newTestState(streamConfig{from: 0x100})
		_, _, err := feed(st, heartbeatItem(t, 0x200, testSlot, 0x100, 0x201))
		require.NoError(t, err)
		assert.Equal(t, canonical.Position(0x100), st.ackedPos())
	})
}

func TestStreamStateBound(t *testing.T) {
	t.Parallel()
	t.Run("a transaction committed after the bound ends the stream", func(t *testing.T) {
		st, got := newTestState(streamConfig{from: 0x100, bound: 0x300})
		n, done, err := feed(st, append(txItems(0x200, 0x280, "in"), txItems(0x300, 0x380, "next")...)...)
		require.NoError(t, err)
		assert.True(t, done)
		assert.Equal(t, 4, n, "ends at the next transaction's begin")
		assert.True(t, st.reachedBound)
		assert.Len(t, *got, 3)
	})
	t.Run("a keepalive at the bound ends it, not inside a transaction", func(t *testing.T) {
		st, _ := newTestState(streamConfig{from: 0x100, bound: 0x300})
		items := txItems(0x200, 0x280, "in")
		keepalive := walwire.Item{Kind: walwire.KindKeepalive, WALEnd: 0x300}
		n, done, err := feed(st, items[0], keepalive, items[1], items[2], keepalive)
		require.NoError(t, err)
		assert.True(t, done)
		assert.Equal(t, 5, n)
	})
	t.Run("a message after the bound ends it", func(t *testing.T) {
		st, got := newTestState(streamConfig{from: 0x100, bound: 0x300})
		_, done, err := feed(st, messageItem(0x301, false, "app", nil))
		require.NoError(t, err)
		assert.True(t, done)
		assert.Empty(t, *got)
	})
}

func TestStreamStateResumeBehindTheSlot(t *testing.T) {
	t.Parallel()
	gapped := func(t *testing.T, err error) {
		t.Helper()
		var gap *ResumeGapError
		require.ErrorAs(t, err, &gap)
		assert.Equal(t, GapBehindSlot, gap.Reason)
		assert.Equal(t, canonical.Position(0x100), gap.Requested)
		assert.Equal(t, canonical.Position(0x200), gap.Confirmed)
	}
	pending := func() (*streamState, *[]canonical.Change) {
		st, got := newTestState(streamConfig{from: 0x100})
		st.startConfirmed, st.pendingGap, st.probeEnd = 0x200, true, 0x400
		return st, got
	}
	t.Run("the heartbeat that moved the slot vouches for the resume", func(t *testing.T) {
		st, got := pending()
		_, _, err := feed(st, append([]walwire.Item{
			messageItem(0x150, false, "app", nil), // before the resume is vouched for: skipped
			heartbeatItem(t, 0x230, testSlot, 0x100, 0x200),
		}, txItems(0x300, 0x380, "t")...)...)
		require.NoError(t, err)
		assert.False(t, st.pendingGap)
		assert.Len(t, *got, 3)
	})
	t.Run("a transaction before that heartbeat is a gap", func(t *testing.T) {
		st, got := pending()
		_, _, err := feed(st, txItems(0x150, 0x180, "lost")...)
		gapped(t, err)
		assert.Empty(t, *got)
	})
	t.Run("a heartbeat past the slot that does not vouch is a gap", func(t *testing.T) {
		// The slot's own heartbeat, written when the consumer had handled
		// more than it resumes from: passed over, and the probe's end
		// reports the gap.
		st, _ := pending()
		_, _, err := feed(st, heartbeatItem(t, 0x2f0, testSlot, 0x180, 0x200))
		require.NoError(t, err)
		assert.True(t, st.pendingGap)
		_, _, err = feed(st, walwire.Item{Kind: walwire.KindKeepalive, WALEnd: 0x400})
		gapped(t, err)
	})
	t.Run("a later heartbeat read first does not hide the one that vouches", func(t *testing.T) {
		// A stream's last heartbeat, its statement cancelled as the stream
		// ended, may be written by its backend after the next stream took
		// the WAL insert position for its own: it names a later position
		// and is written before.
		st, got := pending()
		_, _, err := feed(st, append([]walwire.Item{
			heartbeatItem(t, 0x210, testSlot, 0x100, 0x208),
			heartbeatItem(t, 0x220, testSlot, 0x100, 0x200),
		}, txItems(0x300, 0x380, "t")...)...)
		require.NoError(t, err)
		assert.False(t, st.pendingGap)
		assert.Len(t, *got, 3)
	})
	t.Run("a heartbeat naming a position past its own vouches for nothing", func(t *testing.T) {
		st, _ := pending()
		_, _, err := feed(st, heartbeatItem(t, 0x1f0, testSlot, 0x100, 0x200))
		require.NoError(t, err)
		assert.True(t, st.pendingGap)
		_, _, err = feed(st, txItems(0x300, 0x380, "t")...)
		gapped(t, err)
	})
	t.Run("reading past the probe's end without the heartbeat is a gap", func(t *testing.T) {
		st, _ := pending()
		_, _, err := feed(st, walwire.Item{Kind: walwire.KindKeepalive, WALEnd: 0x3ff})
		require.NoError(t, err)
		_, _, err = feed(st, walwire.Item{Kind: walwire.KindKeepalive, WALEnd: 0x400})
		gapped(t, err)
	})
}

func TestStreamStateErrorsAndTheCaptureTable(t *testing.T) {
	t.Parallel()
	t.Run("an emit error stops the stream, naming the change", func(t *testing.T) {
		st, _ := newTestState(streamConfig{from: 0x100})
		boom := errors.New("boom")
		st.emit = func(ch canonical.Change) error {
			if ch.Op == canonical.OpInsert {
				return boom
			}
			return nil
		}
		n, _, err := feed(st, txItems(0x200, 0x280, "t")...)
		require.ErrorIs(t, err, boom)
		var emitErr *emitError
		require.ErrorAs(t, err, &emitErr)
		assert.Equal(t, canonical.OpInsert, emitErr.op)
		assert.Equal(t, 2, n)
		assert.Equal(t, canonical.Position(0x100), st.resumePos(), "the failed transaction is not the resume Position")
	})
	t.Run("the reader's error ends the stream", func(t *testing.T) {
		st, _ := newTestState(streamConfig{})
		_, _, err := feed(st, walwire.Item{Kind: walwire.KindError, Err: io.ErrUnexpectedEOF})
		assert.ErrorIs(t, err, io.ErrUnexpectedEOF)
	})
	t.Run("the schema capture's own rows are not delivered as rows", func(t *testing.T) {
		st, got := newTestState(streamConfig{from: 0x100})
		capture := canonical.TableName{Schema: "siphon", Name: captureTableName}
		app := canonical.TableName{Schema: "public", Name: "t"}
		_, _, err := feed(st,
			walwire.Item{Kind: walwire.KindChange, Change: canonical.Change{Op: canonical.OpBegin, Position: 0x200}},
			walwire.Item{Kind: walwire.KindChange, Change: canonical.Change{Op: canonical.OpDelete, Position: 0x200, Schema: "siphon", Table: captureTableName}},
			walwire.Item{Kind: walwire.KindChange, Change: canonical.Change{Op: canonical.OpTruncate, Position: 0x200, Truncated: []canonical.TableName{capture}}},
			walwire.Item{Kind: walwire.KindChange, Change: canonical.Change{Op: canonical.OpTruncate, Position: 0x200, Truncated: []canonical.TableName{capture, app}}},
			walwire.Item{Kind: walwire.KindChange, Change: canonical.Change{Op: canonical.OpCommit, Position: 0x280}},
		)
		require.NoError(t, err)
		require.Equal(t, []canonical.Op{canonical.OpBegin, canonical.OpTruncate, canonical.OpCommit}, ops(*got))
		assert.Equal(t, []canonical.TableName{app}, (*got)[1].Truncated)
	})
}

// TestStreamStateAfterTheCatchUp: the walsender starts from the end of the
// last transaction the SQL catch-up delivered, and may send again what
// the catch-up delivered after it (a message, a transaction committed
// earlier): nothing is delivered twice.
func TestStreamStateAfterTheCatchUp(t *testing.T) {
	t.Parallel()
	st, got := newTestState(streamConfig{from: 0x100})
	items := append(txItems(0x200, 0x280, "a"), messageItem(0x300, false, "app", nil))
	n, done, err := feed(st, append(items, walwire.Item{Kind: walwire.KindCaughtUp, WALEnd: 0x380})...)
	require.NoError(t, err)
	assert.True(t, done, "the catch-up's end ends its loop")
	assert.Equal(t, 5, n)
	assert.True(t, st.caughtUp)
	assert.False(t, st.reachedBound)
	_, _, err = feed(st, append(append(txItems(0x200, 0x280, "a"), messageItem(0x300, false, "app", nil)), txItems(0x400, 0x480, "b")...)...)
	require.NoError(t, err)
	require.Len(t, *got, 7, "the first transaction and the message once, then the next transaction")
	assert.Equal(t, "b", (*got)[5].Table)

	bounded, _ := newTestState(streamConfig{from: 0x100, bound: 0x300})
	_, done, err = feed(bounded, walwire.Item{Kind: walwire.KindCaughtUp, WALEnd: 0x300})
	require.NoError(t, err)
	assert.True(t, done)
	assert.True(t, bounded.reachedBound, "a catch-up that read up to the bound ends the incremental")
}
