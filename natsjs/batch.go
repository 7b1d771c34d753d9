package natsjs

import (
	"bytes"
	"fmt"
	"math"

	"github.com/siphondb/siphon/canonical"
)

// batch is changes of the open transaction on one subject, gathered to be
// published as one message (Config.MaxChangesPerMessage).
type batch struct {
	subject string
	first   int // the index of its first change
	n       int
	data    []byte
	// table is the last table record in data: a row change of the same
	// table version leaves its own out.
	table []byte
}

// gather adds ch, the open transaction's change at index, to the batch,
// publishing the batch first when ch cannot join it: another subject,
// MaxChangesPerMessage reached, or a message larger than the server takes.
func (a *attempt) gather(subject string, index int, ch *canonical.Change) error {
	table, line, err := a.lines.change(ch)
	if err != nil {
		return fmt.Errorf("natsjs: the message for %s: %w", subject, err)
	}
	if a.maxHeader == 0 {
		// The largest headers a message of the transaction can have.
		a.maxHeader = headerSize(a.txh.header(&msgHeader{index: math.MaxInt32, changes: math.MaxInt32}, false, math.MaxUint64))
	}
	b := &a.batch
	if b.n > 0 && (b.subject != subject || b.n == a.p.cfg.MaxChangesPerMessage ||
		int64(a.maxHeader+len(b.data)+len(table)+len(line)) > a.maxSize) {
		if err := a.flush(); err != nil {
			return err
		}
	}
	if b.n == 0 {
		b.subject, b.first, b.table = subject, index, nil
		b.data = make([]byte, 0, max(cap(b.data), len(table)+len(line)))
	}
	if table != nil && !bytes.Equal(table, b.table) {
		b.data = append(b.data, table...)
		b.table = table
	}
	b.data = append(b.data, line...)
	b.n++
	return nil
}

// flush publishes the batch, if it holds anything.
func (a *attempt) flush() error {
	b := &a.batch
	if b.n == 0 {
		return nil
	}
	n := b.n
	b.n = 0
	return a.send(b.subject, b.first, n, b.data, changeMsg)
}

// changeLines writes the lines of the changes in batches: the records of
// a canonical stream, whose Encoder writes a table's record only when its
// columns change, so that a batch of row changes costs one table record.
// The stream's header, begin and commit records are dropped. A nil
// changeLines (a Publisher that does not batch) writes nothing.
type changeLines struct {
	enc *canonical.Encoder
	out lineBuffer
	// tables holds the last table record written for each table, to start
	// a batch with.
	tables map[canonical.TableName][]byte
	// begin is the open transaction's begin, until it is written.
	pending *canonical.Change
}

// lineBuffer collects what the Encoder writes.
type lineBuffer struct{ b []byte }

func (l *lineBuffer) Write(p []byte) (int, error) {
	l.b = append(l.b, p...)
	return len(p), nil
}

func newChangeLines() *changeLines {
	c := &changeLines{tables: map[canonical.TableName][]byte{}}
	c.enc = canonical.NewEncoder(&c.out)
	_ = c.enc.WriteHeader(canonical.Header{Kind: canonical.KindChanges}) // a valid header: no error
	return c
}

// begin opens a transaction; its begin record is written only if a change
// of it is.
func (c *changeLines) begin(ch canonical.Change) {
	if c != nil {
		c.pending = &ch
	}
}

// commit closes the transaction, if any of its changes was written.
func (c *changeLines) commit(ch *canonical.Change) error {
	if c == nil || c.pending != nil {
		return nil
	}
	_, err := c.write(ch)
	return err
}

// change returns ch's lines: its table record (nil for a change that has
// none) and its record. Both stay valid until the next call.
func (c *changeLines) change(ch *canonical.Change) (table, line []byte, err error) {
	if c.pending != nil {
		if _, err := c.write(c.pending); err != nil {
			return nil, nil, err
		}
		c.pending = nil
	}
	if line, err = c.write(ch); err != nil || !rowChange(ch.Op) {
		return nil, line, err
	}
	name := ch.TableName()
	if bytes.HasPrefix(line, []byte(`{"t":"table",`)) {
		n := bytes.IndexByte(line, '\n') + 1
		c.tables[name] = bytes.Clone(line[:n])
		line = line[n:]
	}
	return c.tables[name], line, nil
}

// write writes ch and returns its lines.
func (c *changeLines) write(ch *canonical.Change) ([]byte, error) {
	c.out.b = c.out.b[:0]
	if err := c.enc.WriteChange(ch); err != nil {
		return nil, err
	}
	if err := c.enc.Flush(); err != nil {
		return nil, err
	}
	return c.out.b, nil
}

// rowChange reports whether op's changes travel with their table record.
func rowChange(op canonical.Op) bool {
	return op == canonical.OpInsert || op == canonical.OpUpdate || op == canonical.OpDelete
}
