package canonical

import (
	"fmt"
	"slices"
)

// SnapshotChanges delivers the rows of a snapshot to a handler of the
// change stream, as changes, so that one handler takes both: the snapshot
// arrives as one transaction that commits at the snapshot's Position, the
// point the change stream continues from. [SnapshotChanges.Row] has the
// shape of Snapshot.CopyTables' RowFunc:
//
//	sc := canonical.NewSnapshotChanges(snap.Position(), handler.Handle)
//	err := snap.CopyTables(ctx, schema, siphon.CopyOptions{}, sc.Row)
//	... err = sc.Commit()
//	... c.StreamChanges(ctx, snap.Position(), handler.Handle)
//
// The handler receives an [OpBegin], then one [OpInsert] per row (New
// holding the row, Columns its table's columns), then an [OpCommit] from
// [SnapshotChanges.Commit]. Every one of them has the snapshot's Position
// and XID zero, which no PostgreSQL transaction has: a handler that must
// tell snapshot rows from inserts (Debezium's "read" events) tests
// ch.XID == 0. CommitTime is zero: a snapshot has no commit time. A
// handler that stores the Position of each OpCommit it handled thus stores
// the snapshot's Position once every row is handled, and resumes the
// change stream from it with no gap and no duplicate.
//
// A handler that holds a transaction's changes until its commit would hold
// the whole snapshot: such a handler should act on the rows as they come.
// [Replay] delivers a recorded snapshot stream the same way.
type SnapshotChanges struct {
	at    Position
	emit  func(Change) error
	begun bool
	done  bool
}

// NewSnapshotChanges returns a SnapshotChanges that delivers to emit the
// rows of the snapshot at Position at.
func NewSnapshotChanges(at Position, emit func(Change) error) *SnapshotChanges {
	return &SnapshotChanges{at: at, emit: emit}
}

// Row delivers one row of table as an OpInsert, after the OpBegin when it
// is the first. It keeps a copy of row, not row itself, which the caller
// may reuse. The handler's error is returned wrapped, naming the Position.
func (s *SnapshotChanges) Row(table *Table, row Row) error {
	if err := s.row(table, slices.Clone(row)); err != nil {
		return fmt.Errorf("canonical: snapshot changes: %w", err)
	}
	return nil
}

// row delivers row, which the handler may keep.
func (s *SnapshotChanges) row(table *Table, row Row) error {
	if s.done {
		return fmt.Errorf("%w: a row after the snapshot's commit", ErrOrder)
	}
	if err := s.begin(); err != nil {
		return err
	}
	return s.deliver(Change{Op: OpInsert, Position: s.at, Schema: table.Schema, Table: table.Name, Columns: table.Columns, New: row})
}

// Commit delivers the OpCommit that ends the snapshot (after an OpBegin,
// when there were no rows): call it once every row was delivered. The
// handler's error is returned wrapped.
func (s *SnapshotChanges) Commit() error {
	if err := s.commit(); err != nil {
		return fmt.Errorf("canonical: snapshot changes: %w", err)
	}
	return nil
}

func (s *SnapshotChanges) commit() error {
	if s.done {
		return fmt.Errorf("%w: the snapshot's commit was delivered already", ErrOrder)
	}
	if err := s.begin(); err != nil {
		return err
	}
	s.done = true
	return s.deliver(Change{Op: OpCommit, Position: s.at})
}

// begin delivers the OpBegin, once.
func (s *SnapshotChanges) begin() error {
	if s.begun {
		return nil
	}
	s.begun = true
	return s.deliver(Change{Op: OpBegin, Position: s.at})
}

func (s *SnapshotChanges) deliver(ch Change) error {
	if err := s.emit(ch); err != nil {
		return emitError(ch, err)
	}
	return nil
}

// emitError wraps a handler's error with the change it refused.
func emitError(ch Change, err error) error {
	return fmt.Errorf("emit %v at %v: %w", ch.Op, ch.Position, err)
}
