package canonical

import (
	"bytes"
	"fmt"
)

// AppendChange appends ch to dst as self-contained JSONL, so that one change
// can travel on its own (a message on a bus, a row of a queue): the records
// an [Encoder] writes for ch in a stream of kind changes, each a line ending
// in "\n", without the header, end record or begin and commit records
// around it. An insert, update or delete is two lines: a table record
// (ch.Schema, ch.Table and ch.Columns, no keys) and the change record, so a
// reader needs nothing else to know the columns. Any other change is one
// line. [ParseChange] reads it back.
//
// The lines carry nothing of a stream's framing, so they stay the same
// whatever checks a stream adds around its records. AppendChange refuses,
// with an [*EncodeError], what the Encoder refuses (invalid UTF-8, a row of
// the wrong length, a row change without the values its op needs, a commit
// time it cannot write) and a row change without Columns; dst is then
// returned as it was given.
func AppendChange(dst []byte, ch *Change) ([]byte, error) {
	if ch == nil {
		return dst, &EncodeError{Record: "change", Err: fmt.Errorf("%w: nil change", ErrInvalidRecord)}
	}
	rec := ch.Op.String()
	if _, ok := ParseOp(rec); !ok {
		return dst, &EncodeError{Record: "change", Err: fmt.Errorf("%w: unknown op %v", ErrInvalidRecord, ch.Op)}
	}
	b, err := appendChangeLines(dst, ch, rec)
	if err != nil {
		return dst, err
	}
	return b, nil
}

// appendChangeLines appends ch's lines to b, as AppendChange describes.
func appendChangeLines(b []byte, ch *Change, rec string) ([]byte, error) {
	switch ch.Op {
	case OpBegin, OpCommit:
		if !timeEncodable(ch.CommitTime) {
			return b, &EncodeError{Record: rec, Err: fmt.Errorf("%w: commit time %v: year outside 0-9999", ErrInvalidRecord, ch.CommitTime)}
		}
		b = appendTx(appendRecordStart(b, rec), ch)
		b = appendTime(appendKey(b, "commit_time"), ch.CommitTime)
	case OpInsert, OpUpdate, OpDelete:
		var err error
		if b, err = appendRowChangeLines(b, ch, rec); err != nil {
			return b, err
		}
	case OpTruncate:
		b = appendTx(appendRecordStart(b, rec), ch)
		b = append(appendKey(b, "tables"), '[')
		for i, n := range ch.Truncated {
			if i > 0 {
				b = append(b, ',')
			}
			var err error
			if b, err = appendTableNames(append(b, '{'), "name", n); err != nil {
				return b, &EncodeError{Record: rec, Table: n, Err: err}
			}
			b = append(b, '}')
		}
		b = append(b, ']')
		b = appendBool(appendKey(b, "cascade"), ch.Cascade)
		b = appendBool(appendKey(b, "restart_identity"), ch.RestartIdentity)
	case OpMessage, OpDDL:
		appendMembers := appendMessage
		if ch.Op == OpDDL {
			appendMembers = appendDDL
		}
		var err error
		if b, err = appendMembers(appendRecordStart(b, rec), ch, rec); err != nil {
			return b, err
		}
	}
	return append(b, '}', '\n'), nil
}

// appendRecordStart appends `{"t":"<rec>"`.
func appendRecordStart(b []byte, rec string) []byte {
	b = append(b, `{"t":"`...)
	b = append(b, rec...)
	return append(b, '"')
}

// appendRowChangeLines appends an insert, update or delete's table record
// line and the start of its change record.
func appendRowChangeLines(b []byte, ch *Change, rec string) ([]byte, error) {
	name := ch.TableName()
	fail := func(err error) error { return &EncodeError{Record: rec, Table: name, Err: err} }
	switch {
	case ch.Columns == nil:
		return b, fail(fmt.Errorf("%w: a row change travels with its columns, and has none", ErrInvalidRecord))
	case (ch.Op == OpInsert || ch.Op == OpUpdate) && ch.New == nil:
		return b, fail(fmt.Errorf("%w: %s without new values", ErrInvalidRecord, rec))
	case ch.Op == OpDelete && ch.Old == nil:
		return b, fail(fmt.Errorf("%w: delete without old values", ErrInvalidRecord))
	case ch.Op == OpInsert && ch.Old != nil:
		return b, fail(fmt.Errorf("%w: insert with old values", ErrInvalidRecord))
	case ch.Op == OpDelete && ch.New != nil:
		return b, fail(fmt.Errorf("%w: delete with new values", ErrInvalidRecord))
	}
	t := &Table{Schema: name.Schema, Name: name.Name, Columns: ch.Columns}
	n := len(t.Columns)
	if ch.New != nil && len(ch.New) != n || ch.Old != nil && len(ch.Old) != n {
		return b, fail(fmt.Errorf("%w: %d new and %d old values for %d columns", ErrInvalidRecord, len(ch.New), len(ch.Old), n))
	}
	b, err := appendTable(b, t)
	if err != nil {
		if ee, ok := err.(*EncodeError); ok {
			ee.Record = rec
			ee.Err = fmt.Errorf("its table record: %w", ee.Err)
		}
		return b, err
	}
	b = append(appendRecordStart(append(b, '\n'), rec), ',')
	if b, err = appendTableNames(b, "table", name); err != nil {
		return b, fail(err)
	}
	b = appendTx(b, ch)
	if ch.New != nil {
		if b, err = appendValues(appendKey(b, "new"), rec, t, ch.New, true); err != nil {
			return b, err
		}
	}
	if ch.Old != nil {
		if b, err = appendValues(appendKey(b, "old"), rec, t, ch.Old, true); err != nil {
			return b, err
		}
	}
	b = appendUnchanged(b, "unchanged", t, ch.New)
	return appendUnchanged(b, "old_unchanged", t, ch.Old), nil
}

// ParseChange reads one change written by [AppendChange]: an insert, update
// or delete's table record and change record, or another change's record
// alone. The last newline may be missing. A row change's CommitTime is zero:
// in a stream, row changes take it from their begin record, which does not
// travel with them. The record is checked as the [Decoder] checks it; a
// problem is a [*DecodeError] naming the line (1 or 2), and anything but
// one change (no change record, a second one, a table record before a
// change that is not an insert, update or delete, a header, row or end
// record) wraps [ErrOrder].
func ParseChange(data []byte) (Change, error) {
	d := &Decoder{maxLine: DefaultMaxLineBytes, tables: make(map[string]map[string]*Table, 1),
		haveHeader: true, header: Header{Kind: KindChanges}}
	var (
		table *Table
		ch    *Change
	)
	for len(data) > 0 {
		line, rest, _ := bytes.Cut(data, []byte{'\n'})
		data = rest
		d.lineNo++
		d.sc.reset(line)
		typ, op, name, err := d.recordType()
		if err != nil {
			return Change{}, d.fail(err, "")
		}
		switch {
		case ch != nil:
			return Change{}, d.fail(fmt.Errorf("%w: a %s record after the change", ErrOrder, name), name)
		case typ == rtTable && table != nil:
			return Change{}, d.fail(fmt.Errorf("%w: a second table record", ErrOrder), name)
		case typ != rtTable && typ != rtChange:
			return Change{}, d.fail(fmt.Errorf("%w: a stream's %s record; a change travels as its table record and change record only", ErrOrder, name), name)
		case table != nil && op != OpInsert && op != OpUpdate && op != OpDelete:
			return Change{}, d.fail(fmt.Errorf("%w: a table record before a %s record", ErrOrder, name), name)
		}
		// The change stands inside the transaction it was taken from.
		d.inTx = op != OpBegin
		rec, err := d.record(line)
		if err != nil {
			return Change{}, err
		}
		if rec.Type == RecordTable {
			table = rec.Table
			continue
		}
		ch = rec.Change
	}
	if ch == nil {
		d.lineNo++
		return Change{}, d.fail(fmt.Errorf("%w: no change record", ErrOrder), "")
	}
	return *ch, nil
}
