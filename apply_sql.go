package siphon

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/siphondb/siphon/canonical"
	"github.com/siphondb/siphon/internal/sqltext"
)

// The kinds of statement a row change becomes.
const (
	shapeInsert    = 'I' // INSERT (keyless target)
	shapeUpsert    = 'i' // INSERT ... ON CONFLICT (key) DO UPDATE
	shapeUpdate    = 'u' // UPDATE ... WHERE key
	shapeDelete    = 'd' // DELETE ... WHERE key
	shapeUpdateRow = 'U' // UPDATE one row matching every old value sent
	shapeDeleteRow = 'D' // DELETE one row matching every old value sent
)

// shape says which statement a row change needs: its kind, the source
// columns it writes (insert values, SET list) and those it matches (the
// key, or the old values). Changes of one shape share one statement.
type shape struct {
	kind  byte
	set   []int
	where []int
	// rows is the number of rows an insert statement takes at once.
	rows int
	// whereRow holds the values matched: the old row, or the new one for
	// an update whose key did not change.
	whereRow canonical.Row
	// key identifies the shape: kind, a flag per column (1 set, 2
	// matched), rows.
	key []byte
}

// statement is the SQL of one shape with its parameters' type OIDs.
type statement struct {
	sql  string
	oids []uint32
	// prepared is the statement prepared on an apply session; nil until
	// then (and always for ApplyChange, which uses unnamed statements).
	prepared *pgconn.StatementDescription
}

// planChange works out the shape of an insert, update or delete into sh,
// whose slices it reuses. ok is false for an update that changes nothing
// the target can see.
func planChange(b *binding, ch *canonical.Change, sh *shape) (ok bool, err error) {
	sh.set, sh.where, sh.whereRow = sh.set[:0], sh.where[:0], nil
	sh.rows = 1
	switch {
	case ch.Op == canonical.OpInsert:
		err = planInserts(b, []canonical.Row{ch.New}, sh)
	case b.key != nil:
		err = planByKey(b, ch, sh)
	default:
		err = planByOldRow(b, ch, sh)
	}
	if err != nil {
		return false, err
	}
	if ch.Op == canonical.OpUpdate && len(sh.set) == 0 {
		return false, nil
	}
	sh.key = sh.appendKey(sh.key[:0], len(b.cols))
	return true, nil
}

// planInserts plans one statement inserting rows (an upsert when the
// target has a key).
func planInserts(b *binding, rows []canonical.Row, sh *shape) error {
	sh.kind, sh.set, sh.where, sh.whereRow, sh.rows = shapeUpsert, sh.set[:0], sh.where[:0], nil, len(rows)
	if b.key == nil {
		sh.kind = shapeInsert
	}
	for _, row := range rows {
		for i, v := range row {
			if v.IsUnchanged() {
				return fmt.Errorf("column %q: an insert cannot hold an unchanged TOAST value", b.srcCols[i].Name)
			}
		}
	}
	for i := range b.cols {
		sh.set = append(sh.set, i)
	}
	sh.key = sh.appendKey(sh.key[:0], len(b.cols))
	return nil
}

// rowChunks are the numbers of rows statements of many rows take at once,
// at most: a run of inserts, updates or deletes is queued in statements of
// these sizes, so that few shapes are prepared.
var rowChunks = []int{500, 50, 10, 1}

// chunkRows returns the number of rows the next statement of a run takes:
// the largest of rowChunks that is at most most and left.
func chunkRows(most, left int) int {
	for _, size := range rowChunks {
		if size <= most && size <= left {
			return size
		}
	}
	return 1
}

// maxInsertRows returns the largest number of rows one insert statement of
// b takes.
func (b *binding) maxInsertRows() int { return maxStatementRows(len(b.cols)) }

// maxStatementRows returns the largest number of rows one statement of many
// rows takes, given the parameters of a row (PostgreSQL allows 65535).
func maxStatementRows(perRow int) int {
	return max(1, min(rowChunks[0], 65535/max(1, perRow)))
}

// planByKey plans an update or delete of the row with the target's key.
func planByKey(b *binding, ch *canonical.Change, sh *shape) error {
	sh.whereRow = ch.Old
	if sh.whereRow == nil {
		sh.whereRow = ch.New // the key did not change
	}
	for _, k := range b.key {
		if _, present := sh.whereRow[k].Text(); !present {
			return &SchemaIncompatibleError{Table: b.source, Column: b.srcCols[k].Name,
				Problem: "the source sent no value for this column of the target's key: the source's replica identity must cover the target's primary key (or replica identity index)"}
		}
	}
	sh.where = append(sh.where, b.key...)
	if ch.Op == canonical.OpDelete {
		sh.kind = shapeDelete
		return nil
	}
	sh.kind = shapeUpdate
	return b.planSet(ch, sh)
}

// planSet lists in sh.set the columns an update writes: those the source
// sent, but a key column that kept its value (writing the same value would
// fail for a GENERATED ALWAYS identity key) and a GENERATED ALWAYS
// identity column outside the key (see keepIdentity).
func (b *binding) planSet(ch *canonical.Change, sh *shape) error {
	for i, v := range ch.New {
		switch {
		case v.IsUnchanged():
		case b.isKey[i] && v == sh.whereRow[i]:
		case b.cols[i].identityAlways:
			if err := b.keepIdentity(i, ch); err != nil {
				return err
			}
		default:
			sh.set = append(sh.set, i)
		}
	}
	return nil
}

// keepIdentity checks that an update leaves column i, a GENERATED ALWAYS
// identity column of the target that is not part of its key, as it was:
// an UPDATE may set such a column only to DEFAULT, so apply leaves it out
// and the row keeps the value it was inserted with, as it does on the
// source unless the source set it to DEFAULT. That change, which the old
// values of REPLICA IDENTITY FULL show, is refused; without them it cannot
// be seen (see ConsumeCanonical).
func (b *binding) keepIdentity(i int, ch *canonical.Change) error {
	if ch.Old == nil || ch.Old[i] == ch.New[i] {
		return nil
	}
	if _, sent := ch.Old[i].Text(); !sent { // an identity is never NULL
		return nil
	}
	return &SchemaIncompatibleError{Table: b.source, Column: b.srcCols[i].Name,
		Problem: "the source changed the value of a column that is GENERATED ALWAYS AS IDENTITY in the target, which an UPDATE can set only to DEFAULT: make the target's column GENERATED BY DEFAULT"}
}

// planByOldRow plans an update or delete of one row of a keyless target
// that matches every old value the source sent.
func planByOldRow(b *binding, ch *canonical.Change, sh *shape) error {
	problem := ""
	switch {
	case ch.Old == nil:
		problem = "the target table has no primary key or replica identity index, and the source sent no old values to find the row by: set REPLICA IDENTITY FULL on the source table, or give both tables a key"
	case b.identity != "" && b.identity != canonical.IdentityFull:
		problem = fmt.Sprintf("the target table has no primary key or replica identity index, and the source's replica identity is %s, not full: set REPLICA IDENTITY FULL on the source table, or give the target the source's key", b.identity)
	}
	if problem != "" {
		return &SchemaIncompatibleError{Table: b.source, Problem: problem}
	}
	sh.whereRow = ch.Old
	for i, v := range ch.Old {
		if !v.IsUnchanged() {
			sh.where = append(sh.where, i)
		}
	}
	if len(sh.where) == 0 {
		return errors.New("every old value is an unchanged TOAST value: there is nothing to find the row by")
	}
	if ch.Op == canonical.OpDelete {
		sh.kind = shapeDeleteRow
		return nil
	}
	sh.kind = shapeUpdateRow
	return b.planSet(ch, sh) // a keyless table: no key column to skip
}

// appendKey appends the shape's cache key to buf.
func (sh *shape) appendKey(buf []byte, n int) []byte {
	buf = append(buf, sh.kind)
	start := len(buf)
	for range n {
		buf = append(buf, 0)
	}
	for _, i := range sh.set {
		buf[start+i] |= 1
	}
	for _, i := range sh.where {
		buf[start+i] |= 2
	}
	return append(buf, byte(sh.rows>>8), byte(sh.rows))
}

// statement returns the statement of shape sh, built once per binding.
func (b *binding) statement(sh *shape) *statement {
	if st := b.shapes[string(sh.key)]; st != nil {
		return st
	}
	st := &statement{sql: b.buildSQL(sh)}
	for range max(sh.rows, 1) {
		for _, i := range sh.set {
			st.oids = append(st.oids, b.cols[i].typeOID)
		}
		for _, i := range sh.where {
			st.oids = append(st.oids, b.cols[i].typeOID)
		}
	}
	b.shapes[string(sh.key)] = st
	return st
}

// buildSQL writes the statement of a shape. Parameters come in the order
// of sh.set, then sh.where, for each row.
func (b *binding) buildSQL(sh *shape) string {
	if (sh.kind == shapeUpdate || sh.kind == shapeDelete) && sh.rows > 1 {
		return b.keyedRunSQL(sh)
	}
	var s strings.Builder
	n := 0
	param := func() string { n++; return "$" + strconv.Itoa(n) }
	switch sh.kind {
	case shapeInsert, shapeUpsert:
		s.WriteString("INSERT INTO " + b.quoted + " (" + b.columnList(sh.set) + ") OVERRIDING SYSTEM VALUE VALUES ")
		for r := range max(sh.rows, 1) {
			if r > 0 {
				s.WriteString(", ")
			}
			s.WriteString("(")
			for i := range sh.set {
				if i > 0 {
					s.WriteString(", ")
				}
				s.WriteString(param())
			}
			s.WriteString(")")
		}
		if sh.kind == shapeUpsert {
			s.WriteString(b.onConflict(sh.set))
		}
	case shapeUpdate, shapeUpdateRow:
		s.WriteString("UPDATE " + b.quoted + " SET ")
		for i, c := range sh.set {
			if i > 0 {
				s.WriteString(", ")
			}
			s.WriteString(b.cols[c].quoted + " = " + param())
		}
	case shapeDelete, shapeDeleteRow:
		s.WriteString("DELETE FROM " + b.quoted)
	}
	switch sh.kind {
	case shapeUpdate, shapeDelete:
		s.WriteString(" WHERE ")
		for i, c := range sh.where {
			if i > 0 {
				s.WriteString(" AND ")
			}
			s.WriteString(b.cols[c].quoted + " " + b.cols[c].eq + " " + param())
		}
	case shapeUpdateRow, shapeDeleteRow:
		s.WriteString(b.oneRowWhere(sh.where, param))
	}
	return s.String()
}

// oneRowWhere matches one row whose columns equal the old values exactly
// (NULL matching NULL): with the type's = where equal values print the
// same, else by their text (same cast on both sides, under the same
// session settings). The operator is named (see targetColumn.eq), which
// IS NOT DISTINCT FROM cannot do.
func (b *binding) oneRowWhere(where []int, param func() string) string {
	row := "ctid"
	if b.target.partitioned {
		row = "(tableoid, ctid)" // ctids repeat across partitions
	}
	var s strings.Builder
	s.WriteString(" WHERE " + row + " = (SELECT " + row + " FROM " + b.quoted + " WHERE ")
	for i, c := range where {
		if i > 0 {
			s.WriteString(" AND ")
		}
		col, p := b.cols[c], param()
		if col.exact {
			s.WriteString("(" + col.quoted + " " + col.eq + " " + p)
		} else {
			s.WriteString("(" + col.quoted + "::text OPERATOR(pg_catalog.=) " + p + "::text")
		}
		s.WriteString(" OR " + col.quoted + " IS NULL AND " + p + " IS NULL)")
	}
	s.WriteString(" LIMIT 1)")
	return s.String()
}

// columnList returns the quoted names of the source columns idx.
func (b *binding) columnList(idx []int) string {
	var s strings.Builder
	for i, c := range idx {
		if i > 0 {
			s.WriteString(", ")
		}
		s.WriteString(b.cols[c].quoted)
	}
	return s.String()
}

// onConflict is the upsert clause for inserts of the columns set: the
// target's key decides, the other columns take the new values.
func (b *binding) onConflict(set []int) string {
	var s strings.Builder
	s.WriteString(" ON CONFLICT (" + b.columnList(b.key) + ") DO ")
	first := true
	for _, c := range set {
		if b.isKey[c] || b.cols[c].identityAlways { // see keepIdentity
			continue
		}
		if first {
			s.WriteString("UPDATE SET ")
			first = false
		} else {
			s.WriteString(", ")
		}
		s.WriteString(b.cols[c].quoted + " = EXCLUDED." + b.cols[c].quoted)
	}
	if first {
		s.WriteString("NOTHING")
	}
	return s.String()
}

// truncateSQL empties the tables: ONLY the listed ones (the source lists
// every table it truncated), but a partitioned table with its partitions;
// parents are partitioned tables all of whose partitions are listed (see
// truncatedParents).
func truncateSQL(tables []*targetTable, parents []canonical.TableName, restartIdentity bool) string {
	var s strings.Builder
	s.WriteString("TRUNCATE ")
	for i, t := range tables {
		if i > 0 {
			s.WriteString(", ")
		}
		if !t.partitioned {
			s.WriteString("ONLY ")
		}
		s.WriteString(sqltext.Name(t.name.Schema, t.name.Name))
	}
	for _, p := range parents {
		s.WriteString(", " + sqltext.Name(p.Schema, p.Name))
	}
	if restartIdentity {
		s.WriteString(" RESTART IDENTITY")
	}
	return s.String()
}

// paramList holds the text parameters of one statement. Values are copied
// into one buffer; NULL is a nil slice.
type paramList struct {
	buf    []byte
	values [][]byte
}

func (p *paramList) reset() {
	p.buf, p.values = p.buf[:0], p.values[:0]
}

func (p *paramList) add(v canonical.Value) {
	s, present := v.Text()
	if !present {
		p.values = append(p.values, nil)
		return
	}
	if p.buf == nil {
		p.buf = make([]byte, 0, 256)
	}
	start := len(p.buf)
	p.buf = append(p.buf, s...)
	p.values = append(p.values, p.buf[start:len(p.buf):len(p.buf)])
}

// addRows adds the parameters of an insert of rows.
func (p *paramList) addRows(rows []canonical.Row) {
	for _, row := range rows {
		for _, v := range row {
			p.add(v)
		}
	}
}

// addChange adds the parameters of a change of shape sh.
func (p *paramList) addChange(sh *shape, ch *canonical.Change) {
	p.addValues(sh.set, ch.New)
	p.addValues(sh.where, sh.whereRow)
}

// addValues adds the values of row's columns idx.
func (p *paramList) addValues(idx []int, row canonical.Row) {
	for _, i := range idx {
		p.add(row[i])
	}
}
