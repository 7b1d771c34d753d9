package natsjs

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/siphondb/siphon/canonical"
)

// ConsumeConfig says what [Consume] delivers.
type ConsumeConfig struct {
	// Prefix is the subject prefix the Publisher used. Defaults to
	// [DefaultPrefix].
	Prefix string
	// Tables limits the changes delivered to these tables' (their
	// truncations included) and the schema changes (every one: rare, and
	// what a copy of the tables must follow); the server filters the rest
	// out. Every transaction is still delivered, as its begin and commit,
	// even when it changed none of them. Defaults to every table, and
	// transactional logical decoding messages too.
	Tables []canonical.TableName
	// After makes Consume deliver only the transactions that end after
	// it: the Position of the last OpCommit a consumer handled, to resume
	// exactly after it. Defaults to zero: every transaction the stream
	// holds.
	After canonical.Position
	// Keys are the keys whose signatures (see [HeaderMAC]) make a schema
	// change message one to deliver: the Publisher's [Config].Key, and
	// previous keys while keys are rotated. Defaults to none.
	Keys [][]byte
	// UnauthenticatedSchemaChanges makes Consume deliver schema changes
	// that are not signed with one of Keys. A schema change is a
	// statement a consumer runs: whoever may publish on the stream's
	// subjects chooses it. Defaults to false: such a message stops
	// Consume with a [*MessageError] wrapping
	// siphon.ErrUnauthenticatedSchemaChange, before it is delivered.
	UnauthenticatedSchemaChanges bool
}

// Consume delivers the transactions a stream written by a [Publisher]
// holds, and those it receives next, to emit in commit order, as
// [siphon.Conn.StreamChanges] delivers them from the slot: each
// transaction as [canonical.OpBegin], its changes in their order,
// [canonical.OpCommit] with the end Position, so the same handler serves
// both. A consumer that records the Position of the last OpCommit it
// handled and restarts with it as ConsumeConfig.After sees nothing twice
// and misses nothing.
//
// It reads through an ordered consumer (created on the server, without
// state to clean up, recreated when the connection fails over) from the
// first message after the last transaction ending at or before After,
// found by a binary search over the commit markers. Memory is bounded by
// one message: a transaction is delivered as it is read, not gathered
// whole. Row changes, truncations and messages get their transaction's
// commit time.
//
// The stream's retention (MaxAge, MaxMsgs, MaxBytes) or a purge removes
// its oldest transactions: with a zero After, Consume starts at the oldest
// transaction the stream holds whole; with another, it refuses with a
// [*HistoryGapError] to start when a transaction ending after After may
// have been removed, rather than skip it.
//
// Consume runs until ctx is cancelled, which is the normal stop: it then
// returns the end Position of the last transaction whose OpCommit emit
// returned nil (After when there was none) and nil. An emit error stops it
// and is returned wrapped; a message that is not a Publisher's, or out of
// its place, is a [*MessageError].
func Consume(ctx context.Context, s jetstream.Stream, cfg ConsumeConfig, emit func(canonical.Change) error) (canonical.Position, error) {
	prefix := orDefault(cfg.Prefix)
	if emit == nil {
		return cfg.After, errors.New("natsjs: consume: emit is nil")
	}
	start, err := startSequence(ctx, s, prefix, cfg.After)
	var gap *HistoryGapError
	if errors.As(err, &gap) {
		return cfg.After, err
	}
	if err != nil {
		return cfg.After, stopped(ctx, fmt.Errorf("natsjs: consume: find where to start: %w", err))
	}
	occ := jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: start,
		FilterSubjects: []string{prefix + ".>"}}
	if cfg.Tables != nil {
		occ.FilterSubjects = []string{CommitSubject(prefix), DDLSubject(prefix)}
		for _, t := range cfg.Tables {
			occ.FilterSubjects = append(occ.FilterSubjects, TableSubject(prefix, t))
		}
	}
	cons, err := s.OrderedConsumer(ctx, occ)
	if err != nil {
		return cfg.After, stopped(ctx, fmt.Errorf("natsjs: consume: %w", err))
	}
	it, err := cons.Messages()
	if err != nil {
		return cfg.After, stopped(ctx, fmt.Errorf("natsjs: consume: %w", err))
	}
	defer it.Stop()
	tx := txReader{prefix: prefix, whole: cfg.Tables == nil, after: cfg.After, emit: emit,
		keys: cfg.Keys, unauthenticatedDDL: cfg.UnauthenticatedSchemaChanges}
	for {
		msg, err := it.Next(jetstream.NextContext(ctx))
		if err != nil {
			return tx.after, stopped(ctx, fmt.Errorf("natsjs: consume: %w", err))
		}
		if err := tx.read(msg); err != nil {
			return tx.after, err
		}
	}
}

// stopped returns nil when ctx has ended (the normal stop), err otherwise.
func stopped(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// startSequence returns the stream sequence to read from so as to deliver
// the transactions that end after after: the one after the last commit
// marker ending at or before it (the stream's first for a zero after).
// Commit markers are in the order of their ends, so a binary search finds
// it, each step reading the first marker at or after a sequence. When
// that is the stream's oldest message and older ones were removed, it
// checks that none the consumer has not seen was.
func startSequence(ctx context.Context, s jetstream.Stream, prefix string, after canonical.Position) (uint64, error) {
	info, err := s.Info(ctx)
	if err != nil {
		return 0, err
	}
	first, lo, hi := max(info.State.FirstSeq, 1), max(info.State.FirstSeq, 1), info.State.LastSeq+1
	if info.State.Msgs == 0 {
		return hi, nil
	}
	for after != 0 && lo < hi {
		mid := lo + (hi-lo)/2
		m, ok, err := nextMarker(ctx, s, prefix, mid)
		switch {
		case err != nil:
			return 0, err
		case !ok || m.end > after:
			hi = mid
		default:
			lo = m.seq + 1
		}
	}
	if lo != first || first == 1 {
		return lo, nil
	}
	return headStart(ctx, s, prefix, after, first, info.Config.Name)
}

// headStart returns where to start when the transactions to deliver begin
// at the stream's oldest message first and older ones were removed
// (retention, a purge): a zero after skips a transaction the removal cut;
// a nonzero one is refused with a *HistoryGapError when a transaction
// ending after it may have been removed.
func headStart(ctx context.Context, s jetstream.Stream, prefix string, after canonical.Position, first uint64, stream string) (uint64, error) {
	m, err := s.GetMsg(ctx, first)
	if err != nil {
		return 0, err
	}
	h, err := parseHeader(m.Header, m.Subject == CommitSubject(prefix))
	if err != nil {
		return 0, &MessageError{Sequence: m.Sequence, Subject: m.Subject, Err: err}
	}
	marker, ok, err := nextMarker(ctx, s, prefix, first)
	switch {
	case err != nil:
		return 0, err
	case h.index != 0 && after != 0:
		return 0, &HistoryGapError{Stream: stream, After: after, Oldest: h.commit}
	case h.index != 0 && ok:
		return marker.seq + 1, nil
	case after != 0 && ok && marker.prevEnd > after:
		return 0, &HistoryGapError{Stream: stream, After: after, Oldest: h.commit}
	}
	return first, nil
}

// markerAt is a commit marker's place and ends.
type markerAt struct {
	seq          uint64
	end, prevEnd canonical.Position
}

// nextMarker returns the first commit marker at or after seq, and whether
// there is one.
func nextMarker(ctx context.Context, s jetstream.Stream, prefix string, seq uint64) (markerAt, bool, error) {
	m, err := s.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(CommitSubject(prefix)))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return markerAt{}, false, nil
	}
	if err != nil {
		return markerAt{}, false, err
	}
	h, err := parseHeader(m.Header, true)
	if err != nil {
		return markerAt{}, false, &MessageError{Sequence: m.Sequence, Subject: m.Subject, Err: err}
	}
	return markerAt{seq: m.Sequence, end: h.end, prevEnd: h.prevEnd}, true, nil
}

// txReader turns a stream's messages back into the change stream.
type txReader struct {
	prefix string
	// whole is set when every subject is read: then each transaction's
	// messages are checked to be all there, once each.
	whole bool
	emit  func(canonical.Change) error
	// after is the end of the last transaction delivered.
	after canonical.Position
	// keys verify schema change messages, unless unauthenticatedDDL.
	keys               [][]byte
	unauthenticatedDDL bool

	open bool      // a transaction's begin was delivered
	tx   msgHeader // its headers (index: the next index expected)
	// delivered counts its messages delivered.
	delivered int
}

// read delivers what msg holds.
func (r *txReader) read(msg jetstream.Msg) error {
	meta, err := msg.Metadata()
	if err != nil {
		return fmt.Errorf("natsjs: consume: %w", err)
	}
	fail := func(err error) error {
		return &MessageError{Sequence: meta.Sequence.Stream, Subject: msg.Subject(), Err: err}
	}
	marker := msg.Subject() == CommitSubject(r.prefix)
	h, err := parseHeader(msg.Headers(), marker)
	if err != nil {
		return fail(err)
	}
	next := 0
	if r.open {
		next = r.tx.index
	}
	switch {
	case r.open && h.commit != r.tx.commit:
		return fail(fmt.Errorf("a message of the transaction committed at %v, but the one committed at %v has no commit marker", h.commit, r.tx.commit))
	case !r.open && h.commit <= r.tx.commit:
		return fail(fmt.Errorf("a message of the transaction committed at %v, after the one committed at %v", h.commit, r.tx.commit))
	case h.index < next || r.whole && h.index != next:
		return fail(fmt.Errorf("change %d of the transaction committed at %v, where change %d was expected", h.index, h.commit, next))
	}
	if !r.open {
		if err := r.emit(canonical.Change{Op: canonical.OpBegin, XID: h.xid, Position: h.commit, CommitTime: h.commitTime}); err != nil {
			return fmt.Errorf("natsjs: consume: emit: %w", err)
		}
		r.open, r.tx, r.delivered = true, h, 0
	}
	r.tx.index = h.index + h.changes
	if marker {
		ch, err := canonical.ParseChange(msg.Data())
		if err != nil {
			return fail(err)
		}
		if ch.Op != canonical.OpCommit || ch.Position != h.end {
			return fail(fmt.Errorf("a commit marker holding a %s record at %v, not the commit at %v", ch.Op, ch.Position, h.end))
		}
		if r.whole && h.count != r.delivered {
			return fail(fmt.Errorf("the transaction has %d changes, %d were read", h.count, r.delivered))
		}
		if err := r.emit(ch); err != nil {
			return fmt.Errorf("natsjs: consume: emit: %w", err)
		}
		r.open, r.after = false, ch.Position
		return nil
	}
	if h.changes > 1 {
		return r.readBatch(msg.Data(), &h, fail)
	}
	ch, err := canonical.ParseChange(msg.Data())
	if err != nil {
		return fail(err)
	}
	if ch.Op == canonical.OpDDL {
		raw := &nats.Msg{Subject: msg.Subject(), Header: msg.Headers(), Data: msg.Data()}
		if err := checkSignature(raw, &h, r.keys, r.unauthenticatedDDL); err != nil {
			return fail(err)
		}
	}
	return r.deliver(ch, &h, fail)
}

// readBatch delivers the changes of a message that holds several (see
// Config.MaxChangesPerMessage), once it has read them all.
func (r *txReader) readBatch(data []byte, h *msgHeader, fail func(error) error) error {
	changes, err := parseChanges(data, h.changes)
	if err != nil {
		return fail(err)
	}
	for _, ch := range changes {
		if err := r.deliver(ch, h, fail); err != nil {
			return err
		}
	}
	return nil
}

// parseChanges reads the n changes of a message that holds several: the
// records a canonical stream holds for them, a row change's table record
// left out when it is the last table record before it.
func parseChanges(data []byte, n int) ([]canonical.Change, error) {
	changes := make([]canonical.Change, 0, n)
	var table, buf []byte
	for len(data) > 0 {
		end := bytes.IndexByte(data, '\n') + 1
		if end == 0 {
			end = len(data)
		}
		line := data[:end]
		data = data[end:]
		if bytes.HasPrefix(line, []byte(`{"t":"table",`)) {
			table = line
			continue
		}
		if len(changes) == n {
			return nil, fmt.Errorf("a message of %d changes (%s) holding more", n, HeaderChanges)
		}
		if rowRecord(line) {
			buf = append(append(buf[:0], table...), line...)
			line = buf
		}
		ch, err := canonical.ParseChange(line)
		if err != nil {
			return nil, fmt.Errorf("change %d of %d: %w", len(changes)+1, n, err)
		}
		switch ch.Op {
		case canonical.OpInsert, canonical.OpUpdate, canonical.OpDelete, canonical.OpTruncate, canonical.OpMessage:
		default:
			// A schema change goes alone, as its signature covers it; a
			// begin or commit is no change of a message.
			return nil, fmt.Errorf("change %d of %d: a %s record, which a Publisher never sends among several changes", len(changes)+1, n, ch.Op)
		}
		changes = append(changes, ch)
	}
	if len(changes) != n {
		return nil, fmt.Errorf("a message of %d changes (%s) holding %d", n, HeaderChanges, len(changes))
	}
	return changes, nil
}

// rowRecord reports whether line is an insert, update or delete record,
// which reads with its table record.
func rowRecord(line []byte) bool {
	for _, op := range [...]string{`{"t":"insert",`, `{"t":"update",`, `{"t":"delete",`} {
		if bytes.HasPrefix(line, []byte(op)) {
			return true
		}
	}
	return false
}

// deliver delivers ch, a change of the message h describes.
func (r *txReader) deliver(ch canonical.Change, h *msgHeader, fail func(error) error) error {
	if ch.Op == canonical.OpBegin || ch.Op == canonical.OpCommit {
		return fail(fmt.Errorf("a %s record in a message of changes: a transaction's begin is its first message, its commit its marker", ch.Op))
	}
	ch.CommitTime = h.commitTime
	r.delivered++
	if err := r.emit(ch); err != nil {
		return fmt.Errorf("natsjs: consume: emit: %w", err)
	}
	return nil
}
