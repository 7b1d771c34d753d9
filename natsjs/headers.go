package natsjs

import (
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/siphondb/siphon/canonical"
)

// headerPrefix begins the name of every header of siphon's.
const headerPrefix = "Siphon-"

// The headers of every message a [Publisher] writes. Positions are in LSN
// notation ("16/B374D848"), times RFC 3339 in UTC, numbers decimal.
const (
	// HeaderSystemID is the source's system identifier
	// (pg_control_system()), which tells apart clusters whose positions
	// are unrelated.
	HeaderSystemID = "Siphon-System-Id"
	// HeaderSlot is the replication slot the changes were read through.
	HeaderSlot = "Siphon-Slot"
	// HeaderXID is the transaction's id.
	HeaderXID = "Siphon-Xid"
	// HeaderCommit is the transaction's commit Position: the LSN of its
	// commit record, as its begin announced it. It is the same on every
	// message of the transaction, and grows from one transaction to the
	// next in commit order.
	HeaderCommit = "Siphon-Commit"
	// HeaderCommitTime is the transaction's commit time.
	HeaderCommitTime = "Siphon-Commit-Time"
	// HeaderIndex is the message's place in its transaction: the index of
	// its (first) change, counting the transaction's changes 0, 1, 2, ...
	// in the order they were made, then the commit marker's, which is the
	// number of changes. Without batches (see [HeaderChanges]) that is
	// the message's own place: 0, 1, 2, ..., then the marker.
	HeaderIndex = "Siphon-Index"
	// HeaderChanges, on a message that holds several changes of its
	// transaction (see [Config].MaxChangesPerMessage), is how many: the
	// changes indexed [HeaderIndex] to [HeaderIndex]+n-1. Absent, the
	// message holds one change.
	HeaderChanges = "Siphon-Changes"
	// HeaderEnd, on a commit marker, is the transaction's end Position:
	// the Position to resume from once it is handled (the commit
	// change's Position).
	HeaderEnd = "Siphon-End"
	// HeaderCount, on a commit marker, is how many changes of the
	// transaction came before it, on every subject (one message each,
	// unless batched: see [HeaderChanges]).
	HeaderCount = "Siphon-Count"
	// HeaderPrevEnd, on a commit marker, is the end Position of the
	// transaction published before it (0/0 when unknown: the first the
	// Publisher published, streamed from where the slot stood), so a
	// consumer can tell when the stream no longer holds a transaction it
	// has not seen.
	HeaderPrevEnd = "Siphon-Prev-End"
)

// MsgID returns the Nats-Msg-Id of a message: the source's system
// identifier, the slot, the transaction's commit Position and the message's
// index in it ([HeaderIndex]: that of its first change), joined by ':'. It
// is the same each time the transaction is read from the slot, so
// JetStream drops a message it already holds (within the stream's
// duplicate window).
func MsgID(systemID, slot string, commit canonical.Position, index int) string {
	return systemID + ":" + slot + ":" + commit.String() + ":" + strconv.Itoa(index)
}

// msgHeader describes a message as its headers do.
type msgHeader struct {
	systemID, slot string
	xid            uint32
	commit         canonical.Position
	commitTime     time.Time
	index          int
	// changes is how many changes the message holds (1 unless batched).
	changes int
	// end, count and prevEnd are a commit marker's.
	end, prevEnd canonical.Position
	count        int
}

// txHeader holds the header values every message of a transaction
// shares, formatted once for all of them.
type txHeader struct {
	idPrefix                                string // the Nats-Msg-Id up to the index
	systemID, slot, xid, commit, commitTime []string
}

func newTxHeader(m *msgHeader) txHeader {
	commit := m.commit.String()
	return txHeader{
		idPrefix:   m.systemID + ":" + m.slot + ":" + commit + ":",
		systemID:   []string{m.systemID},
		slot:       []string{m.slot},
		xid:        []string{strconv.FormatUint(uint64(m.xid), 10)},
		commit:     []string{commit},
		commitTime: []string{m.commitTime.UTC().Format(time.RFC3339Nano)},
	}
}

// header builds the headers of the transaction's message m, with
// Nats-Expected-Last-Sequence expecting seq. The maps share the values of
// t, which nobody changes.
func (t *txHeader) header(m *msgHeader, marker bool, seq uint64) nats.Header {
	index := strconv.Itoa(m.index)
	h := make(nats.Header, 12)
	h[nats.MsgIdHdr] = []string{t.idPrefix + index}
	h[jetstream.ExpectedLastSeqHeader] = []string{strconv.FormatUint(seq, 10)}
	h[HeaderSystemID], h[HeaderSlot], h[HeaderXID] = t.systemID, t.slot, t.xid
	h[HeaderCommit], h[HeaderCommitTime] = t.commit, t.commitTime
	h[HeaderIndex] = []string{index}
	if m.changes > 1 {
		h[HeaderChanges] = []string{strconv.Itoa(m.changes)}
	}
	if marker {
		h[HeaderEnd] = []string{m.end.String()}
		h[HeaderCount] = []string{strconv.Itoa(m.count)}
		h[HeaderPrevEnd] = []string{m.prevEnd.String()}
	}
	return h
}

// parseHeader reads a message's headers; marker says whether it is a
// commit marker, which has three more (and holds one change, the commit).
func parseHeader(h nats.Header, marker bool) (msgHeader, error) {
	r := headerReader{h: h}
	m := msgHeader{
		systemID:   r.text(HeaderSystemID),
		slot:       r.text(HeaderSlot),
		xid:        uint32(r.uint(HeaderXID, 32)),
		commit:     r.position(HeaderCommit),
		commitTime: r.time(HeaderCommitTime),
		index:      int(r.uint(HeaderIndex, 31)),
		changes:    1,
	}
	if marker {
		m.end = r.position(HeaderEnd)
		m.count = int(r.uint(HeaderCount, 31))
		m.prevEnd = r.position(HeaderPrevEnd)
	} else if h.Get(HeaderChanges) != "" {
		m.changes = int(r.uint(HeaderChanges, 31))
		if r.err == nil && m.changes < 1 {
			r.err = fmt.Errorf("header %s: a message holds at least one change, not %d", HeaderChanges, m.changes)
		}
	}
	return m, r.err
}

// last is the index of the last change the message holds.
func (m *msgHeader) last() int { return m.index + m.changes - 1 }

// headerReader reads headers, keeping the first problem.
type headerReader struct {
	h   nats.Header
	err error
}

func (r *headerReader) text(key string) string {
	v := r.h.Get(key)
	if v == "" && r.err == nil {
		r.err = fmt.Errorf("no %s header: not a message of a natsjs Publisher", key)
	}
	return v
}

func (r *headerReader) check(key string, err error) {
	if err != nil && r.err == nil {
		r.err = fmt.Errorf("header %s: %w", key, err)
	}
}

func (r *headerReader) uint(key string, bits int) uint64 {
	v, err := strconv.ParseUint(r.text(key), 10, bits)
	if r.err == nil {
		r.check(key, err)
	}
	return v
}

func (r *headerReader) position(key string) canonical.Position {
	p, err := canonical.ParsePosition(r.text(key))
	if r.err == nil {
		r.check(key, err)
	}
	return p
}

func (r *headerReader) time(key string) time.Time {
	t, err := time.Parse(time.RFC3339Nano, r.text(key))
	if r.err == nil {
		r.check(key, err)
	}
	return t
}
