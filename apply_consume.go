package siphon

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/siphondb/siphon/canonical"
)

const (
	// maxPrepared bounds the statements an apply session prepares; further
	// shapes run as unnamed statements.
	maxPrepared = 500
	// cleanupTimeout bounds rolling back after a failure.
	cleanupTimeout = 30 * time.Second
)

// ConsumeCanonical reads a canonical JSONL stream from r (a snapshot from
// [Conn.EmitCanonical], an incremental from [Conn.BackupIncremental], or a
// recorded change stream) and applies it, exactly once, to the database c is
// connected to (the target), through one dedicated session, which turns off
// the statement, lock, idle-in-transaction and transaction timeouts the
// target's role or database set, as pg_restore does. A call that
// ends cleanly leaves that session open, reset as a new one (DISCARD ALL)
// and holding nothing of the source, for the Conn's next apply: applying a
// chain file after file costs a new backend once. [Conn.Close] ends it.
//
// Each source transaction is applied atomically together with its
// Position (the end of its commit), so the target always holds the data up
// to the Position it records and nothing past it:
//   - Transactions at or below the applied Position are skipped, so
//     consuming a stream twice, or streams that overlap, applies nothing
//     twice. A change stream that starts after the applied Position (a
//     nonzero one) is refused with an [*ApplyGapError] before anything is
//     applied.
//   - A stream cut in the middle (a reader error, a truncated stream, ctx
//     cancelled between records) or a change the target refuses leaves the
//     target at the last complete transaction before it, and returns the
//     error; consuming the stream again completes it. Statements the
//     session runs while the stream is read on get 5 seconds after ctx is
//     cancelled to end; those queued behind them then are not sent. A
//     crash, or a statement still running then, loses
//     the target transaction in progress (up to a few source transactions,
//     see below): the target then stands at the boundary it committed
//     before, with that Position, and consuming again applies the rest.
//
// The Position is kept in a PostgreSQL replication origin
// (pg_replication_origin_xact_setup commits it with the transaction;
// [Conn.AppliedPosition] reads it back). The origin is named
// "siphon_<target database OID>_<source system id>_<slot>", so two sources
// applied into one target, or one source into two databases of a cluster,
// keep separate positions. A role that may not use origins (not a superuser,
// no EXECUTE grant on the pg_replication_origin_* functions) is detected and
// uses a bookkeeping table instead, siphon.applied_position (origin text
// primary key, position pg_lsn, updated_at timestamptz), updated in the same
// transaction; siphon creates it when missing, which needs the CREATE
// privilege on the database (or an administrator's
// "CREATE SCHEMA siphon AUTHORIZATION <role>"). Either way one session at a
// time applies a given source: another gets [ErrApplyInProgress].
//
// A snapshot is applied whole or not at all: it is skipped when the target
// has applied its Position already; otherwise its rows are loaded with COPY
// into the tables (which must be empty) in one transaction that records the
// Position at its end.
//
// Change streams are applied in few round trips. One target transaction
// applies a group of source transactions (up to 50000 row changes, and
// only while the rest of the stream is already read, so a live stream is
// not held back) and records the last one's Position. Statements are sent
// in batches, prepared once per table and shape, up to three batches ahead
// of the server while the stream is decoded on; inserts into one table in
// a row, across source transactions, become multi-row INSERT ... ON
// CONFLICT statements or, from 64 rows on, a COPY (into a table with a key
// once a lookup showed that none of the keys is there yet), kept open for
// the next batches into the same table while no other statement must run
// before them; updates, or
// deletes, of one plain table's rows by key in a row become statements of
// many rows (UPDATE ... FROM (VALUES ...), DELETE ... USING), each row
// changed once a statement (a row updated again starts the next). A
// statement-level trigger that fires on apply (ENABLE ALWAYS, or any with
// [WithTriggersOnApply]) fires once for each of these statements and
// COPYs, not for each row. The records of a group's complete source
// transactions are kept (up to 32 MiB; the transaction that goes past
// that ends its group): when the group fails, it is rolled back and they
// are applied again one transaction at a time, so the target keeps all
// those before the failure. Values are bound as in [Conn.ApplyChange],
// with the same checks. Logical decoding messages are not applied. A
// schema change ([canonical.OpDDL]) is run at its place, and its target
// transaction ends with its source transaction (see the package
// documentation on schema changes), but only from a stream authenticated
// with one of the Conn's keys ([WithStreamKey]): a schema change of
// another stream is a statement whoever could write the stream chose, and
// is refused with [ErrUnauthenticatedSchemaChange], with nothing of its
// source transaction applied, unless
// [ApplyOptions].UnauthenticatedSchemaChanges;
// a stream that names one of the Conn's keys but fails its check stops at
// the checkpoint that fails, with an error wrapping
// [canonical.ErrAuthentication]; the stream's sequences are set, never
// moved back, once its end is read and its transactions are committed.
//
// The target's own logic does not run on applied changes, as with
// PostgreSQL's logical replication: the session sets
// session_replication_role = replica, so ordinary triggers and rules, and
// foreign-key checks and actions, do not fire (ENABLE REPLICA and ENABLE
// ALWAYS ones do). The source ran its logic already and its effects arrive
// as changes of their own: a trigger that stamps rows would stamp them
// again, an audit trigger would log them twice, a cascade would delete rows
// the source deletes itself. That needs a superuser or GRANT SET ON
// PARAMETER session_replication_role; a role without it applies as an
// ordinary session, with foreign keys checked (a snapshot then loads table
// by table in the order it comes, which [Conn.EmitCanonical] makes
// foreign-key order; one the target's foreign keys would fail in that
// order is refused with a [*ForeignKeyOrderError]), and before the first
// row or change after table records it checks the tables they declare: one
// where a trigger, rule or foreign-key action would fire (or an ENABLE
// REPLICA one would not) is refused with a [*TriggersWouldFireError],
// before anything of it is written. [WithTriggersOnApply] makes apply an
// ordinary session on purpose, with no such check. The session uses
// siphon's fixed settings (see the package documentation), under which the
// target's input functions read the canonical values.
//
// ConsumeCanonical is [Conn.ConsumeCanonicalWith] with the zero
// [ApplyOptions].
func (c *Conn) ConsumeCanonical(ctx context.Context, r io.Reader) error {
	return c.ConsumeCanonicalWith(ctx, ApplyOptions{}, r)
}

// ApplyOptions are the choices of one call that applies canonical streams
// ([Conn.ConsumeCanonicalWith], and RestoreChain's through
// [RestoreChainOptions].Apply): what to do about one incident, or one
// stream. The zero value applies every schema change, and accepts only
// streams that carry checksums and whose schema changes are authenticated
// with one of the Conn's keys ([WithStreamKey]).
type ApplyOptions struct {
	// SkipSchemaChanges lists source transactions, by the Position of
	// their commit (a [*SchemaChangeError]'s Position), whose schema
	// changes are not run: their rows are applied, their DDL is not. Give
	// it once the target's schema was made by hand what the source's
	// became. Defaults to none.
	SkipSchemaChanges []canonical.Position
	// Unchecked accepts canonical streams that carry no checksums (see
	// [canonical.Header].Checked): streams written by hand, or by siphon
	// before streams were checked. Nothing then vouches for their bytes:
	// a changed value is applied as it reads. Streams written by a
	// [canonical.Encoder] are always checked and need it not. Defaults to
	// false: such a stream is refused with [ErrUnchecked] before anything
	// is applied.
	Unchecked bool
	// UnauthenticatedSchemaChanges runs the schema changes (DDL records)
	// of streams that are not authenticated with one of the Conn's keys
	// ([WithStreamKey]). A schema change runs a statement on the target
	// as the applying role: whoever could write the stream (backup
	// storage, a file's path, a message subject) chooses what runs, "COPY
	// ... TO PROGRAM" included. Set it only for a stream whose every byte
	// you trust. Row changes are applied either way: they are data, bound
	// as parameters. Defaults to false: such a schema change is refused
	// with [ErrUnauthenticatedSchemaChange] before anything of its source
	// transaction is applied.
	UnauthenticatedSchemaChanges bool
}

// ConsumeCanonicalWith is [Conn.ConsumeCanonical] with the choices of opt.
func (c *Conn) ConsumeCanonicalWith(ctx context.Context, opt ApplyOptions, r io.Reader) (err error) {
	defer func() { c.countError(ctx, err) }()
	body, err := canonicalBody(r)
	if err != nil {
		return errorf("siphon: consume canonical: %w", err)
	}
	rules := c.rules(opt)
	dec := newStreamRecords(body, rules)
	h, err := dec.dec.Header()
	if err != nil {
		return errorf("siphon: consume canonical: %w", err)
	}
	src := newRecordSource(dec)
	if !h.Checked && !rules.unchecked {
		return errorf("siphon: consume canonical: %w", ErrUnchecked)
	}
	s, err := c.openApplySession(ctx, "", h)
	if err != nil {
		return errorf("siphon: consume canonical: %w", err)
	}
	defer s.close()
	s.skip = opt.SkipSchemaChanges
	if h.Kind == canonical.KindSnapshot {
		err = s.loadSnapshot(ctx, src, h)
	} else if err = s.checkContinues(ctx, h); err == nil {
		err = (&changeConsumer{s: s, src: src}).consume(ctx)
	}
	if err != nil {
		return errorf("siphon: consume canonical: %w", err)
	}
	return nil
}

// checkContinues checks that a change stream continues what the target
// holds of its source: it may not start past the applied Position, and a
// source the target holds nothing of may not join sources it holds (its
// changes would land on data of another).
func (s *applySession) checkContinues(ctx context.Context, h canonical.Header) error {
	gap := &ApplyGapError{Applied: s.progress, Start: h.Start, Source: sourceKey(h.SystemID, h.Slot)}
	switch {
	case !s.progress.IsZero() && h.Start > s.progress:
		return gap
	case !s.progress.IsZero():
		return nil
	}
	held, err := s.c.appliedSources(ctx)
	if err != nil {
		return err
	}
	delete(held, gap.Source)
	if len(held) == 0 {
		return nil
	}
	gap.Holds = held
	return gap
}

// canonicalBody returns the JSONL stream r holds, out of its envelope when
// it has one, and refuses what is not a canonical stream (a pg_dump
// backup, anything else) with an error wrapping ErrNotCanonical that says
// what it is.
func canonicalBody(r io.Reader) (io.Reader, error) {
	br := bufio.NewReaderSize(r, 1<<20)
	start, _ := br.Peek(len(canonical.EnvelopeMagic))
	text := bytes.TrimLeft(start, " \t\r\n")
	switch {
	case bytes.HasPrefix(start, []byte(canonical.EnvelopeMagic)):
		er := canonical.NewEnvelopeReader(br)
		h, err := er.Header()
		if err != nil {
			return nil, err
		}
		if h.Body != canonical.BodyJSONL {
			return nil, fmt.Errorf("%w: it is a %s backup (%s in an envelope): restore it with Restore or RestoreChain", ErrNotCanonical, h.Kind, h.Body)
		}
		return er, nil
	case len(text) == 0 || text[0] == '{':
		return br, nil // JSONL, or too little to tell: the Decoder says what is wrong
	case bytes.HasPrefix(start, []byte("PGDMP")):
		return nil, fmt.Errorf("%w: it is a pg_dump archive: restore it with pg_restore, or take backups with Backup and restore them with Restore", ErrNotCanonical)
	}
	return nil, fmt.Errorf("%w: it starts with %q, not a JSON header or a siphon envelope: ConsumeCanonical takes what EmitCanonical, BackupIncremental or a canonical.Encoder wrote", ErrNotCanonical, start)
}

// records is where a recordSource reads records from: a decoded stream,
// or Replicate's capture.
type records interface {
	// Next returns the next record, io.EOF after the end record.
	Next() (canonical.Record, error)
	// Buffered reports whether more of the stream is at hand, be it only
	// part of a record.
	Buffered() bool
	// Ahead reports whether the next record is worth decoding ahead: it is
	// at hand whole, and Next has work to do on it.
	Ahead() bool
}

// streamRecords are the records of a canonical stream, read with the
// call's rules; a schema change it may not run ends the stream, as a
// damaged record does (err keeps that).
type streamRecords struct {
	br    *bufio.Reader
	dec   *canonical.Decoder
	rules streamRules
	err   error
}

func newStreamRecords(r io.Reader, rules streamRules) *streamRecords {
	// The decoder reads through br itself (bufio reuses a large enough
	// Reader), so br.Buffered tells whether more of the stream is in memory.
	br := bufio.NewReaderSize(r, 1<<20)
	return &streamRecords{br: br, dec: rules.newDecoder(br), rules: rules}
}

func (s *streamRecords) Next() (canonical.Record, error) {
	if s.err != nil {
		return canonical.Record{}, s.err
	}
	rec, err := s.dec.Next()
	if err == nil {
		s.err = s.rules.checkSchemaChange(s.dec, rec)
		err = s.err
	}
	if err != nil {
		return canonical.Record{}, err
	}
	return rec, nil
}

func (s *streamRecords) Buffered() bool { return s.br.Buffered() > 0 }

// Ahead reports whether a whole line of the stream is in memory: a line
// begun and not ended may wait for its writer.
func (s *streamRecords) Ahead() bool {
	n := s.br.Buffered()
	if n == 0 {
		return false
	}
	held, _ := s.br.Peek(n)
	return bytes.IndexByte(held, '\n') >= 0
}

// recordSource reads records, with one record of look-ahead. While taping,
// it keeps the records it reads, so that a failed unit can be applied
// again; replay makes it return records again. It can also decode records
// ahead, while the apply session's server works (readAhead).
type recordSource struct {
	from    records
	pending *canonical.Record
	replay  []canonical.Record

	// ahead holds the records decoded ahead from aheadAt on, then aheadErr
	// (the stream's error that came after them), if any; ended is set once
	// the end record is read, after which nothing is read ahead.
	ahead    []canonical.Record
	aheadAt  int
	aheadErr error
	ended    bool

	tape      []canonical.Record
	tapeBytes int
	taping    bool // off until resetTape, and once the tape is full
}

// Bounds of decoding ahead: the records of a batch of inserts, and the
// transaction records between them.
const (
	maxAheadRecords = 2 * copyBatchRows
	maxAheadBytes   = copyBatchBytes
)

func newRecordSource(from records) *recordSource { return &recordSource{from: from} }

func (s *recordSource) next() (canonical.Record, error) {
	if p := s.pending; p != nil {
		s.pending = nil
		return *p, nil
	}
	if len(s.replay) > 0 {
		rec := s.replay[0]
		s.replay = s.replay[1:]
		return rec, nil
	}
	rec, err := s.fromAhead()
	if err == nil && s.taping {
		// Past the limit the tape stops growing; what it holds stays.
		s.tape = append(s.tape, rec)
		s.tapeBytes += recordBytes(rec)
		s.taping = s.tapeBytes <= maxTapeBytes
	}
	return rec, err
}

// recordBytes estimates the memory a record holds.
func recordBytes(rec canonical.Record) int {
	n := 128
	if ch := rec.Change; ch != nil {
		for _, row := range []canonical.Row{ch.New, ch.Old} {
			for _, v := range row {
				text, _ := v.Text()
				n += 24 + len(text)
			}
		}
	}
	return n
}

// fromAhead returns the next record decoded ahead, else the stream's next.
func (s *recordSource) fromAhead() (canonical.Record, error) {
	if s.aheadAt < len(s.ahead) {
		rec := s.ahead[s.aheadAt]
		s.ahead[s.aheadAt] = canonical.Record{}
		s.aheadAt++
		return rec, nil
	}
	s.ahead, s.aheadAt = s.ahead[:0], 0
	if s.aheadErr != nil {
		return canonical.Record{}, s.aheadErr
	}
	rec, err := s.from.Next()
	s.ended = s.ended || rec.Type == canonical.RecordEnd
	return rec, err
}

// readAhead decodes the records the stream holds in memory already, up to
// maxAheadRecords or maxAheadBytes more, until done is closed: the apply
// decodes the stream on while its server works on what it sent (a unit's
// last batches, its COMMIT), so that the next unit's first batch is ready
// when the server is. It reads nothing while records are replayed, nor
// past the end record.
func (s *recordSource) readAhead(done <-chan struct{}) {
	if s.aheadAt > 0 { // what was consumed goes
		n := copy(s.ahead, s.ahead[s.aheadAt:])
		clear(s.ahead[n:])
		s.ahead, s.aheadAt = s.ahead[:n], 0
	}
	size := 0
	for s.pending == nil && len(s.replay) == 0 && s.aheadErr == nil && !s.ended &&
		len(s.ahead) < maxAheadRecords && size < maxAheadBytes && s.from.Ahead() {
		select {
		case <-done:
			return
		default:
		}
		rec, err := s.from.Next()
		if err != nil {
			s.aheadErr = err
			return
		}
		s.ahead = append(s.ahead, rec)
		s.ended = rec.Type == canonical.RecordEnd
		size += recordBytes(rec)
	}
}

// resetTape empties the tape, then puts records on it, and starts taping.
func (s *recordSource) resetTape(records ...canonical.Record) {
	clear(s.tape)
	s.tape, s.tapeBytes, s.taping = append(s.tape[:0], records...), 0, true
	for _, rec := range records {
		s.tapeBytes += recordBytes(rec)
	}
}

// replayThenEnd makes next return records, then an end record, and
// nothing from the stream.
func (s *recordSource) replayThenEnd(records []canonical.Record) {
	s.pending, s.taping = nil, false
	clear(s.ahead)
	s.ahead, s.aheadAt, s.aheadErr = nil, 0, nil
	s.replay = append(records, canonical.Record{Type: canonical.RecordEnd})
}

// unread puts rec back, to be returned by the next call of next.
func (s *recordSource) unread(rec canonical.Record) { s.pending = &rec }

// ready reports whether the next record is (at least partly) read already.
func (s *recordSource) ready() bool {
	return s.pending != nil || len(s.replay) > 0 || s.aheadAt < len(s.ahead) || s.aheadErr != nil || s.from.Buffered()
}

// drain reads the rest of the stream, checking it.
func (s *recordSource) drain() error {
	s.taping = false
	for {
		if _, err := s.next(); err == io.EOF {
			return nil
		} else if err != nil {
			return err
		}
	}
}

// applySession is the dedicated session one ConsumeCanonical call applies
// through, with what it learnt of the target.
type applySession struct {
	c        *Conn
	conn     *pgx.Conn
	pg       *pgconn.PgConn
	track    tracker
	tracking bool // track is set up on the session
	own      bool // the session is in the Conn's own database (see warmApply)
	role     applyRole
	// unchecked lists the tables declared since the last check, when the
	// role must check what would fire (role.guard).
	unchecked []canonical.TableName
	progress  canonical.Position // committed in the target
	targets   map[canonical.TableName]*targetTable
	bindings  map[*canonical.Table]*binding
	q         stmtQueue
	prepared  int // statements prepared, for their names
	// declared holds each table's columns as its latest table record
	// gave them, previous as the one before (nil: none).
	declared, previous map[canonical.TableName][]canonical.Column
	// sequences are the stream's, set once its end is read and applied.
	sequences []canonical.Sequence
	// background holds the work started in the background on the session
	// and not awaited yet, in the order it runs (see inBackground).
	background []*backgroundJob
	// copying is the COPY of inserts left open, the last of background,
	// if any (see copyStream).
	copying *copyStream
	// committed, when set, learns the end (Position and commit time) of
	// the last source transaction each target transaction committed, and
	// how many source transactions and changes it took there.
	committed func(last txEnd, txs, changes int)
	// skip lists the source transactions whose schema changes are not
	// run (ApplyOptions.SkipSchemaChanges).
	skip []canonical.Position
}

// openApplySession opens the session that applies the source h names into
// database ("" for the Conn's, where it takes the session the last apply
// kept, if any: see warmApply).
func (c *Conn) openApplySession(ctx context.Context, database string, h canonical.Header) (*applySession, error) {
	var conn *pgx.Conn
	if database == "" {
		conn = c.warm.take(ctx, c.pool)
	}
	if conn == nil {
		var err error
		if conn, err = c.newSessionIn(ctx, database); err != nil {
			return nil, err
		}
	}
	s := &applySession{c: c, conn: conn, pg: conn.PgConn(), own: database == "",
		targets: map[canonical.TableName]*targetTable{}, bindings: map[*canonical.Table]*binding{},
		declared: map[canonical.TableName][]canonical.Column{}, previous: map[canonical.TableName][]canonical.Column{}}
	// A snapshot loads in one transaction, which waits for the source's
	// rows between its COPYs: as pg_restore does, the apply turns off the
	// target role's and database's timeouts (a kept session's too, which
	// DISCARD ALL gave them back).
	_, err := conn.Exec(ctx, noTimeouts(false))
	var env applyEnv
	if err == nil {
		env, err = readApplyEnv(ctx, conn)
	}
	if err == nil {
		key := sourceKey(h.SystemID, h.Slot)
		if s.track, err = setupTracker(ctx, conn, env, key); err == nil {
			s.tracking = true
			env.bookkeeping = env.bookkeeping || !env.origins
			s.progress, err = readProgress(ctx, conn, env, key)
		}
	}
	if err == nil {
		err = s.setupRole(ctx)
	}
	if err != nil {
		s.close()
		return nil, err
	}
	return s, nil
}

// close releases the source's replication origin (or advisory lock) and
// ends the session, which drops its prepared statements, or, in the Conn's
// own database, resets it and keeps it for the next apply (warmApply). When the session
// cannot release them itself (a cancelled command broke it), close waits
// until its backend is gone, which releases them: a ConsumeCanonical that
// returned never leaves the source held.
func (s *applySession) close() {
	ctx, cancel := cleanupContext(context.Background())
	defer cancel()
	s.await() // its error was returned, or the session is being closed anyway
	if !s.tracking {
		closeConn(ctx, s.pg)
		return
	}
	if !s.pg.IsClosed() && s.rollback(ctx) == nil {
		err := s.track.release(ctx, s.conn)
		if err == nil {
			if !s.own || !s.c.warm.keep(ctx, s.conn) {
				closeConn(ctx, s.pg)
			}
			return
		}
		s.c.log.Warn("siphon: release the applied source; ending the session releases it too", "err", err)
	}
	closeAndEnd(s.c.pool, s.pg)
}

// setupRole makes the session apply as a replica when the role may.
func (s *applySession) setupRole(ctx context.Context) error {
	var err error
	if s.role, err = s.c.readApplyRole(ctx, s.conn); err != nil || !s.role.replica {
		return err
	}
	if _, err := s.conn.Exec(ctx, replicaRoleSQL); err != nil {
		return fmt.Errorf("apply as a replica: %w", err)
	}
	return nil
}

// begin queues the start of a target transaction: in an ordinary session,
// deferrable foreign keys are checked at its commit, as the source's were
// at the end of its transactions.
func (s *applySession) begin() {
	s.q.addOpening("BEGIN", "begin")
	if s.role.guard {
		s.q.addOpening("SET CONSTRAINTS ALL DEFERRED", "defer deferrable foreign keys")
	}
}

// tableRecord takes note of a new description of a table: the target's is
// read again at its next use, and checked before it, when the role must.
func (s *applySession) tableRecord(t *canonical.Table) {
	s.previous[t.TableName()] = s.declared[t.TableName()]
	s.declared[t.TableName()] = t.Columns
	delete(s.targets, t.TableName())
	if s.role.guard && !slices.Contains(s.unchecked, t.TableName()) {
		s.unchecked = append(s.unchecked, t.TableName())
	}
}

// checkDeclared checks, in an ordinary session, that applying events to
// the tables declared since the last check fires nothing that native apply
// would not (see checkNothingFires).
func (s *applySession) checkDeclared(ctx context.Context, events applyEvents) error {
	if len(s.unchecked) == 0 {
		return nil
	}
	if err := s.await(); err != nil {
		return err
	}
	if err := checkNothingFires(ctx, s.conn, s.role.role, s.unchecked, events); err != nil {
		return err
	}
	s.unchecked = s.unchecked[:0]
	return nil
}

// binding returns the binding of table record t to its target table.
func (s *applySession) binding(ctx context.Context, t *canonical.Table) (*binding, error) {
	if b := s.bindings[t]; b != nil {
		return b, nil
	}
	target, err := s.target(ctx, t.TableName())
	if err != nil {
		return nil, err
	}
	if followed, err := s.followColumns(ctx, t, target); err != nil {
		return nil, err
	} else if followed {
		delete(s.targets, t.TableName())
		if target, err = s.target(ctx, t.TableName()); err != nil {
			return nil, err
		}
	}
	b, err := bind(target, t.Columns, t)
	if err != nil {
		return nil, err
	}
	s.bindings[t] = b
	return b, nil
}

func (s *applySession) target(ctx context.Context, name canonical.TableName) (*targetTable, error) {
	if t := s.targets[name]; t != nil {
		return t, nil
	}
	if err := s.await(); err != nil {
		return nil, err
	}
	t, err := loadTargetTable(ctx, s.conn, name)
	if err != nil {
		return nil, err
	}
	s.targets[name] = t
	return t, nil
}

// prepare prepares st on the session, unless the session has prepared
// enough already. Nothing may be queued.
func (s *applySession) prepare(ctx context.Context, st *statement) error {
	if st.prepared != nil || s.prepared >= maxPrepared {
		return nil
	}
	if err := s.await(); err != nil {
		return err
	}
	sd, err := s.pg.Prepare(ctx, fmt.Sprintf("siphon_apply_%d", s.prepared), st.sql, st.oids)
	if err != nil {
		return fmt.Errorf("prepare %s: %w", st.sql, err)
	}
	st.prepared = sd
	s.prepared++
	return nil
}

// finishTransaction queues what ends a target transaction: recording pos,
// making sure the transaction has an xid (a transaction that wrote nothing
// commits no record, and the origin would not advance), and COMMIT.
func (s *applySession) finishTransaction(pos canonical.Position, at time.Time) {
	s.track.queueRecord(&s.q, pos, at)
	if s.track.origin {
		s.q.addSQL("SELECT pg_catalog.pg_current_xact_id()", "assign a transaction id")
	}
	s.q.addSQL("COMMIT", "commit")
}

// rollback ends a failed transaction, if the session still stands.
func (s *applySession) rollback(ctx context.Context) error {
	s.q.discard()
	s.await() // its error is why we roll back, or comes after that
	if s.pg.IsClosed() || s.pg.TxStatus() == 'I' {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	_, err := s.pg.Exec(ctx, "ROLLBACK").ReadAll()
	return err
}

// flushCommit sends the queued statements, which end with a COMMIT, and
// reads their results even when ctx is cancelled meanwhile (within
// cleanupTimeout): once the COMMIT may have reached the server, the
// session must know whether it committed, or the Position it reports
// would be behind what the target holds.
func (s *applySession) flushCommit(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	return s.flush(ctx)
}

// flush sends the queued statements and waits for their results, once the
// work running in the background is done.
func (s *applySession) flush(ctx context.Context) error {
	if err := s.await(); err != nil {
		return err
	}
	return s.q.flush(ctx, s.pg)
}

// copyFrom runs a COPY, once the work running in the background is done.
func (s *applySession) copyFrom(ctx context.Context, r io.Reader, sql string) error {
	if err := s.await(); err != nil {
		return err
	}
	return copyFromGuarded(ctx, s.pg, r, sql)
}

// copyFromGuarded runs pgconn's CopyFrom from r and returns only once
// nothing reads r any more. pgconn reads r in a goroutine of its own,
// which it does not wait for when the server or the connection fails
// mid-copy: that goroutine would go on reading the stream while the apply
// reads it too (a data race the race detector found under load).
func copyFromGuarded(ctx context.Context, pg *pgconn.PgConn, r io.Reader, sql string) error {
	g := &stoppableReader{r: r}
	_, err := pg.CopyFrom(ctx, g, sql)
	g.stop()
	return err
}

// stoppableReader is an io.Reader that reads nothing once stopped; stop
// waits for a Read in progress.
type stoppableReader struct {
	mu      sync.Mutex
	r       io.Reader
	stopped bool
}

func (g *stoppableReader) Read(p []byte) (int, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.stopped {
		return 0, io.EOF
	}
	return g.r.Read(p)
}

func (g *stoppableReader) stop() {
	g.mu.Lock()
	g.stopped = true
	g.mu.Unlock()
}

// errConsumerDone closes the reading end of a pipe into ConsumeCanonical
// once the call has returned, so that what writes into it (the filter of
// consumeUpTo, Replicate's snapshot copy) stops.
var errConsumerDone = errors.New("siphon: the apply session stopped reading")

// withCleanup returns cause, noting a failure to clean up after it.
func withCleanup(cause, cleanup error) error {
	if cleanup == nil {
		return cause
	}
	return fmt.Errorf("%w (and cleaning up failed: %v)", cause, cleanup)
}

// errBackwards reports a stream whose positions go backwards.
func errBackwards(pos, applied canonical.Position) error {
	return fmt.Errorf("%w: a commit at %v follows one at %v: the stream's positions go backwards", canonical.ErrInvalidRecord, pos, applied)
}
