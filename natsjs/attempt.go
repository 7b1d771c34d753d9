package natsjs

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/siphondb/siphon"
	"github.com/siphondb/siphon/canonical"
)

// attempt is one run of the slot into the stream: it reads where the
// stream stands, streams the slot from there, and ends at the first
// failure. Only the goroutine running StreamChanges' emit uses it; acks
// awaits JetStream's answers in a goroutine of its own.
//
// Every message expects the stream's last sequence to be the one before it
// (Nats-Expected-Last-Sequence), so JetStream stores the messages in the
// order they were published or not at all: a message lost on the way (a
// leader change, a node stopped) makes every message after it fail, and
// the stream never holds a gap or a reordered message; the next attempt
// continues after the last message it holds.
type attempt struct {
	p        *Publisher
	ctx      context.Context
	systemID string
	// maxSize is the largest message NATS and the stream take.
	maxSize int64
	// stream is the JetStream stream, as resume found it.
	stream jetstream.Stream

	// seq is the stream's last sequence as the attempt expects it: the
	// next message is stored at seq+1.
	seq uint64
	// held is the last change (or marker) the stream held when the
	// attempt began: changes at or before it are not published again.
	held msgKey
	// last is the end Position of the last transaction the stream holds;
	// prev is that of the last one published, or where the attempt
	// started when none was.
	last, prev canonical.Position
	// published counts the messages JetStream acknowledged.
	published int

	// tx describes the open transaction; its index is the next change's.
	tx  msgHeader
	txh txHeader
	// maxHeader bounds the size of the headers of its messages.
	maxHeader int
	// batch gathers its next changes into one message, their lines
	// written by lines.
	batch batch
	lines *changeLines
	// acks awaits the acknowledgements of the messages published, and
	// streamCtx is the attempt's stream, which it stops on a failure.
	acks      *acks
	streamCtx context.Context
}

// msgKey orders a slot's messages: by commit Position, then index.
type msgKey struct {
	commit canonical.Position
	index  int
}

func (k msgKey) after(o msgKey) bool {
	return k.commit > o.commit || k.commit == o.commit && k.index > o.index
}

func (p *Publisher) newAttempt(ctx context.Context, systemID string) *attempt {
	a := &attempt{p: p, ctx: ctx, systemID: systemID}
	if p.cfg.MaxChangesPerMessage > 1 {
		a.lines = newChangeLines()
	}
	return a
}

// run resumes from the stream and streams the slot into it until ctx ends
// or something fails.
func (a *attempt) run(c *siphon.Conn) error {
	from, err := a.resume()
	if err != nil {
		return err
	}
	a.p.log.Info("natsjs: publishing", "from", from, "stream_last_seq", a.seq)
	streamCtx, stop := context.WithCancelCause(a.ctx)
	defer stop(nil)
	a.streamCtx, a.acks = streamCtx, newAcks(&a.p.cfg, a.stream, stop)
	go a.acks.run(a.ctx)
	defer a.acks.finish() // its goroutine ends with the attempt, a panicking emit included
	// The slot is acknowledged as far as JetStream has stored whole
	// transactions, not when emit returns.
	_, err = c.StreamChangesWith(streamCtx, from, siphon.StreamOptions{Durable: &a.acks.durable}, a.emit)
	// What is still in flight is settled (stored or not) before the next
	// attempt reads the stream.
	last, published, ackErr := a.acks.finish()
	if last != 0 {
		a.last = last
	}
	a.published = published
	if ackErr != nil && (err == nil || retryable(err)) {
		return ackErr // the cause: it stopped the stream
	}
	return err
}

// emit is the StreamChanges callback.
func (a *attempt) emit(ch canonical.Change) error {
	prefix := a.p.cfg.Prefix
	switch ch.Op {
	case canonical.OpBegin:
		a.tx = msgHeader{systemID: a.systemID, slot: a.p.cfg.Slot, xid: ch.XID, commit: ch.Position, commitTime: ch.CommitTime}
		a.txh = newTxHeader(&a.tx)
		a.maxHeader = 0
		a.lines.begin(ch)
	case canonical.OpInsert, canonical.OpUpdate, canonical.OpDelete:
		return a.add(TableSubject(prefix, ch.TableName()), &ch)
	case canonical.OpTruncate:
		// One message per table, on its subject, so a consumer of one table
		// sees its truncation and no other's.
		for _, t := range ch.Truncated {
			one := ch
			one.Truncated = []canonical.TableName{t}
			if err := a.add(TableSubject(prefix, t), &one); err != nil {
				return err
			}
		}
	case canonical.OpMessage:
		// A non-transactional message belongs to no transaction: it has no
		// commit Position to order and deduplicate it by.
		if ch.Message.Transactional {
			return a.add(MessageSubject(prefix), &ch)
		}
	case canonical.OpDDL:
		return a.add(DDLSubject(prefix), &ch)
	case canonical.OpCommit:
		if err := a.flush(); err != nil {
			return err
		}
		if err := a.lines.commit(&ch); err != nil {
			return fmt.Errorf("natsjs: the commit marker: %w", err)
		}
		// A marker even for a transaction with nothing else to publish: the
		// slot is acknowledged past it, so the stream must hold its end, or
		// resuming from the stream would be behind the slot.
		a.tx.end, a.tx.count, a.tx.prevEnd = ch.Position, a.tx.index, a.prev
		// The transaction is durable once JetStream has stored its marker
		// and, before it, every message of it (acks).
		index, publish := a.next()
		if !publish {
			a.prev = ch.Position
			return a.acks.add(a.streamCtx, pendingMsg{end: ch.Position})
		}
		data, err := canonical.AppendChange(nil, &ch)
		if err != nil {
			return fmt.Errorf("natsjs: the commit marker: %w", err)
		}
		a.prev = ch.Position
		return a.send(CommitSubject(prefix), index, 1, data, markerMsg)
	}
	return nil
}

// add publishes ch, the open transaction's next change, on subject,
// unless the stream holds it already: alone, or gathered with the changes
// next to it on the same subject into one message (Config.MaxChangesPerMessage).
// A schema change always goes alone, as what its signature covers.
func (a *attempt) add(subject string, ch *canonical.Change) error {
	index, publish := a.next()
	if !publish {
		return nil
	}
	if a.p.cfg.MaxChangesPerMessage > 1 && ch.Op != canonical.OpDDL {
		return a.gather(subject, index, ch)
	}
	if err := a.flush(); err != nil {
		return err
	}
	data, err := canonical.AppendChange(nil, ch)
	if err != nil {
		return fmt.Errorf("natsjs: the message for %s: %w", subject, err)
	}
	kind := changeMsg
	if ch.Op == canonical.OpDDL {
		kind = ddlMsg
	}
	return a.send(subject, index, 1, data, kind)
}

// next returns the open transaction's next index (a change's, or its
// marker's), and whether to publish it: whether the stream did not hold it
// when the attempt began.
func (a *attempt) next() (index int, publish bool) {
	index = a.tx.index
	a.tx.index++
	return index, (msgKey{a.tx.commit, index}).after(a.held)
}

// msgKind tells the messages a Publisher sends apart.
type msgKind uint8

const (
	changeMsg msgKind = iota // one change or several, on their subject
	ddlMsg                   // a schema change, signed with Config.Key
	markerMsg                // a commit marker
)

// send publishes data, the open transaction's n changes from index (its
// commit marker at index), on subject, once it fits in the window of
// messages awaiting their acknowledgement. JetStream keeps data until it
// acknowledges it: the caller does not reuse it.
func (a *attempt) send(subject string, index, n int, data []byte, kind msgKind) error {
	h := a.tx
	h.index, h.changes = index, n
	hdr := a.txh.header(&h, kind == markerMsg, a.seq)
	if kind == ddlMsg && a.p.cfg.Key != nil {
		sign(hdr, a.p.cfg.Key, subject, &h, data)
	}
	size := len(data) + headerSize(hdr)
	if int64(size) > a.maxSize {
		return &MessageTooLargeError{Subject: subject, Commit: h.commit, Size: size, Max: a.maxSize}
	}
	if err := a.acks.reserve(a.streamCtx, size); err != nil {
		return err
	}
	fut, err := a.p.js.PublishMsgAsync(&nats.Msg{Subject: subject, Data: data, Header: hdr})
	if err != nil {
		a.acks.release(size)
		return &publishError{op: "publish " + subject + " (" + hdr.Get(nats.MsgIdHdr) + ")", err: err}
	}
	a.seq++
	m := pendingMsg{fut: fut, seq: a.seq, size: size, subject: subject}
	if kind == markerMsg {
		m.end = h.end
	}
	return a.acks.add(a.streamCtx, m)
}

// headerSize is the size of h on the wire (NATS/1.0 header block).
func headerSize(h nats.Header) int {
	n := len("NATS/1.0\r\n\r\n")
	for k, vs := range h {
		for _, v := range vs {
			n += len(k) + len(": ") + len(v) + len("\r\n")
		}
	}
	return n
}
