package canonical

import "fmt"

// RecordType says what a [Record] returned by [Decoder.Next] holds.
type RecordType uint8

// The record types [Decoder.Next] returns. (The header is read by
// [Decoder.Header], not returned as a Record.)
const (
	// RecordTable is a table description: Record.Table holds it. The rows
	// and changes of that table that follow are aligned with its columns.
	RecordTable RecordType = iota + 1
	// RecordRow is a snapshot row: Record.Table is its table, Record.Row its
	// values in the order of Record.Table.Columns.
	RecordRow
	// RecordChange is a change: Record.Change holds it (its Op says which).
	// For inserts, updates and deletes Record.Table is the changed table.
	RecordChange
	// RecordEnd is the end record, the last of a complete stream:
	// Record.Position is where the stream ends, Record.Count how many
	// records came between header and end.
	RecordEnd
	// RecordSequence is the state of a source sequence: Record.Sequence
	// holds it. It comes outside transactions, in snapshots and change
	// streams alike.
	RecordSequence
)

var recordTypeNames = [...]string{
	RecordTable:    "table",
	RecordRow:      "row",
	RecordChange:   "change",
	RecordEnd:      "end",
	RecordSequence: "sequence",
}

// String returns the record type's name.
func (t RecordType) String() string {
	if int(t) < len(recordTypeNames) && recordTypeNames[t] != "" {
		return recordTypeNames[t]
	}
	return fmt.Sprintf("RecordType(%d)", uint8(t))
}

// Record is one record of a JSONL stream, as [Decoder.Next] returns it. Only
// the fields of its Type are set. A Record and what it points to are not
// reused by the Decoder: callers may keep them. Tables and columns are
// shared between records: do not modify them.
type Record struct {
	Type RecordType
	// Table is the table of a RecordTable, RecordRow or row RecordChange
	// (insert, update, delete): the latest table record for it.
	Table *Table
	// Row holds a RecordRow's values, aligned with Table.Columns.
	Row Row
	// Change holds a RecordChange. Its Columns are the table record's
	// columns, and row changes get the CommitTime of their transaction's
	// begin record.
	Change *Change
	// Position is the end Position of a RecordEnd: the point to resume from.
	Position Position
	// Count is the number of records between header and end of a
	// RecordEnd (the Decoder has checked it).
	Count uint64
	// Sequence holds a RecordSequence.
	Sequence *Sequence
}

// TableName returns the name of the record's table; zero when it has none.
func (r *Record) TableName() TableName {
	if r.Table == nil {
		return TableName{}
	}
	return r.Table.TableName()
}
