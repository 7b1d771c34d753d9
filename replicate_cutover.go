package siphon

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/siphondb/siphon/canonical"
	"github.com/siphondb/siphon/internal/sqltext"
)

// The end of a live migration: the target made equal to a source that
// stopped writing, and checked.

// CutoverOptions say how [Conn.Cutover] replicates the rest and how it
// compares the tables. The zero value compares row counts.
type CutoverOptions struct {
	// Contents compares each table's rows, not only how many there are:
	// a checksum of every row's values on both sides (which reads every
	// row once more on each). Defaults to false: counts.
	Contents bool
	// Progress and ProgressInterval report the replication of the rest,
	// as for [Conn.Replicate]. Default to none and 1s.
	Progress         func(ReplicateProgress)
	ProgressInterval time.Duration
	// SkipSchemaChanges, as for [Conn.Replicate]. Defaults to none.
	SkipSchemaChanges []canonical.Position
}

// CutoverReport says where a cutover ended and how the tables compare.
type CutoverReport struct {
	// Position is the source's WAL insert position Cutover read first: the
	// target holds every transaction the source committed before it.
	Position canonical.Position
	// Applied is the end of the last source transaction the target holds.
	Applied canonical.Position
	// OK is true when every published table compares equal.
	OK bool
	// Tables holds each published table's comparison; Problems says what
	// differs, one line per table.
	Tables   []TableComparison
	Problems []string
}

// TableComparison compares one table of the source with the target's.
type TableComparison struct {
	Table                  canonical.TableName
	SourceRows, TargetRows int64
	// SourceSum and TargetSum are checksums of the rows' values, with
	// CutoverOptions.Contents (empty without).
	SourceSum, TargetSum string
	Match                bool
}

// Cutover ends a live migration into target: call it once the application
// has stopped writing to the source (which is yours to do) and no other
// Replicate of c runs (cancel it: Cutover goes on from where it stopped).
// It reads the source's WAL insert position, replicates every transaction
// committed before it into target (Replicate with StopAt: it returns on an
// idle source too; a target that holds nothing of the source gets the
// initial snapshot first, which makes Cutover alone an offline
// migration), sets the target's sequences to the source's, then
// compares every published table on both sides, by row count or, with
// opt.Contents, by a checksum of the rows' values. The report says where
// the cutover ended and what differs; the application may then write to
// the target. A table that differs (OK false) means writes reached the
// source after the cutover started, or the target was written to: the
// error is nil then, and Problems say which tables. Cutover returns an
// error only when it could not replicate or compare.
func (c *Conn) Cutover(ctx context.Context, target *Conn, opt CutoverOptions) (*CutoverReport, error) {
	if target == nil {
		return nil, errorf("siphon: cutover: the target Conn: %w", ErrNilArgument)
	}
	end, err := c.boundPosition(ctx)
	if err != nil {
		return nil, errorf("siphon: cutover: %w", err)
	}
	rep := &CutoverReport{Position: end}
	rep.Applied, err = c.Replicate(ctx, target, ReplicateOptions{StopAt: end, Snapshot: true, Progress: opt.Progress,
		ProgressInterval: opt.ProgressInterval, SkipSchemaChanges: opt.SkipSchemaChanges})
	if errors.Is(err, ErrAlreadyStreaming) {
		return nil, errorf("siphon: cutover: %w: stop the running Replicate of this Conn first (cancel its ctx); Cutover goes on from where it stopped", err)
	}
	if err != nil {
		return nil, errorf("siphon: cutover: %w", err)
	}
	if ctx.Err() != nil {
		return nil, errorf("siphon: cutover: stopped before the target reached %v: %w", end, context.Cause(ctx))
	}
	schema, err := c.publishedSchema(ctx)
	if err != nil {
		return nil, errorf("siphon: cutover: %w", err)
	}
	for i := range schema.Tables {
		cmp, err := compareTable(ctx, c, target, &schema.Tables[i], opt.Contents)
		if err != nil {
			return nil, errorf("siphon: cutover: compare %s: %w", schema.Tables[i].TableName(), err)
		}
		rep.Tables = append(rep.Tables, cmp)
		if !cmp.Match {
			rep.Problems = append(rep.Problems, cmp.problem())
		}
	}
	rep.OK = len(rep.Problems) == 0
	c.log.Info("cutover done", "position", end, "applied", rep.Applied, "tables", len(rep.Tables), "ok", rep.OK)
	return rep, nil
}

// problem says how a table that does not match differs.
func (t TableComparison) problem() string {
	if t.SourceRows != t.TargetRows {
		return fmt.Sprintf("%s: %d rows on the source, %d on the target (written after the cutover started?)", t.Table, t.SourceRows, t.TargetRows)
	}
	return fmt.Sprintf("%s: %d rows on both, with different values (written after the cutover started?)", t.Table, t.SourceRows)
}

// compareTable counts t's rows on source and target, and with contents
// sums a 64-bit hash of each row's values, named column by column so that
// a target whose columns are in another order compares equal.
func compareTable(ctx context.Context, source, target *Conn, t *canonical.Table, contents bool) (TableComparison, error) {
	cmp := TableComparison{Table: t.TableName()}
	sum := "''"
	if contents {
		cols := make([]string, len(t.Columns))
		for i, col := range t.Columns {
			cols[i] = sqltext.Ident(col.Name)
		}
		sum = "coalesce(pg_catalog.sum(('x' || pg_catalog.left(pg_catalog.md5(ROW(" + strings.Join(cols, ", ") + ")::text), 16))::bit(64)::int8::numeric), 0)::text"
	}
	query := "SELECT pg_catalog.count(*), " + sum + " FROM " + sqltext.Name(t.Schema, t.Name)
	read := func(conn *Conn, rows *int64, total *string) error {
		return conn.pool.QueryRow(ctx, query).Scan(rows, total)
	}
	if err := read(source, &cmp.SourceRows, &cmp.SourceSum); err != nil {
		return cmp, fmt.Errorf("on the source: %w", err)
	}
	if err := read(target, &cmp.TargetRows, &cmp.TargetSum); err != nil {
		return cmp, fmt.Errorf("on the target: %w", err)
	}
	cmp.Match = cmp.SourceRows == cmp.TargetRows && cmp.SourceSum == cmp.TargetSum
	return cmp, nil
}

// WaitApplied waits until the database c is connected to (a target) holds
// its source up to pos, or past it, as [Conn.AppliedPosition] reads it,
// whoever applies it (a Replicate, a ConsumeCanonical or a natsjs
// consumer in another process). pos is the end of a source transaction:
// an OpCommit's Position, or what a stream or a backup returned. A WAL
// position between transactions (pg_current_wal_insert_lsn(), say) is
// reached only once a later transaction is applied: to wait for
// everything committed before such a position, use
// [ReplicateOptions].StopAt or [Conn.Cutover]. It checks at a growing
// interval, up to once a second, until ctx ends (returning ctx's error). A
// target that holds several sources returns an error wrapping
// [ErrAmbiguousSource].
func (c *Conn) WaitApplied(ctx context.Context, pos canonical.Position) error {
	for pause := 10 * time.Millisecond; ; pause = min(2*pause, time.Second) {
		applied, err := c.AppliedPosition(ctx)
		switch {
		case err != nil:
			return errorf("siphon: wait applied: %w", err)
		case applied >= pos:
			return nil
		}
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return errorf("siphon: wait applied: the target holds %v, not yet %v: %w", applied, pos, context.Cause(ctx))
		case <-t.C:
		}
	}
}
