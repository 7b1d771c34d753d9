package siphon

import (
	"context"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/siphondb/siphon/canonical"
)

// Bounds of one round trip: a queue is sent when it holds this many
// statements or bytes of parameters.
const (
	queueMaxStatements = 1000
	queueMaxBytes      = 1 << 20
)

// stmtQueue collects statements to send in one round trip (a pgconn batch:
// one Sync for all). Each statement remembers which source transaction it
// belongs to, so an error can be traced to its transaction.
type stmtQueue struct {
	batch  *pgconn.Batch
	owners []stmtOwner
	size   int
	params paramList
	// opening holds the text of the statements that open a target
	// transaction (addOpening), queued before any other (see takeOpening).
	opening []string
}

// stmtOwner says what a queued statement does, for errors.
type stmtOwner struct {
	op    canonical.Op
	table canonical.TableName
	label string // for statements that are not a change's, and COPYs
	// tx is the Position of the source transaction being read when the
	// statement of a change, or a COPY of inserts, was queued (a run's
	// statement or COPY also holds changes of the transactions before it
	// in the unit); zero for statements that are not a change's. Sent
	// ahead, a statement may fail while a later transaction is read. A
	// COPY left open across batches (copyStream) names the transaction of
	// the last batch it read, up to two batches past the failing row: the
	// unit applied again a transaction at a time names the exact one.
	tx canonical.Position
	// onRow, when set, receives the rows the statement returns (text).
	onRow func(values [][]byte)
}

func (o stmtOwner) String() string {
	if o.label != "" {
		return o.label
	}
	return o.op.String() + " on " + o.table.String()
}

// stmtError is the error of a queued statement.
type stmtError struct {
	owner stmtOwner
	err   error
}

func (e *stmtError) Error() string { return e.owner.String() + ": " + e.err.Error() }
func (e *stmtError) Unwrap() error { return e.err }

// full reports whether the queue should be sent now.
func (q *stmtQueue) full() bool {
	return len(q.owners) >= queueMaxStatements || q.size >= queueMaxBytes
}

// add queues st with the parameters in q.params, then clears them.
func (q *stmtQueue) add(st *statement, owner stmtOwner) {
	if q.batch == nil {
		q.batch = &pgconn.Batch{}
	}
	if st.prepared != nil {
		q.batch.ExecStatement(st.prepared, q.params.values, nil, nil)
	} else {
		q.batch.ExecParams(st.sql, q.params.values, st.oids, nil, nil)
	}
	q.size += len(q.params.buf) + 16*len(q.params.values)
	q.owners = append(q.owners, owner)
	q.params.reset()
}

// addSQL queues a statement without parameters.
func (q *stmtQueue) addSQL(sql string, label string) {
	q.params.reset()
	q.add(&statement{sql: sql}, stmtOwner{label: label})
}

// addOpening queues a statement without parameters that opens a target
// transaction (BEGIN, and what goes with it).
func (q *stmtQueue) addOpening(sql string, label string) {
	if len(q.opening) == len(q.owners) {
		q.opening = append(q.opening, sql)
	}
	q.addSQL(sql, label)
}

// takeOpening returns the queued statements as the text of one simple
// query, to run before another in the same round trip, and empties the
// queue; but only when they are a transaction's opening alone (see
// addOpening): else it returns "" and leaves the queue.
func (q *stmtQueue) takeOpening() string {
	if len(q.owners) == 0 || len(q.opening) != len(q.owners) {
		return ""
	}
	text := strings.Join(q.opening, "; ")
	q.discard()
	return text
}

// flush sends the queued statements and reads their results. The first
// statement that fails ends the batch (the server skips the rest) and is
// returned as a *stmtError.
func (q *stmtQueue) flush(ctx context.Context, pg *pgconn.PgConn) error {
	if len(q.owners) == 0 {
		return nil
	}
	batch, owners := q.batch, q.owners
	defer func() { q.batch, q.owners, q.size, q.opening = nil, owners[:0], 0, q.opening[:0] }()
	mrr := pg.ExecBatch(ctx, batch)
	var failed error
	i := 0
	for mrr.NextResult() {
		rr := mrr.ResultReader()
		if onRow := owners[min(i, len(owners)-1)].onRow; onRow != nil {
			for rr.NextRow() {
				onRow(rr.Values())
			}
		}
		if _, err := rr.Close(); err != nil && failed == nil {
			failed = &stmtError{owner: owners[min(i, len(owners)-1)], err: err}
		}
		i++
	}
	if err := mrr.Close(); err != nil && failed == nil {
		failed = &stmtError{owner: owners[min(i, len(owners)-1)], err: err}
	}
	return failed
}

// take returns a queue holding what q holds, to be flushed on its own,
// and leaves q empty.
func (q *stmtQueue) take() *stmtQueue {
	t := &stmtQueue{batch: q.batch, owners: q.owners, size: q.size}
	q.batch, q.owners, q.size, q.opening = nil, nil, 0, q.opening[:0]
	return t
}

// discard drops what is queued.
func (q *stmtQueue) discard() {
	q.batch, q.owners, q.size, q.opening = nil, q.owners[:0], 0, q.opening[:0]
	q.params.reset()
}
