package canonical

import "fmt"

// changeRecord decodes a begin, insert, update, delete, truncate, message,
// ddl or commit record.
func (d *Decoder) changeRecord(op Op) (Record, error) {
	var err error
	switch op {
	case OpBegin, OpCommit:
		err = d.scan(txFields, txRequired)
	case OpInsert, OpUpdate, OpDelete:
		err = d.scan(rowChangeFields, rowChangeRequired)
	case OpTruncate:
		err = d.scan(truncateFields, truncateRequired)
	case OpMessage:
		err = d.scan(messageFields, messageRequired)
	case OpDDL:
		err = d.scan(ddlFields, ddlRequired)
	}
	if err != nil {
		return Record{}, err
	}
	f := &d.f
	ch := &Change{Op: op, Position: f.position, XID: f.xid}
	rec := Record{Type: RecordChange, Change: ch}
	switch op {
	case OpBegin:
		if d.inTx {
			return Record{}, fmt.Errorf("%w: begin inside an open transaction", ErrOrder)
		}
		ch.CommitTime = f.commitTime
		d.inTx, d.txTime, d.txCommit = true, f.commitTime, f.position
	case OpCommit:
		if !d.inTx {
			return Record{}, fmt.Errorf("%w: commit without begin", ErrOrder)
		}
		if f.position <= d.txCommit {
			return Record{}, fmt.Errorf("%w: commit position %v is not after the commit LSN %v its begin announced", ErrInvalidRecord, f.position, d.txCommit)
		}
		ch.CommitTime = f.commitTime
		d.inTx = false
	case OpInsert, OpUpdate, OpDelete:
		if !d.inTx {
			return Record{}, fmt.Errorf("%w: %s outside a transaction (no begin)", ErrOrder, op)
		}
		if rec.Table, err = d.rowChange(ch); err != nil {
			return Record{}, err
		}
	case OpTruncate:
		if !d.inTx {
			return Record{}, fmt.Errorf("%w: truncate outside a transaction (no begin)", ErrOrder)
		}
		ch.Truncated, ch.Cascade, ch.RestartIdentity = f.tables, f.cascade, f.restartIdentity
		ch.CommitTime = d.txTime
	case OpMessage:
		if f.transactional && !d.inTx {
			return Record{}, fmt.Errorf("%w: transactional message outside a transaction", ErrOrder)
		}
		content, err := base64Std.AppendDecode(nil, f.content)
		if err != nil {
			return Record{}, fmt.Errorf("%w: content is not standard base64: %w", ErrInvalidRecord, err)
		}
		ch.Message = &Message{Transactional: f.transactional, Prefix: string(f.prefix), Content: content}
		if d.inTx {
			ch.CommitTime = d.txTime
		}
	case OpDDL:
		if !d.inTx {
			return Record{}, fmt.Errorf("%w: ddl outside a transaction (no begin)", ErrOrder)
		}
		if len(f.statement) == 0 && len(f.problem) == 0 {
			return Record{}, fmt.Errorf("%w: a ddl record without a statement or a problem", ErrInvalidRecord)
		}
		ch.DDL = &DDL{Tag: string(f.tag), Statement: string(f.statement), SearchPath: string(f.searchPath),
			Role: string(f.role), Problem: string(f.problem), Objects: f.objects,
			SessionRole: string(f.sessionRole), Superuser: f.superuser, Installer: string(f.installer)}
		ch.CommitTime = d.txTime
	}
	d.count++
	return rec, nil
}

// rowChange fills the table and rows of an insert, update or delete.
func (d *Decoder) rowChange(ch *Change) (*Table, error) {
	f := &d.f
	hasNew, hasOld := f.seen&fNew.bit() != 0, f.seen&fOld.bit() != 0
	var problem string
	switch {
	case (ch.Op == OpInsert || ch.Op == OpUpdate) && !hasNew:
		problem = "no new values"
	case ch.Op == OpInsert && hasOld:
		problem = "old values on an insert"
	case ch.Op == OpDelete && !hasOld:
		problem = "no old values"
	case ch.Op == OpDelete && hasNew:
		problem = "new values on a delete"
	case !hasNew && f.seen&fUnchanged.bit() != 0:
		problem = "unchanged without new values"
	case !hasOld && f.seen&fOldUnchanged.bit() != 0:
		problem = "old_unchanged without old values"
	}
	if problem != "" {
		return nil, fmt.Errorf("%w: %s", ErrInvalidRecord, problem)
	}
	what := "an insert" // constants: this runs for every row change
	switch ch.Op {
	case OpUpdate:
		what = "an update"
	case OpDelete:
		what = "a delete"
	}
	t, err := d.tableOf(what)
	if err != nil {
		return nil, err
	}
	n := len(t.Columns)
	if hasNew && len(d.newSpans) != n || hasOld && len(d.oldSpans) != n {
		which, got := fNew, len(d.newSpans)
		if !hasNew || got == n {
			which, got = fOld, len(d.oldSpans)
		}
		return nil, fmt.Errorf("%w: %s: %d values for the %d columns of %s", ErrInvalidRecord, which, got, n, t.TableName())
	}
	text := string(d.arena)
	if hasNew {
		ch.New = makeRow(d.newSpans, text)
		if err := d.markUnchanged(ch.New, d.unchanged, t, fUnchanged); err != nil {
			return nil, err
		}
	}
	if hasOld {
		ch.Old = makeRow(d.oldSpans, text)
		if err := d.markUnchanged(ch.Old, d.oldUnchanged, t, fOldUnchanged); err != nil {
			return nil, err
		}
	}
	ch.Schema, ch.Table, ch.Columns = t.Schema, t.Name, t.Columns
	ch.CommitTime = d.txTime
	return t, nil
}

// markUnchanged turns the listed columns' values into Unchanged.
func (d *Decoder) markUnchanged(row Row, names []span, t *Table, which field) error {
	for _, sp := range names {
		name := d.names[sp.start:sp.end]
		i := 0
		for i < len(t.Columns) && t.Columns[i].Name != string(name) {
			i++
		}
		switch {
		case i == len(t.Columns):
			return fmt.Errorf("%w: %s lists %q, not a column of %s", ErrInvalidRecord, which, truncateText(name), t.TableName())
		case row[i].IsUnchanged():
			return fmt.Errorf("%w: %s lists %q twice", ErrInvalidRecord, which, truncateText(name))
		case !row[i].IsNull():
			return fmt.Errorf("%w: %s lists %q, whose value is not null", ErrInvalidRecord, which, truncateText(name))
		}
		row[i] = Unchanged()
	}
	return nil
}
