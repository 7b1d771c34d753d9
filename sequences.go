package siphon

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"

	"github.com/siphondb/siphon/canonical"
	"github.com/siphondb/siphon/internal/pgerr"
	"github.com/siphondb/siphon/internal/sqltext"
)

// Sequences. Logical decoding does not carry sequences, so siphon reads
// their state where a stream ends: a snapshot's after its rows, an
// incremental's once its bound is reached, a live replication's when it
// stops. Sequences change outside transactions, so what is read is their
// state at or after that point, never behind a key the rows before it
// used. Apply sets a target sequence to the source's state only when that
// moves it forward, so the target's next value never collides with a key
// the source has used (target >= source), and a target sequence ahead of
// the source is left as it is.

// sequencesQuery lists the sequences a Conn carries, with whether the
// role may read them: every user sequence (not temporary, not of an
// extension, not siphon's) or, with WithTables ($1 schemas, $2 names),
// those the tables own (serial and identity columns) or use in column
// defaults.
const sequencesQuery = `
SELECT n.nspname, c.relname, pg_catalog.has_sequence_privilege(c.oid, 'SELECT') FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind = 'S' AND c.relpersistence <> 't' AND ` + inUserSchema + ` AND ` + notOfExtension + `
  AND (pg_catalog.cardinality($1::text[]) = 0 OR EXISTS (
        SELECT FROM unnest($1::text[], $2::text[]) AS u(s, t)
        JOIN pg_namespace tn ON tn.nspname = u.s JOIN pg_class t ON t.relnamespace = tn.oid AND t.relname = u.t
        WHERE EXISTS (SELECT FROM pg_depend d WHERE d.classid = 'pg_class'::regclass AND d.objid = c.oid
                        AND d.refclassid = 'pg_class'::regclass AND d.refobjid = t.oid AND d.deptype IN ('a', 'i'))
           OR EXISTS (SELECT FROM pg_attrdef ad JOIN pg_depend d ON d.classid = 'pg_attrdef'::regclass AND d.objid = ad.oid
                      WHERE ad.adrelid = t.oid AND d.refclassid = 'pg_class'::regclass AND d.refobjid = c.oid)))
ORDER BY 1, 2`

// sequenceState is one sequence's last_value and is_called, and its
// increment.
type sequenceState struct {
	value, increment int64
	called           bool
	settable         bool // the role may setval it (UPDATE)
}

// next is the value nextval would return.
func (s sequenceState) next() int64 {
	if s.called {
		return s.value + s.increment
	}
	return s.value
}

// readSequences reads the state of the sequences c carries. Those the
// role may not read are left out, and said at Warn.
func (c *Conn) readSequences(ctx context.Context) ([]canonical.Sequence, error) {
	schemas, names := nameArrays(c.tables)
	rows, err := c.pool.Query(ctx, sequencesQuery, schemas, names)
	if err != nil {
		return nil, fmt.Errorf("list sequences: %w", err)
	}
	var seqs []canonical.Sequence
	var unreadable []canonical.TableName
	for rows.Next() {
		var s canonical.Sequence
		var readable bool
		if err := rows.Scan(&s.Schema, &s.Name, &readable); err != nil {
			rows.Close()
			return nil, fmt.Errorf("list sequences: %w", err)
		}
		if readable {
			seqs = append(seqs, s)
		} else {
			unreadable = append(unreadable, s.TableName())
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list sequences: %w", err)
	}
	if len(unreadable) > 0 {
		c.log.Warn("sequences the role may not read are not carried: a target may reuse their values; GRANT SELECT ON them",
			"sequences", tableList(unreadable))
	}
	states, err := readSequenceStates(ctx, c.pool, seqs)
	for err != nil {
		// A sequence dropped since the list (a deploy dropping a table with
		// an identity column) is not carried: it is gone on the source too.
		var missing *missingSequenceError
		if !errors.As(err, &missing) {
			return nil, err
		}
		seqs = slices.Delete(seqs, missing.index, missing.index+1)
		states, err = readSequenceStates(ctx, c.pool, seqs)
	}
	for i := range seqs {
		seqs[i].Value, seqs[i].Called = states[i].value, states[i].called
	}
	return seqs, nil
}

// sequenceBatch is a batch of queries, as pgx sends them.
type sequenceBatch interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// missingSequenceError is readSequenceStates' error for the sequence
// seqs[index], which does not exist.
type missingSequenceError struct{ index int }

func (e *missingSequenceError) Error() string { return "the sequence does not exist" }

// readSequenceStates reads the state of seqs, in one round trip, and
// returns a *missingSequenceError for the first that does not exist.
func readSequenceStates(ctx context.Context, q sequenceBatch, seqs []canonical.Sequence) ([]sequenceState, error) {
	states := make([]sequenceState, len(seqs))
	if len(seqs) == 0 {
		return states, nil
	}
	b := &pgx.Batch{}
	b.Queue("SELECT current_user::text")
	queries := make([]string, len(seqs))
	for i, s := range seqs {
		// Reading the sequence relation gives last_value and is_called even
		// when nextval was never called (pg_sequences shows NULL then).
		queries[i] = `SELECT s.last_value, s.is_called, q.seqincrement, pg_catalog.has_sequence_privilege(q.seqrelid, 'UPDATE')
			FROM ` + sqltext.Name(s.TableName().Schema, s.TableName().Name) + ` s, pg_sequence q
			WHERE q.seqrelid = ` + sqltext.Literal(sqltext.Name(s.TableName().Schema, s.TableName().Name)) + `::regclass`
		b.Queue(queries[i])
	}
	br := q.SendBatch(ctx, b)
	defer br.Close()
	var role string
	if err := br.QueryRow().Scan(&role); err != nil {
		// pgx prepares the batch's queries before it runs any: a sequence
		// dropped since the list fails that step, which names the query.
		var prepare pgx.ErrPreprocessingBatch
		if errors.As(err, &prepare) && pgerr.Is(err, pgerrcode.UndefinedTable) {
			if i := slices.Index(queries, prepare.SQL()); i >= 0 {
				return nil, &missingSequenceError{index: i}
			}
		}
		return nil, fmt.Errorf("read sequences: %w", err)
	}
	for i, s := range seqs {
		err := br.QueryRow().Scan(&states[i].value, &states[i].called, &states[i].increment, &states[i].settable)
		switch {
		case pgerr.Is(err, pgerrcode.UndefinedTable):
			return nil, &missingSequenceError{index: i}
		case pgerr.Is(err, pgerrcode.InsufficientPrivilege):
			return nil, sequencePrivilegeError(role, s.TableName(), err)
		}
		if err != nil {
			return nil, fmt.Errorf("read sequence %s: %w", s.TableName(), err)
		}
	}
	return states, br.Close()
}

// sequencePrivilegeError says that role may not read or set the target's
// sequence seq, which apply moves forward to the source's.
func sequencePrivilegeError(role string, seq canonical.TableName, err error) *PrivilegeError {
	return gapsError(role, "apply: it moves each sequence forward to the source's, so that the target never hands out a value the source used",
		[]grantGap{{what: "SELECT, UPDATE on sequence " + seq.String(),
			grant: fmt.Sprintf("GRANT SELECT, UPDATE ON SEQUENCE %s TO %s", seq, sqltext.Ident(role))}}, err)
}

// writeSequences writes the state of the sequences c carries to enc.
func (c *Conn) writeSequences(ctx context.Context, enc *canonical.Encoder) error {
	seqs, err := c.readSequences(ctx)
	if err != nil {
		return err
	}
	for _, s := range seqs {
		if err := enc.WriteSequence(s); err != nil {
			return err
		}
	}
	return nil
}

// advanceSequences sets each target sequence of seqs that is behind the
// source's state to it, and leaves those at or past it.
func advanceSequences(ctx context.Context, q sequenceBatch, seqs []canonical.Sequence) error {
	states, err := readSequenceStates(ctx, q, seqs)
	var missing *missingSequenceError
	if errors.As(err, &missing) {
		return &SchemaIncompatibleError{Table: seqs[missing.index].TableName(),
			Problem: "the sequence does not exist in the target database: create it there (same DDL as the source)"}
	}
	if err != nil {
		return err
	}
	b := &pgx.Batch{}
	for i, s := range seqs {
		target := states[i]
		source := sequenceState{value: s.Value, called: s.Called, increment: target.increment}
		behind := target.next() < source.next()
		if target.increment < 0 {
			behind = target.next() > source.next()
		}
		if behind && !target.settable {
			var role string
			if err := q.QueryRow(ctx, "SELECT current_user::text").Scan(&role); err != nil {
				return fmt.Errorf("set sequences: %w", err)
			}
			return sequencePrivilegeError(role, s.TableName(), nil)
		}
		if behind {
			b.Queue("SELECT pg_catalog.setval($1::regclass, $2, $3)", sqltext.Name(s.TableName().Schema, s.TableName().Name), s.Value, s.Called)
		}
	}
	if b.Len() == 0 {
		return nil
	}
	if err := q.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("set sequences: %w", err)
	}
	return nil
}

// advanceSequences sets the target's sequences the stream carried, once
// its end was read (and verified) and its transactions are committed:
// sequences are not transactional, so they are set last, when nothing of
// the stream can still be refused.
func (s *applySession) advanceSequences(ctx context.Context) error {
	if len(s.sequences) == 0 {
		return nil
	}
	if err := advanceSequences(ctx, s.conn, s.sequences); err != nil {
		return fmt.Errorf("sequences: %w", err)
	}
	s.sequences = s.sequences[:0]
	return nil
}
