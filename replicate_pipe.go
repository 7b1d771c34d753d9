package siphon

import (
	"context"
	"errors"
	"slices"
	"sync"

	"github.com/siphondb/siphon/canonical"
)

// The capture pipe: how Replicate hands the changes its stream captures
// to the session that applies them.

// errCaptureStopped ends the apply side when the capture stopped inside a
// transaction: the unit is rolled back to its complete transactions.
// errApplyStopped ends the capture when the apply side stopped.
var (
	errCaptureStopped = errors.New("siphon: the capture stopped inside a transaction")
	errApplyStopped   = errors.New("siphon: the apply side stopped")
)

// capturePipe carries captured changes to the apply session as records,
// with table records where a table's columns change, through a bounded
// queue: a slow target holds the capture back. The queue is handed over
// whole: the capture appends to it under a lock, and the apply side takes
// every record queued at once, then reads them without the lock. Each side
// wakes the other only when that one waits: the apply side once a commit,
// or pipeWakeRecords records, are queued (it could not apply less); the
// capture once the apply side took the queue. A busy pipe so costs a wake-up
// per transaction or per queue, not one per record.
type capturePipe struct {
	mu          sync.Mutex
	queue       []canonical.Record
	readerWaits bool          // the apply side waits for readerWake
	writerWaits bool          // the capture waits for writerWake
	readerWake  chan struct{} // capacity 1, as writerWake
	writerWake  chan struct{}
	closed      bool          // the capture ended: err, end and cut are set
	gone        chan struct{} // closed when the reader stopped
	once        sync.Once

	// Apply side: the records taken from the queue, and how many of them
	// were read.
	batch []canonical.Record
	read  int

	// Capture side.
	tables map[canonical.TableName]*canonical.Table
	source *canonical.Schema
	inTx   bool
	last   canonical.Position // the last commit's end

	// End of the capture, set before closed.
	err error
	end canonical.Position
	cut bool
}

// Bounds of the pipe: the queue holds at most pipeDepth/2 records, and the
// apply side as many, so at most pipeDepth are in flight between capture
// and apply; a waiting apply side is woken at a commit, or once
// pipeWakeRecords records of a transaction are queued.
const (
	pipeDepth       = 4096
	pipeWakeRecords = 256
)

// newCapturePipe returns a pipe for a capture that starts at from.
func newCapturePipe(source *canonical.Schema, from canonical.Position) *capturePipe {
	return &capturePipe{queue: make([]canonical.Record, 0, pipeDepth/2), batch: make([]canonical.Record, 0, pipeDepth/2),
		readerWake: make(chan struct{}, 1), writerWake: make(chan struct{}, 1), gone: make(chan struct{}),
		tables: map[canonical.TableName]*canonical.Table{}, source: source, last: from}
}

// put hands a change on, after a table record when its columns are new.
// A message outside a transaction is not: apply ignores messages, and one
// that followed the last commit would leave records buffered, so that the
// apply side would keep that commit's unit open until the next
// transaction arrived.
func (p *capturePipe) put(ctx context.Context, ch canonical.Change) error {
	switch ch.Op {
	case canonical.OpMessage:
		if !p.inTx {
			return nil
		}
	case canonical.OpBegin:
		p.inTx = true
	case canonical.OpCommit:
		p.inTx, p.last = false, ch.Position
	}
	rec := canonical.Record{Type: canonical.RecordChange, Change: &ch}
	if ch.Op == canonical.OpInsert || ch.Op == canonical.OpUpdate || ch.Op == canonical.OpDelete {
		t, fresh := p.table(&ch)
		if fresh {
			if err := p.send(ctx, canonical.Record{Type: canonical.RecordTable, Table: t}); err != nil {
				return err
			}
		}
		rec.Table = t
	}
	return p.send(ctx, rec)
}

// table returns the table record of ch's table and columns, and whether it
// is new: keys and replica identity come from the source's schema.
func (p *capturePipe) table(ch *canonical.Change) (*canonical.Table, bool) {
	name := ch.TableName()
	if t := p.tables[name]; t != nil && sameColumns(t.Columns, ch.Columns) {
		return t, false
	}
	t := &canonical.Table{Schema: name.Schema, Name: name.Name, Columns: ch.Columns}
	if known := p.source.Table(name.Schema, name.Name); known != nil {
		t.PrimaryKey, t.ReplicaIdentity, t.PartitionOf = known.PrimaryKey, known.ReplicaIdentity, known.PartitionOf
		for _, k := range known.IdentityKey {
			if slices.ContainsFunc(ch.Columns, func(c canonical.Column) bool { return c.Name == k }) {
				t.IdentityKey = append(t.IdentityKey, k)
			}
		}
	}
	p.tables[name] = t
	return t, true
}

// sameColumns reports whether a and b describe the same columns; the
// stream shares one slice per table version, which makes it cheap.
func sameColumns(a, b []canonical.Column) bool {
	if len(a) != len(b) {
		return false
	}
	if len(a) == 0 || &a[0] == &b[0] {
		return true
	}
	return slices.Equal(a, b)
}

func (p *capturePipe) send(ctx context.Context, rec canonical.Record) error {
	p.mu.Lock()
	for len(p.queue) >= pipeDepth/2 {
		p.writerWaits = true
		p.mu.Unlock()
		select {
		case <-p.writerWake:
		case <-p.gone:
			return errApplyStopped
		case <-ctx.Done():
			return context.Cause(ctx)
		}
		p.mu.Lock()
	}
	p.queue = append(p.queue, rec)
	wake := p.readerWaits && (!p.inTx || len(p.queue) >= pipeWakeRecords)
	if wake {
		p.readerWaits = false
	}
	p.mu.Unlock()
	if wake {
		signal(p.readerWake)
	}
	return nil
}

// signal wakes the side waiting on c (a channel of capacity 1).
func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// close ends the capture: err is why it stopped (nil for a clean stop).
func (p *capturePipe) close(err error) {
	p.mu.Lock()
	p.err, p.end, p.cut, p.closed = err, p.last, p.inTx, true
	wake := p.readerWaits
	p.readerWaits = false
	p.mu.Unlock()
	if wake {
		signal(p.readerWake)
	}
}

// abandon tells the capture that nothing reads any more.
func (p *capturePipe) abandon() { p.once.Do(func() { close(p.gone) }) }

// Next returns the next record; once the capture ended cleanly, an end
// record at its last commit, and errCaptureStopped when it ended with an
// error or inside a transaction, so that the apply side keeps only
// complete transactions.
func (p *capturePipe) Next() (canonical.Record, error) {
	if p.read == len(p.batch) && !p.take() {
		if p.cut || p.err != nil {
			return canonical.Record{}, errCaptureStopped
		}
		return canonical.Record{Type: canonical.RecordEnd, Position: p.end}, nil
	}
	rec := p.batch[p.read]
	p.batch[p.read] = canonical.Record{} // the apply side keeps what it needs
	p.read++
	return rec, nil
}

// take waits until records are queued and takes them all, handing the
// emptied batch back to the capture as its queue; it reports false when
// the capture ended with nothing queued.
func (p *capturePipe) take() bool {
	p.mu.Lock()
	for len(p.queue) == 0 && !p.closed {
		p.readerWaits = true
		p.mu.Unlock()
		<-p.readerWake
		p.mu.Lock()
	}
	if len(p.queue) == 0 {
		p.mu.Unlock()
		return false
	}
	p.batch, p.queue, p.read = p.queue, p.batch[:0], 0
	wake := p.writerWaits
	p.writerWaits = false
	p.mu.Unlock()
	if wake {
		signal(p.writerWake)
	}
	return true
}

// Ahead reports false: the capture decodes its records already, and bounds
// how many are in flight; the apply gains nothing by taking them early.
func (p *capturePipe) Ahead() bool { return false }

// Buffered reports whether captured records wait.
func (p *capturePipe) Buffered() bool {
	if p.read < len(p.batch) {
		return true
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.queue) > 0
}
