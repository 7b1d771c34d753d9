package siphon

import (
	"context"
	"fmt"
	"io"
	"runtime"
	"strconv"
	"strings"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/siphondb/siphon/canonical"
	"github.com/siphondb/siphon/internal/pgerr"
)

// loadSnapshot applies a snapshot stream: skipped when the target has
// applied its Position already, else every row loaded with COPY in one
// transaction that records the Position at its end.
func (s *applySession) loadSnapshot(ctx context.Context, src *recordSource, h canonical.Header) error {
	if !s.progress.IsZero() && s.progress >= h.Start {
		return src.drain()
	}
	if err := s.loadSnapshotRows(ctx, src, h); err != nil {
		if rerr := s.rollback(ctx); rerr != nil {
			return withCleanup(err, rerr)
		}
		return s.explainPrivilege(ctx, err)
	}
	return nil
}

func (s *applySession) loadSnapshotRows(ctx context.Context, src *recordSource, h canonical.Header) error {
	s.begin()
	var declared []canonical.TableName // in the order rows come
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		rec, err := src.next()
		if err != nil {
			return err
		}
		switch rec.Type {
		case canonical.RecordTable:
			s.tableRecord(rec.Table)
			declared = append(declared, rec.TableName())
		case canonical.RecordRow:
			if err := s.checkBeforeRows(ctx, declared); err != nil {
				return err
			}
			if err := s.copyRows(ctx, src, rec); err != nil {
				return err
			}
		case canonical.RecordSequence:
			s.sequences = append(s.sequences, *rec.Sequence)
		case canonical.RecordEnd:
			s.finishTransaction(rec.Position, h.Created)
			if err := s.flushCommit(ctx); err != nil {
				return err
			}
			s.progress = rec.Position
			return s.advanceSequences(ctx)
		default:
			return fmt.Errorf("%w: a %v record in a snapshot", canonical.ErrOrder, rec.Type)
		}
	}
}

// checkBeforeRows checks, in an ordinary session, the tables declared
// since the last check: that loading rows fires nothing (checkDeclared),
// and that rows coming in the order of declared pass the foreign keys.
func (s *applySession) checkBeforeRows(ctx context.Context, declared []canonical.TableName) error {
	if len(s.unchecked) == 0 {
		return nil
	}
	if err := s.checkDeclared(ctx, snapshotEvents); err != nil {
		return err
	}
	return checkLoadOrder(ctx, s.conn, s.role.role, declared)
}

// copyRows copies rec's row, and the rows of the same table that follow
// it, into the target table.
func (s *applySession) copyRows(ctx context.Context, src *recordSource, rec canonical.Record) error {
	b, err := s.binding(ctx, rec.Table)
	if err != nil {
		return err
	}
	sql := s.copyQuery(b)
	if err := s.flush(ctx); err != nil {
		return err
	}
	rd := &copyReader{src: src, table: rec.Table, first: []canonical.Row{rec.Row}}
	err = s.copyFrom(ctx, rd, sql)
	switch {
	case rd.err != nil:
		return rd.err
	case pgerr.Is(err, pgerrcode.UniqueViolation):
		return fmt.Errorf("copy rows into %s: %w (a snapshot loads into empty tables)", b.source, err)
	case err != nil:
		return fmt.Errorf("copy rows into %s: %w", b.source, err)
	}
	return nil
}

// copyRun copies the run of inserts into a keyless table, and the inserts
// into the same table that follow it in the stream.
func (cc *changeConsumer) copyRun(ctx context.Context) error {
	s, b := cc.s, cc.run.b
	sql := s.copyQuery(b)
	if err := cc.flushQueue(ctx); err != nil {
		return err
	}
	rd := &copyReader{src: cc.src, table: cc.run.table, insert: true, first: cc.run.rows}
	err := s.copyFrom(ctx, rd, sql)
	cc.unit.changes += rd.count - len(cc.run.rows)
	cc.run = insertRun{rows: cc.run.rows[:0]}
	switch {
	case rd.err != nil:
		return rd.err
	case err != nil:
		return fmt.Errorf("copy %d inserts into %s: %w", rd.count, b.source, err)
	}
	return nil
}

// copyInserts applies a batch of inserts: with COPY straight into the
// table when it is keyless, or when none of the rows' keys is in the table
// yet (nor twice among them); else as upserts. The COPY runs in the
// background, and stays open for the next batch into the table (see
// copyStream). A row that another session inserts between the check and
// the COPY fails the COPY: the unit is then applied again, and the
// transaction with that insert fails; consuming the stream again applies
// it with an upsert.
func (cc *changeConsumer) copyInserts(ctx context.Context, b *binding, table *canonical.Table, rows []canonical.Row) error {
	if b.key != nil {
		conflict, err := cc.keysExist(ctx, b, rows)
		if err != nil {
			return err
		}
		if conflict {
			return cc.queueInserts(ctx, b, rows)
		}
	}
	if err := cc.s.streamCopy(ctx, b, table, rows, cc.tx.pos); err != nil {
		return err
	}
	// Let the COPY's goroutine send the rows now, when nothing runs before
	// them: otherwise it waits, runnable, while this one decodes the next
	// batch (a core to run it on is seldom free on a small machine), and
	// the server idles meanwhile.
	runtime.Gosched()
	return nil
}

// keysExist tells whether rows cannot be copied into b's table: a key is in
// the table already or twice among the rows, or the key's type has no array
// type to look it up with. It sends what is queued. An integer key is
// first looked up by range (one index probe; new keys often lie above
// every existing one), then, if the range holds rows, key by key. The
// range probe also reads the table's largest key, which then bounds every
// key in it (see targetTable.ceiling): the next batches of keys above it,
// as an append-only table's are, need no probe at all.
func (cc *changeConsumer) keysExist(ctx context.Context, b *binding, rows []canonical.Row) (bool, error) {
	check := b.keyCheck()
	if check == nil {
		return true, nil
	}
	lo, hi, increasing, intKey := b.intKeyRange(rows)
	if !increasing && b.duplicateKeys(rows) {
		return true, nil
	}
	q := &cc.s.q
	if intKey {
		t := b.target
		if t.ceilingKnown && lo > t.ceiling {
			t.ceiling = hi
			return false, nil
		}
		q.params.reset()
		q.params.add(canonical.Text(strconv.FormatInt(lo, 10)))
		q.params.add(canonical.Text(strconv.FormatInt(hi, 10)))
		k := b.cols[b.key[0]]
		var inRange bool
		var largest *int64
		cc.s.q.add(&statement{
			sql:  "SELECT EXISTS (SELECT FROM " + b.quoted + " WHERE " + k.quoted + " BETWEEN $1 AND $2), (SELECT pg_catalog.max(" + k.quoted + ")::int8 FROM " + b.quoted + ")",
			oids: []uint32{k.typeOID, k.typeOID},
		}, stmtOwner{label: "look up the key range of inserts into " + b.source.String(), onRow: func(v [][]byte) {
			inRange = string(v[0]) == "t"
			if v[1] != nil {
				n, err := strconv.ParseInt(string(v[1]), 10, 64)
				largest = &n
				if err != nil {
					largest = nil
				}
			}
		}})
		if err := cc.flushQueue(ctx); err != nil {
			return false, err
		}
		t.ceiling, t.ceilingKnown = hi, true
		if largest != nil {
			t.ceiling = max(*largest, hi)
		}
		if !inRange {
			return false, nil
		}
	}
	q.params.reset()
	for _, k := range b.key {
		q.params.add(canonical.Text(arrayLiteral(rows, k)))
	}
	return cc.queryBool(ctx, check, "look up the keys of inserts into "+b.source.String())
}

// queryBool queues st, a query returning one boolean, with the parameters
// in the queue's params, sends the queue and returns the boolean.
func (cc *changeConsumer) queryBool(ctx context.Context, st *statement, label string) (bool, error) {
	result := false
	cc.s.q.add(st, stmtOwner{label: label, onRow: func(v [][]byte) { result = string(v[0]) == "t" }})
	err := cc.flushQueue(ctx)
	return result, err
}

// intKey reports whether the key is one column of type smallint, integer
// or bigint.
func (b *binding) intKey() bool {
	if len(b.key) != 1 {
		return false
	}
	switch b.cols[b.key[0]].typeOID {
	case pgtype.Int2OID, pgtype.Int4OID, pgtype.Int8OID:
		return true
	}
	return false
}

// intKeyRange returns the smallest and largest key of rows when the key is
// one column of type smallint, integer or bigint, and whether the keys are
// strictly increasing, as appended rows' are (then no two are the same).
func (b *binding) intKeyRange(rows []canonical.Row) (lo, hi int64, increasing, ok bool) {
	if !b.intKey() {
		return 0, 0, false, false
	}
	increasing = true
	for i, row := range rows {
		text, _ := row[b.key[0]].Text()
		v, err := strconv.ParseInt(text, 10, 64)
		if err != nil {
			return 0, 0, false, false
		}
		if i > 0 && v <= hi {
			increasing = false
		}
		if i == 0 || v < lo {
			lo = v
		}
		if i == 0 || v > hi {
			hi = v
		}
	}
	return lo, hi, increasing, len(rows) > 0
}

// duplicateKeys reports whether two of rows have the same key (never for
// a keyless table).
func (b *binding) duplicateKeys(rows []canonical.Row) bool {
	if b.key == nil {
		return false
	}
	if _, _, increasing, ok := b.intKeyRange(rows); ok && increasing {
		return false
	}
	seen := make(map[string]struct{}, len(rows))
	var key []byte
	for _, row := range rows {
		key = key[:0]
		for _, k := range b.key {
			text, _ := row[k].Text()
			key = append(append(key, text...), 0) // text holds no NUL
		}
		if _, dup := seen[string(key)]; dup {
			return true
		}
		seen[string(key)] = struct{}{}
	}
	return false
}

// keyCheck returns the query that tells whether any of a set of keys, given
// as one array per key column, is in the table; nil when a key column's
// type has no array type.
func (b *binding) keyCheck() *statement {
	st := &statement{}
	var on, params, names strings.Builder
	for i, k := range b.key {
		if b.cols[k].arrayOID == 0 {
			return nil
		}
		st.oids = append(st.oids, b.cols[k].arrayOID)
		if i > 0 {
			on.WriteString(" AND ")
			params.WriteString(", ")
			names.WriteString(", ")
		}
		fmt.Fprintf(&params, "pg_catalog.unnest($%d)", i+1)
		fmt.Fprintf(&names, "k%d", i)
		fmt.Fprintf(&on, "t.%s %s k.k%d", b.cols[k].quoted, b.cols[k].eq, i)
	}
	// ROWS FROM of one unnest per array, as unnest(a, b) in FROM reads:
	// a bare unnest of one array would find a closer match than
	// pg_catalog's polymorphic one in a schema of the DSN's search_path.
	st.sql = "SELECT EXISTS (SELECT FROM " + b.quoted + " t JOIN ROWS FROM (" + params.String() + ") AS k(" +
		names.String() + ") ON " + on.String() + ")"
	return st
}

// arrayLiteral returns the values of column col of rows as an array
// literal, each element quoted: the element type's input function reads
// each one as the column's would.
func arrayLiteral(rows []canonical.Row, col int) string {
	var b strings.Builder
	b.WriteByte('{')
	for i, row := range rows {
		if i > 0 {
			b.WriteByte(',')
		}
		text, _ := row[col].Text()
		b.WriteByte('"')
		for j := 0; j < len(text); j++ {
			if text[j] == '"' || text[j] == '\\' {
				b.WriteByte('\\')
			}
			b.WriteByte(text[j])
		}
		b.WriteByte('"')
	}
	b.WriteByte('}')
	return b.String()
}

// copyQuery returns b's COPY (copySQL) to run once what is queued is sent;
// when that is a unit's BEGIN alone (see stmtQueue.takeOpening), it goes
// before the COPY in the same query instead, which saves the server a
// round trip's wait.
func (s *applySession) copyQuery(b *binding) string {
	if before := s.q.takeOpening(); before != "" {
		return before + "; " + b.copySQL()
	}
	return b.copySQL()
}

// copySQL is the COPY FROM STDIN (text format) of every bound column into
// b's table.
func (b *binding) copySQL() string {
	var s strings.Builder
	s.WriteString("COPY " + b.quoted + " (")
	for i, c := range b.cols {
		if i > 0 {
			s.WriteString(", ")
		}
		s.WriteString(c.quoted)
	}
	s.WriteString(") FROM STDIN")
	return s.String()
}

// copyReader feeds COPY FROM STDIN (text format) with rows: first the ones
// given, then (when src is set) those the stream holds next while they are
// rows of table (snapshot) or inserts into it (change stream). It leaves
// the first other record unread for the caller.
type copyReader struct {
	src    *recordSource
	table  *canonical.Table
	insert bool // inserts, not snapshot rows
	first  []canonical.Row
	// feed, when set, gives the batches of rows that follow first, until
	// closed, or until feedUntil is done: then the COPY fails (its
	// transaction is rolled back, and the session stays usable). tx is the
	// source transaction of the last batch read.
	feed      <-chan copyBatch
	feedUntil context.Context
	tx        canonical.Position
	buf       []byte
	off       int
	count     int // rows read
	done      bool
	err       error // the stream's error, which aborts the COPY
}

func (r *copyReader) Read(p []byte) (int, error) {
	if r.off > 0 {
		r.buf, r.off = append(r.buf[:0], r.buf[r.off:]...), 0
	}
	for len(r.buf) < len(p) && !r.done && r.err == nil {
		row, ok := r.nextRow(len(r.buf) == 0)
		if !ok {
			break
		}
		r.buf, r.err = appendCopyRow(r.buf, row)
	}
	if r.err != nil {
		return 0, r.err
	}
	n := copy(p, r.buf)
	r.off = n
	if n == 0 && r.done {
		return 0, io.EOF
	}
	return n, nil
}

// nextRow returns the next row, if any, and sets done once there are no
// more. Without wait, it returns none rather than wait for the feed.
func (r *copyReader) nextRow(wait bool) (canonical.Row, bool) {
	for len(r.first) == 0 && r.feed != nil {
		var batch copyBatch
		var more bool
		if wait {
			select {
			case batch, more = <-r.feed:
			case <-r.feedUntil.Done():
				r.err = fmt.Errorf("siphon: the apply stopped in a copy: %w", context.Cause(r.feedUntil))
				return nil, false
			}
		} else {
			select {
			case batch, more = <-r.feed:
			default:
				return nil, false
			}
		}
		if !more {
			r.feed = nil
		}
		r.first, r.tx = batch.rows, max(r.tx, batch.tx)
	}
	if len(r.first) > 0 {
		row := r.first[0]
		r.first = r.first[1:]
		r.count++
		return row, true
	}
	if r.src == nil {
		r.done = true
		return nil, false
	}
	rec, err := r.src.next()
	if err == io.EOF {
		err = fmt.Errorf("%w: the stream ended inside a copy", canonical.ErrTruncated)
	}
	if err != nil {
		r.err = err
		return nil, false
	}
	var row canonical.Row
	switch {
	case rec.Table != r.table:
	case r.insert && rec.Type == canonical.RecordChange && rec.Change.Op == canonical.OpInsert:
		row = rec.Change.New
	case !r.insert && rec.Type == canonical.RecordRow:
		row = rec.Row
	}
	if row == nil {
		r.src.unread(rec)
		r.done = true
		return nil, false
	}
	r.count++
	return row, true
}

// copyEscape[c] is the letter COPY's text format escapes byte c with
// (after a backslash), or 0 when c stands for itself.
var copyEscape = [256]byte{'\\': '\\', '\n': 'n', '\r': 'r', '\t': 't'}

// plainPrefix returns how many bytes at the start of s need no escape in
// COPY's text format, at least: it tests 8 bytes at a time (SWAR), and
// stops at the first word that holds a backslash or a byte below 0x0e
// (newline, carriage return and tab among them), or where fewer than 8
// bytes are left.
func plainPrefix(s string) int {
	const (
		ones  = 0x0101010101010101
		highs = 0x8080808080808080
	)
	i := 0
	for ; i+8 <= len(s); i += 8 {
		w := uint64(s[i]) | uint64(s[i+1])<<8 | uint64(s[i+2])<<16 | uint64(s[i+3])<<24 |
			uint64(s[i+4])<<32 | uint64(s[i+5])<<40 | uint64(s[i+6])<<48 | uint64(s[i+7])<<56
		backslash := w ^ (ones * '\\')
		// A byte's high bit is set in x-ones*n &^ x when the byte is below
		// n (n at most 0x80), for at least one such byte of the word.
		if ((w-ones*0x0e)&^w|(backslash-ones)&^backslash)&highs != 0 {
			return i
		}
	}
	return i
}

// appendCopyRow appends row as a line of COPY's text format: tab-separated,
// NULL as \N, backslash, newline, carriage return and tab escaped.
func appendCopyRow(buf []byte, row canonical.Row) ([]byte, error) {
	for i, v := range row {
		if i > 0 {
			buf = append(buf, '\t')
		}
		s, present := v.Text()
		if !present {
			if v.IsUnchanged() {
				return buf, fmt.Errorf("%w: an inserted row holds an unchanged TOAST value", canonical.ErrInvalidRecord)
			}
			buf = append(buf, '\\', 'N')
			continue
		}
		start := 0
		for j := plainPrefix(s); j < len(s); j++ {
			esc := copyEscape[s[j]]
			if esc == 0 {
				continue
			}
			buf = append(append(buf, s[start:j]...), '\\', esc)
			start = j + 1
		}
		buf = append(buf, s[start:]...)
	}
	return append(buf, '\n'), nil
}
