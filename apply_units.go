package siphon

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/siphondb/siphon/canonical"
)

// changeConsumer applies a change stream. Source transactions are grouped
// into units, one target transaction each, within which a run of inserts
// may span source transactions (and be copied at once). The records of a
// unit's complete source transactions stay on the source's tape: when the
// unit fails, it is rolled back and they are applied again one
// transaction at a time, so the target keeps every complete transaction
// before the one that failed.
type changeConsumer struct {
	s   *applySession
	src *recordSource
	sh  shape // reused for every change
	// replaying is set while the tape of a failed unit is applied again.
	replaying bool

	unit struct {
		open     bool    // BEGIN is queued or sent
		ends     []txEnd // the unit's complete source transactions
		changes  int     // row changes in the unit
		complete int     // records on tape up to the last complete transaction
		// schemaChanged: a schema change was applied, and the unit ends
		// with its source transaction.
		schemaChanged bool
		began         time.Time // when the unit opened, for siphon.apply.duration
	}
	tx struct {
		open     bool               // between begin and commit
		skipping bool               // applied before: read and ignored
		pos      canonical.Position // the commit's start, from the begin
	}
	run   insertRun
	keyed keyedRun
}

// Bounds of a unit: it is committed after the source transaction that
// reaches maxUnitChanges row changes or takes the tape past maxTapeBytes
// (the tape stops growing there, and the unit ends with that transaction),
// or when the rest of the stream is not read yet.
const (
	maxUnitChanges = 50000
	maxTapeBytes   = 32 << 20
)

// txEnd is the commit of a source transaction.
type txEnd struct {
	pos canonical.Position
	at  time.Time
}

// insertRun is a run of inserts into one table, not queued yet. A short
// run is queued as statements inserting many rows at once; a long one is
// copied (see copyRun and copyInserts).
type insertRun struct {
	b     *binding
	table *canonical.Table
	rows  []canonical.Row
	bytes int // of the rows' values
}

// Bounds of runs of inserts: from copyThreshold rows on, a run is copied;
// a run into a keyed table is copied in batches of at most copyBatchRows
// rows or copyBatchBytes bytes (maxBackgroundJobs of them in memory while
// the next is read).
const (
	copyThreshold  = 64
	copyBatchRows  = 2000
	copyBatchBytes = 4 << 20
)

func (cc *changeConsumer) consume(ctx context.Context) error {
	for {
		if err := ctx.Err(); err != nil {
			return cc.fail(ctx, err)
		}
		rec, err := cc.src.next()
		if err != nil {
			return cc.fail(ctx, err)
		}
		switch rec.Type {
		case canonical.RecordTable:
			cc.s.tableRecord(rec.Table)
		case canonical.RecordChange:
			if err = cc.s.checkDeclared(ctx, changeEvents); err == nil {
				err = cc.change(ctx, rec)
			}
		case canonical.RecordSequence:
			cc.s.sequences = append(cc.s.sequences, *rec.Sequence)
		case canonical.RecordEnd:
			if err = cc.commitUnit(ctx); err == nil {
				return cc.s.advanceSequences(ctx)
			}
		default:
			err = fmt.Errorf("%w: a %v record in a change stream", canonical.ErrOrder, rec.Type)
		}
		if err != nil {
			return cc.fail(ctx, err)
		}
	}
}

// applied returns the Position applied so far, committed or not.
func (cc *changeConsumer) applied() canonical.Position {
	if n := len(cc.unit.ends); n > 0 {
		return cc.unit.ends[n-1].pos
	}
	return cc.s.progress
}

func (cc *changeConsumer) change(ctx context.Context, rec canonical.Record) error {
	ch := rec.Change
	switch ch.Op {
	case canonical.OpBegin:
		cc.begin(rec)
		return nil
	case canonical.OpCommit:
		return cc.commit(ctx, ch)
	case canonical.OpMessage:
		return nil
	}
	if cc.tx.skipping {
		return nil
	}
	cc.unit.changes++
	if ch.Op == canonical.OpDDL {
		return cc.schemaChange(ctx, ch)
	}
	if ch.Op == canonical.OpInsert {
		if err := cc.flushKeyed(ctx); err != nil {
			return err
		}
		return cc.insert(ctx, rec)
	}
	if err := cc.flushRun(ctx); err != nil {
		return err
	}
	if ch.Op == canonical.OpTruncate {
		if err := cc.flushKeyed(ctx); err != nil {
			return err
		}
		return cc.truncate(ctx, ch)
	}
	b, err := cc.s.binding(ctx, rec.Table)
	if err != nil {
		return err
	}
	return cc.queueChange(ctx, b, ch)
}

// begin starts a source transaction. Its Position is the commit's start:
// below the applied Position (an end of commit), it was applied already.
func (cc *changeConsumer) begin(rec canonical.Record) {
	pos := rec.Change.Position
	cc.tx.open, cc.tx.skipping, cc.tx.pos = true, pos < cc.applied(), pos
	if cc.tx.skipping {
		if !cc.unit.open {
			cc.src.resetTape()
		}
		return
	}
	if !cc.unit.open {
		cc.src.resetTape(rec)
		cc.s.begin()
		cc.unit.open, cc.unit.began = true, time.Now()
	}
}

func (cc *changeConsumer) commit(ctx context.Context, ch *canonical.Change) error {
	if cc.tx.skipping {
		cc.tx.open, cc.tx.skipping = false, false
		return nil
	}
	if ch.Position <= cc.applied() {
		return errBackwards(ch.Position, cc.applied())
	}
	cc.tx.open = false
	cc.unit.ends = append(cc.unit.ends, txEnd{pos: ch.Position, at: ch.CommitTime})
	if cc.src.taping {
		cc.unit.complete = len(cc.src.tape)
	}
	if cc.replaying || !cc.src.taping || cc.unit.changes >= maxUnitChanges || cc.unit.schemaChanged || !cc.src.ready() {
		return cc.commitUnit(ctx)
	}
	return cc.s.sendAhead(ctx, cc.s.q.full())
}

// commitUnit commits the unit with the Position of its last complete
// source transaction.
func (cc *changeConsumer) commitUnit(ctx context.Context) error {
	s := cc.s
	if !cc.unit.open {
		return nil
	}
	if len(cc.unit.ends) == 0 { // nothing complete: nothing to keep
		cc.resetUnit()
		return s.rollback(ctx)
	}
	if err := cc.flushRuns(ctx); err != nil {
		return err
	}
	if !cc.replaying {
		cc.src.readAhead(s.backgroundDone())
	}
	last := cc.unit.ends[len(cc.unit.ends)-1]
	s.finishTransaction(last.pos, last.at)
	if err := s.flushCommit(ctx); err != nil {
		return err
	}
	s.progress = last.pos
	s.c.recordApplied(ctx, len(cc.unit.ends), cc.unit.changes, cc.unit.began)
	if s.committed != nil {
		s.committed(last, len(cc.unit.ends), cc.unit.changes)
	}
	cc.resetUnit()
	return nil
}

func (cc *changeConsumer) resetUnit() {
	cc.unit.open, cc.unit.ends, cc.unit.changes, cc.unit.complete = false, cc.unit.ends[:0], 0, 0
	cc.unit.schemaChanged = false
	cc.src.resetTape()
}

// fail handles an error met while applying: the unit is rolled back (the
// server did so already if the session broke), then its complete source
// transactions are applied again, each committed on its own, up to the
// first that fails, whose error then follows cause's (a batch's error may
// name a later transaction than the one that holds the failing change).
func (cc *changeConsumer) fail(ctx context.Context, cause error) error {
	var failed *stmtError
	switch {
	case errors.As(cause, &failed) && failed.owner.tx != 0:
		cause = fmt.Errorf("the transaction committed at %v: %w", failed.owner.tx, cause)
	case cc.tx.open && !cc.tx.skipping:
		cause = fmt.Errorf("the transaction committed at %v: %w", cc.tx.pos, cause)
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	var again []canonical.Record
	if cc.unit.open && len(cc.unit.ends) > 0 && !cc.replaying {
		again = slices.Clone(cc.src.tape[:cc.unit.complete])
	}
	err := cc.s.rollback(ctx)
	if err == nil {
		cause = cc.s.explainPrivilege(ctx, cause)
	}
	cc.resetUnit()
	cc.run, cc.tx.open, cc.tx.skipping = insertRun{}, false, false
	cc.keyed.reset()
	if err != nil || cc.s.pg.IsClosed() || len(again) == 0 {
		return withCleanup(cause, err)
	}
	cc.replaying = true
	cc.src.replayThenEnd(again)
	if err := cc.consume(ctx); err != nil {
		return fmt.Errorf("%w (applied again a transaction at a time: %v)", cause, err)
	}
	return cause
}

func (cc *changeConsumer) insert(ctx context.Context, rec canonical.Record) error {
	b, err := cc.s.binding(ctx, rec.Table)
	if err != nil {
		return err
	}
	if cc.run.b != b {
		if err := cc.flushRun(ctx); err != nil {
			return err
		}
		cc.run.b, cc.run.table = b, rec.Table
	}
	cc.run.rows = append(cc.run.rows, rec.Change.New)
	for _, v := range rec.Change.New {
		text, _ := v.Text()
		cc.run.bytes += len(text)
	}
	switch {
	case b.key == nil && len(cc.run.rows) >= copyThreshold:
		return cc.copyRun(ctx)
	case len(cc.run.rows) >= copyBatchRows || cc.run.bytes >= copyBatchBytes:
		return cc.flushRun(ctx)
	}
	return nil
}

// flushRuns queues the runs of changes not queued yet: of inserts, and of
// updates or deletes by key (one of them at most is not empty).
func (cc *changeConsumer) flushRuns(ctx context.Context) error {
	if err := cc.flushRun(ctx); err != nil {
		return err
	}
	return cc.flushKeyed(ctx)
}

// flushRun applies or queues the run of inserts.
func (cc *changeConsumer) flushRun(ctx context.Context) error {
	b, table, rows := cc.run.b, cc.run.table, cc.run.rows
	cc.run = insertRun{} // rows may go to a COPY in the background: not reused
	switch {
	case len(rows) == 0:
		return nil
	case len(rows) >= copyThreshold:
		return cc.copyInserts(ctx, b, table, rows)
	}
	return cc.queueInserts(ctx, b, rows)
}

// queueInserts queues inserts of rows into b's table, many rows a
// statement.
func (cc *changeConsumer) queueInserts(ctx context.Context, b *binding, rows []canonical.Row) error {
	b.target.ceilingKnown = false
	most := b.maxInsertRows()
	for len(rows) > 0 {
		n := chunkRows(most, len(rows))
		if n > 1 && b.duplicateKeys(rows[:n]) {
			n = 1 // one statement cannot upsert a row twice
		}
		if err := planInserts(b, rows[:n], &cc.sh); err != nil {
			return err
		}
		cc.s.q.params.addRows(rows[:n])
		if err := cc.queueStatement(ctx, b, &cc.sh, canonical.OpInsert); err != nil {
			return err
		}
		rows = rows[n:]
	}
	return nil
}

// queueChange queues the statement of an update or delete, or adds it to
// the run of updates or deletes by key (see keyedRun).
func (cc *changeConsumer) queueChange(ctx context.Context, b *binding, ch *canonical.Change) error {
	if ch.Op == canonical.OpUpdate {
		b.target.ceilingKnown = false // it may raise a key
	}
	ok, err := planChange(b, ch, &cc.sh)
	if err != nil || !ok {
		return err
	}
	if b.joinsRun(&cc.sh) {
		return cc.queueKeyed(ctx, b, ch)
	}
	if err := cc.flushKeyed(ctx); err != nil {
		return err
	}
	cc.s.q.params.addChange(&cc.sh, ch)
	return cc.queueStatement(ctx, b, &cc.sh, ch.Op)
}

// queueStatement queues the statement of shape sh with the parameters in
// the queue's params, preparing it first when its shape is new.
func (cc *changeConsumer) queueStatement(ctx context.Context, b *binding, sh *shape, op canonical.Op) error {
	s := cc.s
	st := b.statement(sh)
	if st.prepared == nil && s.prepared < maxPrepared {
		// Preparing takes a round trip of its own: send what is queued
		// with it.
		if err := cc.flushQueue(ctx); err != nil {
			return err
		}
		if err := s.prepare(ctx, st); err != nil {
			return err
		}
	}
	s.q.add(st, stmtOwner{op: op, table: b.source, tx: cc.tx.pos})
	if s.q.full() {
		return s.sendAhead(ctx, true)
	}
	return nil
}

func (cc *changeConsumer) flushQueue(ctx context.Context) error { return cc.s.flush(ctx) }

func (cc *changeConsumer) truncate(ctx context.Context, ch *canonical.Change) error {
	var targets []*targetTable
	for _, name := range ch.Truncated {
		t, err := cc.s.target(ctx, name)
		if err != nil {
			return err
		}
		targets = append(targets, t)
	}
	if len(targets) == 0 {
		return nil
	}
	for _, t := range targets {
		t.ceilingKnown = false
	}
	if err := cc.s.await(); err != nil {
		return err
	}
	parents, err := truncatedParents(ctx, cc.s.conn, targets)
	if err != nil {
		return err
	}
	cc.s.q.params.reset()
	cc.s.q.add(&statement{sql: truncateSQL(targets, parents, ch.RestartIdentity)},
		stmtOwner{label: fmt.Sprintf("truncate %d tables", len(targets)), tx: cc.tx.pos})
	return nil
}
