package natsjs

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/siphondb/siphon/canonical"
)

// resume reads where the stream stands and returns the Position to stream
// the slot from: the end of the last transaction whose commit marker the
// stream holds (Config.From when it holds none). When the stream ends
// inside a transaction, that transaction is streamed again and the
// messages the stream holds of it are not published again (a.held).
//
// This does not depend on JetStream's duplicate window: a transaction left
// half published for longer than the window is still completed without a
// duplicate.
func (a *attempt) resume() (canonical.Position, error) {
	name, prefix := a.p.cfg.Stream, a.p.cfg.Prefix
	s, err := a.p.js.Stream(a.ctx, name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return 0, &StreamMismatchError{Stream: name, Problem: "it does not exist: create it first (see StreamConfig)"}
	}
	if err != nil {
		return 0, &publishError{op: "read stream " + name, err: err}
	}
	a.stream = s
	info := s.CachedInfo()
	if want := []string{prefix + ".>"}; !slices.Equal(info.Config.Subjects, want) {
		return 0, &StreamMismatchError{Stream: name, Problem: fmt.Sprintf("it captures %q, not exactly %q", info.Config.Subjects, want)}
	}
	if err := a.barrier(); err != nil {
		return 0, err
	}
	if info, err = s.Info(a.ctx); err != nil {
		return 0, &publishError{op: "read stream " + name, err: err}
	}
	a.maxSize = a.p.nc.MaxPayload()
	if m := int64(info.Config.MaxMsgSize); m > 0 && m < a.maxSize {
		a.maxSize = m
	}
	a.seq = info.State.LastSeq
	a.prev = a.p.cfg.From
	if info.State.Msgs == 0 {
		return a.prev, nil
	}
	return a.resumeFrom(s)
}

// barrier returns once the stream has handled every message this client
// sent it before: an earlier attempt's, still on their way (the NATS
// client's reconnect buffer, or JetStream's queue, which it empties apart
// from the requests that read the stream). It sends the stream a message
// through the same queue that the stream must refuse, expecting a last
// sequence no stream reaches, and waits for the refusal. Reads after it
// see those messages: the attempt cuts its transaction into messages
// where the stream ends, and an earlier attempt's message landing after
// it, cut elsewhere (the server's largest message changed), would repeat
// or lose changes.
func (a *attempt) barrier() error {
	op := "wait for stream " + a.p.cfg.Stream + " to store what was sent before"
	h := nats.Header{}
	h.Set(jetstream.ExpectedLastSeqHeader, strconv.FormatUint(math.MaxUint64, 10))
	_, err := a.p.js.PublishMsg(a.ctx, &nats.Msg{Subject: CommitSubject(a.p.cfg.Prefix), Header: h})
	var apiErr *jetstream.APIError
	switch {
	case err == nil:
		return &publishError{op: op, err: errors.New("the stream stored a message expecting its last sequence to be 2^64-1")}
	case errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant):
		return nil
	}
	return &publishError{op: op, err: err}
}

// resumeFrom reads the stream's last message and the last commit marker
// at or before it, and sets the attempt after them: its next message is
// stored right after the last one, and is the change after it.
//
// The stream may grow while it is read: the messages of an earlier
// attempt may still arrive (the NATS client's reconnect buffer flushed,
// a publish JetStream did not answer sent again). The three must come
// from one state of the stream. Were the marker newer than the last
// message, the attempt would stream from after a transaction and expect
// the stream to end before its marker: its first message would be
// refused, and the next, sent before the refusal came back, stored in its
// place (a commit marker without its changes). So where the stream grew
// between the two reads, they are made again.
func (a *attempt) resumeFrom(s jetstream.Stream) (canonical.Position, error) {
	prefix := a.p.cfg.Prefix
	for {
		last, ok, err := a.lastMessage(s, prefix+".>")
		if err != nil || !ok {
			return a.prev, err
		}
		a.seq = max(a.seq, last.Sequence)
		marker := last.Subject == CommitSubject(prefix)
		h, err := a.ownHeader(last, marker)
		if err != nil {
			return 0, err
		}
		a.held = msgKey{h.commit, h.last()}
		if marker {
			a.last, a.prev = h.end, h.end
			return h.end, nil
		}
		m, ok, err := a.lastMessage(s, CommitSubject(prefix))
		if err != nil || !ok {
			return a.prev, err
		}
		if m.Sequence > last.Sequence {
			continue // the stream grew between the reads
		}
		if h, err = a.ownHeader(m, true); err != nil {
			return 0, err
		}
		a.last, a.prev = h.end, h.end
		return h.end, nil
	}
}

// lastMessage returns the stream's last message on subject, and whether
// there is one.
func (a *attempt) lastMessage(s jetstream.Stream, subject string) (*jetstream.RawStreamMsg, bool, error) {
	m, err := s.GetLastMsgForSubject(a.ctx, subject)
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return nil, false, nil
	case err != nil:
		return nil, false, &publishError{op: fmt.Sprintf("read the last message on %s of stream %s", subject, a.p.cfg.Stream), err: err}
	}
	return m, true, nil
}

// ownHeader reads m's headers and checks that the message is this slot's.
func (a *attempt) ownHeader(m *jetstream.RawStreamMsg, marker bool) (msgHeader, error) {
	h, err := parseHeader(m.Header, marker)
	name := a.p.cfg.Stream
	if err != nil {
		return h, &StreamMismatchError{Stream: name, Problem: fmt.Sprintf("message %d (%s): %v", m.Sequence, m.Subject, err)}
	}
	if h.systemID != a.systemID || h.slot != a.p.cfg.Slot {
		return h, &StreamMismatchError{Stream: name, Problem: fmt.Sprintf(
			"message %d comes from system %s, slot %q, not system %s, slot %q: give each slot a stream of its own",
			m.Sequence, h.systemID, h.slot, a.systemID, a.p.cfg.Slot)}
	}
	return h, nil
}
