package canonical

import (
	"fmt"
	"slices"
)

// WriteChange writes a change record. Begin, commit, truncate, message and
// ddl records need no table record. For an insert, update or delete, WriteChange
// first writes a table record when ch.Columns differ from the latest one
// written for ch's table (like pgoutput's Relation message), keeping that
// record's keys and replica identity; nil ch.Columns means "the latest table
// record's columns", which must then exist.
//
// Row changes, truncates, schema changes and transactional messages must
// come between a begin and its commit; non-transactional messages may come anywhere. Values
// that are [Unchanged] are written as null and listed by column name in
// "unchanged" ("old_unchanged" for ch.Old). ch.CommitTime is written on begin
// and commit only: the Decoder gives a transaction's changes the commit time
// of its begin.
func (e *Encoder) WriteChange(ch *Change) error {
	if ch == nil {
		return &EncodeError{Record: "change", Err: fmt.Errorf("%w: nil change", ErrInvalidRecord)}
	}
	rec := ch.Op.String()
	if _, ok := ParseOp(rec); !ok {
		return &EncodeError{Record: "change", Err: fmt.Errorf("%w: unknown op %v", ErrInvalidRecord, ch.Op)}
	}
	if err := e.begin(rec, true); err != nil {
		return err
	}
	if e.kind.holdsRows() {
		return &EncodeError{Record: rec, Err: fmt.Errorf("%w: a %s stream holds rows, not changes", ErrOrder, e.kind)}
	}
	if err := e.checkTx(ch, rec); err != nil {
		return err
	}
	var (
		pending *encTable // a table record to write first, in e.tbuf
		err     error
	)
	switch ch.Op {
	case OpBegin, OpCommit:
		err = e.writeTxRecord(ch, rec)
	case OpInsert, OpUpdate, OpDelete:
		pending, err = e.writeRowChange(ch, rec)
	case OpTruncate:
		err = e.writeTruncate(ch, rec)
	case OpMessage:
		err = e.writeMessage(ch, rec)
	case OpDDL:
		err = e.writeDDL(ch, rec)
	}
	if err != nil {
		return err
	}
	if pending != nil {
		e.tbuf = append(e.tbuf, '\n')
		if err := e.write(e.tbuf); err != nil {
			return err
		}
		e.register(pending)
	}
	emit := e.emit
	// In an authenticated stream a schema change is a checkpoint, so that
	// a reader verifies it before running it.
	if ch.Op == OpCommit || ch.Op == OpMessage && !e.inTx || ch.Op == OpDDL && e.mac != nil {
		emit = e.emitChecked
	}
	if err := emit(); err != nil {
		return err
	}
	e.count++
	switch ch.Op {
	case OpBegin:
		e.inTx = true
	case OpCommit:
		e.inTx = false
	}
	return nil
}

// checkTx checks that ch fits the transaction structure.
func (e *Encoder) checkTx(ch *Change, rec string) error {
	var problem string
	switch ch.Op {
	case OpBegin:
		if e.inTx {
			problem = "begin inside an open transaction"
		}
	case OpMessage:
		if ch.Message != nil && ch.Message.Transactional && !e.inTx {
			problem = "transactional message outside a transaction"
		}
	default:
		if !e.inTx {
			problem = rec + " outside a transaction (no begin)"
		}
	}
	if problem == "" {
		return nil
	}
	return &EncodeError{Record: rec, Table: ch.TableName(), Err: fmt.Errorf("%w: %s", ErrOrder, problem)}
}

// appendTx appends the xid and position every change record carries.
func appendTx(b []byte, ch *Change) []byte {
	b = appendUint(appendKey(b, "xid"), uint64(ch.XID))
	return appendQuotedPosition(appendKey(b, "position"), ch.Position)
}

func (e *Encoder) writeTxRecord(ch *Change, rec string) error {
	if !timeEncodable(ch.CommitTime) {
		return &EncodeError{Record: rec, Err: fmt.Errorf("%w: commit time %v: year outside 0-9999", ErrInvalidRecord, ch.CommitTime)}
	}
	b := appendTx(e.buf, ch)
	b = appendTime(appendKey(b, "commit_time"), ch.CommitTime)
	e.buf = append(b, '}')
	return nil
}

// writeRowChange builds an insert, update or delete record in e.buf. When
// the change needs a new table record, it builds it in e.tbuf and returns
// its state, to be written and registered first.
func (e *Encoder) writeRowChange(ch *Change, rec string) (*encTable, error) {
	name := ch.TableName()
	fail := func(err error) error { return &EncodeError{Record: rec, Table: name, Err: err} }
	switch {
	case (ch.Op == OpInsert || ch.Op == OpUpdate) && ch.New == nil:
		return nil, fail(fmt.Errorf("%w: %s without new values", ErrInvalidRecord, rec))
	case ch.Op == OpDelete && ch.Old == nil:
		return nil, fail(fmt.Errorf("%w: delete without old values", ErrInvalidRecord))
	case ch.Op == OpInsert && ch.Old != nil:
		return nil, fail(fmt.Errorf("%w: insert with old values", ErrInvalidRecord))
	case ch.Op == OpDelete && ch.New != nil:
		return nil, fail(fmt.Errorf("%w: delete with new values", ErrInvalidRecord))
	}
	et, pending, err := e.changeTable(ch, rec)
	if err != nil {
		return nil, err
	}
	n := len(et.t.Columns)
	if ch.New != nil && len(ch.New) != n || ch.Old != nil && len(ch.Old) != n {
		return nil, fail(fmt.Errorf("%w: %d new and %d old values for %d columns", ErrInvalidRecord, len(ch.New), len(ch.Old), n))
	}
	b := append(append(e.buf, ','), et.names...)
	b = appendTx(b, ch)
	if ch.New != nil {
		if b, err = appendValues(appendKey(b, "new"), rec, et.t, ch.New, true); err != nil {
			return nil, err
		}
	}
	if ch.Old != nil {
		if b, err = appendValues(appendKey(b, "old"), rec, et.t, ch.Old, true); err != nil {
			return nil, err
		}
	}
	b = appendUnchanged(b, "unchanged", et.t, ch.New)
	b = appendUnchanged(b, "old_unchanged", et.t, ch.Old)
	e.buf = append(b, '}')
	if pending {
		return et, nil
	}
	return nil, nil
}

// appendUnchanged appends the names of row's unchanged columns, if any.
func appendUnchanged(b []byte, key string, t *Table, row Row) []byte {
	first := true
	for i, v := range row {
		if !v.IsUnchanged() {
			continue
		}
		if first {
			b = append(appendKey(b, key), '[')
			first = false
		} else {
			b = append(b, ',')
		}
		// Column names were checked when the table record was written.
		b, _ = appendString(b, t.Columns[i].Name)
	}
	if !first {
		b = append(b, ']')
	}
	return b
}

// changeTable returns the table record a row change is aligned with. When
// ch.Columns differ from the latest, it builds a new table record in e.tbuf
// and says so with pending.
func (e *Encoder) changeTable(ch *Change, rec string) (et *encTable, pending bool, err error) {
	name := ch.TableName()
	et = e.table(name)
	if ch.Columns == nil || et != nil && slices.Equal(ch.Columns, et.t.Columns) {
		if et == nil {
			return nil, false, &EncodeError{Record: rec, Table: name,
				Err: fmt.Errorf("%w: the change has no columns and no table record was written", ErrUnknownTable)}
		}
		return et, false, nil
	}
	t := &Table{Schema: name.Schema, Name: name.Name}
	if et != nil {
		t = cloneTable(et.t)
		t.PrimaryKey = keepKey(t.PrimaryKey, ch.Columns)
		t.IdentityKey = keepKey(t.IdentityKey, ch.Columns)
	}
	t.Columns = slices.Clone(ch.Columns)
	if e.tbuf, err = appendTable(e.tbuf[:0], t); err != nil {
		if ee, ok := err.(*EncodeError); ok {
			ee.Record = rec
			ee.Err = fmt.Errorf("its table record: %w", ee.Err)
		}
		return nil, false, err
	}
	return newEncTable(t), true, nil
}

// keepKey returns key when all its columns are among cols, nil otherwise (a
// key loses its constraint or index when one of its columns is dropped).
func keepKey(key []string, cols []Column) []string {
	for _, k := range key {
		if !slices.ContainsFunc(cols, func(c Column) bool { return c.Name == k }) {
			return nil
		}
	}
	return key
}

func (e *Encoder) writeTruncate(ch *Change, rec string) error {
	b := appendTx(e.buf, ch)
	b = append(appendKey(b, "tables"), '[')
	for i, n := range ch.Truncated {
		if i > 0 {
			b = append(b, ',')
		}
		var err error
		if b, err = appendTableNames(append(b, '{'), "name", n); err != nil {
			return &EncodeError{Record: rec, Table: n, Err: err}
		}
		b = append(b, '}')
	}
	b = append(b, ']')
	b = appendBool(appendKey(b, "cascade"), ch.Cascade)
	b = appendBool(appendKey(b, "restart_identity"), ch.RestartIdentity)
	e.buf = append(b, '}')
	return nil
}

func (e *Encoder) writeMessage(ch *Change, rec string) error {
	b, err := appendMessage(e.buf, ch, rec)
	if err != nil {
		return err
	}
	e.buf = append(b, '}')
	return nil
}

// appendMessage appends the members of a message record after its "t".
func appendMessage(b []byte, ch *Change, rec string) ([]byte, error) {
	m := ch.Message
	if m == nil {
		return b, &EncodeError{Record: rec, Err: fmt.Errorf("%w: message change without a Message", ErrInvalidRecord)}
	}
	b = appendTx(b, ch)
	b = appendBool(appendKey(b, "transactional"), m.Transactional)
	var bad int
	if b, bad = appendString(appendKey(b, "prefix"), m.Prefix); bad >= 0 {
		return b, &EncodeError{Record: rec, Err: fmt.Errorf("prefix: %w", utf8Error(bad))}
	}
	b = append(appendKey(b, "content"), '"')
	return append(base64Std.AppendEncode(b, m.Content), '"'), nil
}

func (e *Encoder) writeDDL(ch *Change, rec string) error {
	b, err := appendDDL(e.buf, ch, rec)
	if err != nil {
		return err
	}
	e.buf = append(b, '}')
	return nil
}

// appendDDL appends the members of a ddl record after its "t".
func appendDDL(b []byte, ch *Change, rec string) ([]byte, error) {
	d := ch.DDL
	if d == nil || d.Statement == "" && d.Problem == "" {
		return b, &EncodeError{Record: rec, Err: fmt.Errorf("%w: a ddl change without a statement or a problem", ErrInvalidRecord)}
	}
	fail := func(what string, bad int) error {
		return &EncodeError{Record: rec, Err: fmt.Errorf("%s: %w", what, utf8Error(bad))}
	}
	b = appendTx(b, ch)
	var bad int
	for _, m := range [...]struct{ key, val string }{{"tag", d.Tag}, {"statement", d.Statement}, {"search_path", d.SearchPath}} {
		if b, bad = appendString(appendKey(b, m.key), m.val); bad >= 0 {
			return b, fail(m.key, bad)
		}
	}
	for _, m := range [...]struct{ key, val string }{{"role", d.Role}, {"problem", d.Problem}, {"session_role", d.SessionRole}, {"installer", d.Installer}} {
		var err error
		if b, err = appendOptString(b, m.key, m.val); err != nil {
			return b, &EncodeError{Record: rec, Err: fmt.Errorf("%s: %w", m.key, err)}
		}
	}
	if d.Superuser {
		b = appendBool(appendKey(b, "superuser"), true)
	}
	if len(d.Objects) == 0 {
		return b, nil
	}
	b = append(appendKey(b, "objects"), '[')
	for i, o := range d.Objects {
		if i > 0 {
			b = append(b, ',')
		}
		if b, bad = appendString(append(b, `{"type":`...), o.Type); bad >= 0 {
			return b, fail("objects: type", bad)
		}
		if b, bad = appendString(appendKey(b, "identity"), o.Identity); bad >= 0 {
			return b, fail("objects: identity", bad)
		}
		if o.Dropped {
			b = appendBool(appendKey(b, "dropped"), true)
		}
		b = append(b, '}')
	}
	return append(b, ']'), nil
}
