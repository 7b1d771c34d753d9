package canonical

import (
	"fmt"
	"time"
)

// Op is the kind of a [Change].
type Op uint8

// The kinds of change. A transaction is delivered as OpBegin, its row changes
// (and transactional messages and schema changes), then OpCommit.
const (
	OpBegin Op = iota + 1
	OpInsert
	OpUpdate
	OpDelete
	OpTruncate
	OpMessage
	OpCommit
	// OpDDL is a schema change (Change.DDL), at its place among the row
	// changes of its transaction: the changes after it have the new shape.
	OpDDL
)

var opNames = [...]string{
	OpBegin:    "begin",
	OpInsert:   "insert",
	OpUpdate:   "update",
	OpDelete:   "delete",
	OpTruncate: "truncate",
	OpMessage:  "message",
	OpCommit:   "commit",
	OpDDL:      "ddl",
}

// String returns the op's lower-case name, as used in JSONL records.
func (o Op) String() string {
	if int(o) < len(opNames) && opNames[o] != "" {
		return opNames[o]
	}
	return fmt.Sprintf("Op(%d)", uint8(o))
}

// ParseOp returns the Op with the given name (see [Op.String]).
func ParseOp(name string) (Op, bool) {
	for op, n := range opNames {
		if n != "" && n == name {
			return Op(op), true
		}
	}
	return 0, false
}

// Change is one committed change from the source, in the order of the
// source's commits.
type Change struct {
	Op Op
	// Position on OpCommit is the transaction's end: the point to resume from
	// once the transaction is handled. On OpBegin, row changes and messages it
	// is the commit LSN the transaction's Begin announced.
	Position   Position
	XID        uint32
	CommitTime time.Time

	// Schema and Table name the changed table (row changes only).
	Schema string
	Table  string
	// Columns describes the table's columns as the source sent them with this
	// change; New and Old are in this order. Shared between changes: do not
	// modify.
	Columns []Column
	// New holds the new row of an insert or update.
	New Row
	// Old holds the old row of an update or delete: the identity key columns
	// (other columns NULL) or, under REPLICA IDENTITY FULL, every column. Nil
	// when the source sent no old values.
	Old Row

	// Truncated lists the tables an OpTruncate empties.
	Truncated []TableName
	// Cascade and RestartIdentity are the TRUNCATE options of an OpTruncate.
	Cascade, RestartIdentity bool

	// Message is the logical decoding message of an OpMessage.
	Message *Message

	// DDL is the schema change of an OpDDL.
	DDL *DDL
}

// Message is a logical decoding message (pg_logical_emit_message).
type Message struct {
	Transactional bool
	Prefix        string
	Content       []byte
}

// Unchanged returns the names of the columns whose unchanged TOAST values the
// source did not send with an update; they keep their current values.
func (c *Change) Unchanged() []string {
	var names []string
	for i, v := range c.New {
		if v.IsUnchanged() && i < len(c.Columns) {
			names = append(names, c.Columns[i].Name)
		}
	}
	return names
}

// Value returns the new value of the named column (the old one for a
// delete) and whether the column exists.
func (c *Change) Value(column string) (Value, bool) {
	row := c.New
	if c.Op == OpDelete {
		row = c.Old
	}
	for i := range c.Columns {
		if c.Columns[i].Name == column && i < len(row) {
			return row[i], true
		}
	}
	return Value{}, false
}

// TableName returns the changed table's schema and name.
func (c *Change) TableName() TableName { return TableName{Schema: c.Schema, Name: c.Table} }
