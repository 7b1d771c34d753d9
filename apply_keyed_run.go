package siphon

import (
	"context"
	"strconv"
	"strings"

	"github.com/siphondb/siphon/canonical"
)

// keyedRun is a run of updates, or of deletes, of one table's rows found
// by the target's key, all of one shape, not queued yet. It is queued as
// statements that each change many rows (UPDATE ... FROM (VALUES ...),
// DELETE ... USING (VALUES ...)): the target's backend then starts one
// executor for many rows instead of one for each.
//
// A statement must not match a target row twice: UPDATE ... FROM would
// apply only one of two updates of the row, whichever it met first. So a
// run of updates ends before a key it holds already, and holds only
// updates of tables whose key values are equal exactly when their text is
// (see binding.exactKey).
type keyedRun struct {
	b     *binding
	shape shape // of every change of the run, one row each
	rows  []keyedRow
	// keys holds the key of every row an update of the run changes, as
	// text (the values of a key of many columns joined by NUL, which no
	// text holds).
	keys map[string]struct{}
	buf  []byte
	// chunk is the shape of the statement being queued.
	chunk shape
}

// keyedRow is what one change of a keyedRun writes and matches.
type keyedRow struct {
	new, where canonical.Row
}

// joinsRun reports whether changes of shape sh, planned for b, may be
// queued in a keyedRun: updates or deletes by key of a plain table
// (partitions are left to a single-row statement's pruning), updates that
// change no key column.
func (b *binding) joinsRun(sh *shape) bool {
	if b.target.partitioned {
		return false
	}
	switch sh.kind {
	case shapeDelete:
		return true
	case shapeUpdate:
		if !b.exactKey {
			return false
		}
		for _, i := range sh.set {
			if b.isKey[i] {
				return false
			}
		}
		return true
	}
	return false
}

// maxRunRows returns the largest number of rows one statement of a run of
// shape sh takes.
func maxRunRows(sh *shape) int { return maxStatementRows(len(sh.set) + len(sh.where)) }

// queueKeyed adds the change planned in cc.sh to the run of updates or
// deletes by key, first queueing the run it cannot join.
func (cc *changeConsumer) queueKeyed(ctx context.Context, b *binding, ch *canonical.Change) error {
	r := &cc.keyed
	if len(r.rows) > 0 && (r.b != b || string(r.shape.key) != string(cc.sh.key)) {
		if err := cc.flushKeyed(ctx); err != nil {
			return err
		}
	}
	if cc.sh.kind == shapeUpdate {
		key := r.keyText(b, cc.sh.whereRow)
		if _, twice := r.keys[key]; twice {
			if err := cc.flushKeyed(ctx); err != nil {
				return err
			}
		}
		if r.keys == nil {
			r.keys = map[string]struct{}{}
		}
		r.keys[key] = struct{}{}
	}
	if len(r.rows) == 0 {
		r.b = b
		r.shape.kind, r.shape.rows = cc.sh.kind, 1
		r.shape.set = append(r.shape.set[:0], cc.sh.set...)
		r.shape.where = append(r.shape.where[:0], cc.sh.where...)
		r.shape.key = append(r.shape.key[:0], cc.sh.key...)
	}
	r.rows = append(r.rows, keyedRow{new: ch.New, where: cc.sh.whereRow})
	if len(r.rows) >= maxRunRows(&r.shape) {
		return cc.flushKeyed(ctx)
	}
	return nil
}

// reset empties the run.
func (r *keyedRun) reset() {
	r.rows, r.b = r.rows[:0], nil
	clear(r.keys)
}

// keyText returns the text of the key of row.
func (r *keyedRun) keyText(b *binding, row canonical.Row) string {
	if len(b.key) == 1 {
		text, _ := row[b.key[0]].Text()
		return text
	}
	r.buf = r.buf[:0]
	for n, k := range b.key {
		if n > 0 {
			r.buf = append(r.buf, 0)
		}
		text, _ := row[k].Text()
		r.buf = append(r.buf, text...)
	}
	return string(r.buf)
}

// flushKeyed queues the run of updates or deletes by key, many rows a
// statement.
func (cc *changeConsumer) flushKeyed(ctx context.Context) error {
	r := &cc.keyed
	rows, b := r.rows, r.b
	if len(rows) == 0 {
		return nil
	}
	defer r.reset()
	op := canonical.OpUpdate
	if r.shape.kind == shapeDelete {
		op = canonical.OpDelete
	}
	most := maxRunRows(&r.shape)
	for len(rows) > 0 {
		n := chunkRows(most, len(rows))
		sh := &r.chunk
		sh.kind, sh.rows = r.shape.kind, n
		sh.set = append(sh.set[:0], r.shape.set...)
		sh.where = append(sh.where[:0], r.shape.where...)
		sh.key = sh.appendKey(sh.key[:0], len(b.cols))
		for _, row := range rows[:n] {
			cc.s.q.params.addValues(sh.set, row.new)
			cc.s.q.params.addValues(sh.where, row.where)
		}
		if err := cc.queueStatement(ctx, b, sh, op); err != nil {
			return err
		}
		rows = rows[n:]
	}
	return nil
}

// keyedRunSQL writes the statement of shape sh, sh.rows > 1 updates or
// deletes by key: the rows' values, those set then those matched, in a
// VALUES list joined to the table by its key.
func (b *binding) keyedRunSQL(sh *shape) string {
	var s strings.Builder
	if sh.kind == shapeUpdate {
		s.WriteString("UPDATE " + b.quoted + " AS t SET ")
		for i, c := range sh.set {
			if i > 0 {
				s.WriteString(", ")
			}
			s.WriteString(b.cols[c].quoted + " = v.s" + strconv.Itoa(i))
		}
		s.WriteString(" FROM (VALUES ")
	} else {
		s.WriteString("DELETE FROM " + b.quoted + " AS t USING (VALUES ")
	}
	n := 0
	for r := range sh.rows {
		if r > 0 {
			s.WriteString(", ")
		}
		s.WriteString("(")
		for i := range len(sh.set) + len(sh.where) {
			if i > 0 {
				s.WriteString(", ")
			}
			n++
			s.WriteString("$" + strconv.Itoa(n))
		}
		s.WriteString(")")
	}
	s.WriteString(") AS v(")
	for i := range sh.set {
		s.WriteString("s" + strconv.Itoa(i) + ", ")
	}
	for i := range sh.where {
		if i > 0 {
			s.WriteString(", ")
		}
		s.WriteString("w" + strconv.Itoa(i))
	}
	s.WriteString(") WHERE ")
	for i, c := range sh.where {
		if i > 0 {
			s.WriteString(" AND ")
		}
		s.WriteString("t." + b.cols[c].quoted + " " + b.cols[c].eq + " v.w" + strconv.Itoa(i))
	}
	return s.String()
}
