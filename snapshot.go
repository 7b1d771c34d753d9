package siphon

import (
	"context"
	"fmt"
	"io"
	"sync/atomic"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/siphondb/siphon/canonical"
	"github.com/siphondb/siphon/internal/fkgraph"
	"github.com/siphondb/siphon/internal/pgerr"
)

// Snapshot is a consistent view of the database at an exact [canonical.Position]:
// it shows exactly the transactions committed at or before its Position, and
// [Conn.StreamChanges] from that Position continues it with no gap and no
// duplicate.
//
// A Snapshot holds a temporary logical replication slot whose replication
// session stays open, idle, for the Snapshot's whole life: the session
// exported the snapshot, and the snapshot is valid only while it lives. Copy
// its tables with [Snapshot.CopyTables], or hand [Snapshot.Name] to
// pg_dump --snapshot, then Close it. While it is open the server keeps the
// WAL and the old row versions the snapshot may need, so do not leave it open
// longer than the copy takes.
type Snapshot struct {
	c      *Conn
	slot   *snapshotSlot
	closed atomic.Bool
}

// TakeSnapshot makes sure siphon's publication and persistent replication
// slot exist (see [WithSlot]), then takes a Snapshot. Because the persistent
// slot exists before the snapshot is taken, streaming from the Snapshot's
// Position loses nothing. The caller must Close the Snapshot.
func (c *Conn) TakeSnapshot(ctx context.Context) (*Snapshot, error) {
	slot, err := c.createSnapshotSlot(ctx, true)
	if err != nil {
		return nil, err
	}
	return &Snapshot{c: c, slot: slot}, nil
}

// Position returns the snapshot's consistent point: the snapshot holds
// exactly the transactions committed at or before it. Stream from it to
// continue the snapshot.
func (s *Snapshot) Position() canonical.Position { return s.slot.ConsistentPoint }

// Name returns the exported snapshot's name, for SET TRANSACTION SNAPSHOT or
// pg_dump --snapshot.
func (s *Snapshot) Name() string { return s.slot.SnapshotName }

// Close releases the snapshot: it closes the replication session, which
// drops the temporary slot. It is safe to call more than once, and after a
// failed copy; it returns the first call's result.
func (s *Snapshot) Close(ctx context.Context) error {
	s.closed.Store(true)
	return s.slot.Close(ctx)
}

// RowFunc receives one copied row: its table (from the schema given to
// [Snapshot.CopyTables]) and its values, in the order of table.Columns.
// The row slice is reused after RowFunc returns: keep the values (they are
// immutable) but not the slice, or copy it with slices.Clone. An error stops
// the copy and is returned wrapped.
type RowFunc func(table *canonical.Table, row canonical.Row) error

// CopyTables copies the rows of schema's tables as the snapshot sees them
// and passes each to fn. A nil schema means every table siphon's
// publication publishes. opt adds checkpoints and resuming (see
// [CopyOptions]); its zero value copies every table whole.
//
// Rows arrive table by table, in the order of schema.Tables. A large table
// is split into ranges of row locations (ctid), copied in parallel by
// several sessions importing the snapshot (see [WithCopySessions]): the rows
// of one range arrive in physical order, and ranges interleave. fn, the
// [WithProgress] function and opt's Checkpoint function are all called from
// the goroutine that called CopyTables, one call at a time, so fn needs no
// locking. A partitioned table's rows are copied through its leaf
// partitions: a leaf that schema lists itself is delivered as that table,
// the others under the nearest partitioned ancestor that schema lists.
//
// Values are canonical text (see [canonical.Value]), equal to what the
// change stream carries for the same row. The copy holds no table in memory:
// it reads binary COPY as it streams, with bounded buffering.
//
// Every table is checked against schema at the snapshot, then locked (ACCESS
// SHARE, for the rest of the copy) and checked again: a table that is
// missing, renamed, dropped and created again, rewritten after the snapshot
// (VACUUM FULL, CLUSTER, TRUNCATE, a rewriting ALTER TABLE), or whose
// columns or primary key differ is reported as a [*SchemaIncompatibleError]
// naming it and what changed. DDL that needs an ACCESS EXCLUSIVE lock on a
// table waits until the copy ends, or, when it queues between the locks of
// two copying sessions, makes the copy fail with that error instead of
// deadlocking.
func (s *Snapshot) CopyTables(ctx context.Context, schema *canonical.Schema, opt CopyOptions, fn RowFunc) error {
	switch {
	case fn == nil:
		return errorf("siphon: copy tables: the RowFunc: %w", ErrNilArgument)
	case s.closed.Load():
		return errorf("siphon: copy tables: the snapshot: %w: take a new one", ErrClosed)
	case opt.CheckpointInterval < 0:
		return &OptionError{Option: "CopyOptions.CheckpointInterval", Problem: fmt.Sprintf("%v is negative", opt.CheckpointInterval),
			Fix: "use a positive interval, or 0 for a checkpoint after every batch of rows"}
	}
	if schema == nil {
		var err error
		if schema, err = s.c.publishedSchema(ctx); err != nil {
			return err
		}
	}
	if err := s.c.copyTables(ctx, s, schema, fn, opt); err != nil {
		return errorf("siphon: copy tables: %w", err)
	}
	return nil
}

// CopyOptions are the optional parts of one [Snapshot.CopyTables] call:
// checkpoints that say how far the copy came, and resuming a copy from
// one. The zero value copies every table from its start, without
// checkpoints.
type CopyOptions struct {
	// Checkpoint, when set, is called with a [CopyCheckpoint] that covers
	// exactly the rows passed to the RowFunc so far: at most once per
	// CheckpointInterval and once when the copy is complete. It is called
	// between rows, on the goroutine that called CopyTables. Persist the
	// checkpoint in the same transaction as the rows it covers, and an
	// interrupted copy can continue from it (Resume). An error from it
	// stops the copy. To mark exactly how far each range has come, every
	// row is then read with its ctid, which costs a few percent of speed.
	// Defaults to none.
	Checkpoint func(*CopyCheckpoint) error
	// CheckpointInterval is the least time between two calls of
	// Checkpoint. Defaults to 0: after every batch of rows.
	CheckpointInterval time.Duration
	// Resume, when set, makes CopyTables continue the copy that wrote it,
	// in this (newer) snapshot: it copies only what Resume does not
	// cover.
	//
	// A relation (a table or leaf partition) whose copy Resume records as
	// done is not copied again. One copied in part resumes after its last
	// mark when it is safe to: its relfilenode is the same as when its
	// copy started (no VACUUM FULL, CLUSTER, TRUNCATE or rewriting ALTER
	// TABLE since), and no value of it can be stored out of line (it has
	// no TOAST relation, or its TOAST relation was empty then and is empty
	// now). Its rows then come from two snapshots, and the change stream
	// must be applied idempotently (an insert as an upsert, as
	// [Conn.ApplyChange] does) from Resume's Position. Otherwise the
	// relation is copied again from scratch in this snapshot: Restart is
	// called first with its old entry, so the caller can discard the rows
	// it kept from it, and its new entry's Position is this snapshot's
	// (see [CopyCheckpoint.Covers]). Defaults to nil: a copy from scratch.
	Resume *CopyCheckpoint
	// Restart is called for each relation of Resume that must be copied
	// again from scratch, before its rows come. Defaults to nil: such a
	// relation makes the copy fail instead.
	Restart func(TableCheckpoint) error

	// progress, set inside siphon, receives the copy's progress besides
	// WithProgress's function, and first one report per table with its
	// estimates and no rows.
	progress func(Progress)
}

// EmitCanonical writes a consistent snapshot of schema's tables as
// canonical JSONL to w (a nil schema means every table siphon's publication
// publishes) and returns its Position. The stream holds a header of kind
// [canonical.KindSnapshot] whose Start (and End) is the Position, a table
// record for every table of schema, every row table by table, the state of
// every sequence c carries (read after the rows, so at or after the
// Position: see the package documentation on sequences), and an end
// record. Stream changes from the returned Position to continue it.
//
// The tables come in foreign-key order: a table after the tables it
// references (in schema's order where no foreign key decides), so that a
// target that checks foreign keys while it loads can load the rows in the
// order they come. A table's references to its own rows, and cycles of
// references, need the target to load them as a replica (see
// [Conn.ConsumeCanonical]).
//
// EmitCanonical takes its own [Snapshot] and closes it before returning;
// copying works as in [Snapshot.CopyTables]. It buffers a bounded amount of
// rows, however large the tables.
func (c *Conn) EmitCanonical(ctx context.Context, schema *canonical.Schema, w io.Writer) (_ canonical.Position, err error) {
	defer func() { c.countError(ctx, err) }()
	return c.emitCanonical(ctx, schema, w, emitHooks{})
}

// emitHooks are what a call of siphon's own adds to EmitCanonical:
// prepare, when set, runs once the snapshot is taken and before anything
// is written (Replicate's copy of the schema); progress receives the
// copy's progress besides WithProgress's function (see
// CopyOptions.progress).
type emitHooks struct {
	prepare  func(context.Context, *Snapshot) error
	progress func(Progress)
}

// emitCanonical is EmitCanonical with hooks.
func (c *Conn) emitCanonical(ctx context.Context, schema *canonical.Schema, w io.Writer, hooks emitHooks) (canonical.Position, error) {
	var err error
	if schema == nil {
		if schema, err = c.publishedSchema(ctx); err != nil {
			return 0, err
		}
	}
	if schema, err = c.inLoadOrder(ctx, schema); err != nil {
		return 0, errorf("siphon: emit canonical: %w", err)
	}
	header, err := c.sourceHeader(ctx)
	if err != nil {
		return 0, errorf("siphon: emit canonical: %w", err)
	}
	snap, err := c.TakeSnapshot(ctx)
	if err != nil {
		return 0, err
	}
	var pos canonical.Position
	if hooks.prepare != nil {
		err = hooks.prepare(ctx, snap)
	}
	if err == nil {
		pos, err = c.emitSnapshot(ctx, snap, schema, header, w, hooks.progress)
	}
	if closeErr := snap.Close(context.WithoutCancel(ctx)); err == nil && closeErr != nil {
		err = closeErr
	}
	if err != nil {
		return 0, errorf("siphon: emit canonical: %w", err)
	}
	return pos, nil
}

func (c *Conn) emitSnapshot(ctx context.Context, snap *Snapshot, schema *canonical.Schema, h canonical.Header, w io.Writer, progress func(Progress)) (canonical.Position, error) {
	pos := snap.Position()
	h.Kind, h.Start, h.End, h.Created = canonical.KindSnapshot, pos, pos, time.Now().UTC()
	enc := c.opts.newEncoder(w)
	if err := enc.WriteHeader(h); err != nil {
		return 0, err
	}
	for i := range schema.Tables {
		if err := enc.WriteTable(&schema.Tables[i]); err != nil {
			return 0, err
		}
	}
	err := c.copyTables(ctx, snap, schema, func(t *canonical.Table, row canonical.Row) error {
		return enc.WriteRow(t.TableName(), row)
	}, CopyOptions{progress: progress})
	if err != nil {
		return 0, err
	}
	if err := c.writeSequences(ctx, enc); err != nil {
		return 0, err
	}
	if err := enc.WriteEnd(pos); err != nil {
		return 0, err
	}
	return pos, nil
}

// inLoadOrder returns schema with its tables in foreign-key order:
// referenced tables before the tables that reference them, in schema's
// order otherwise (see fkgraph.Order). A target that checks foreign keys
// while it loads the rows in that order finds every referenced row there.
func (c *Conn) inLoadOrder(ctx context.Context, schema *canonical.Schema) (*canonical.Schema, error) {
	names := make([]canonical.TableName, len(schema.Tables))
	byName := make(map[canonical.TableName]canonical.Table, len(schema.Tables))
	for i, t := range schema.Tables {
		names[i], byName[t.TableName()] = t.TableName(), t
	}
	edges, err := readForeignKeys(ctx, c.pool, names)
	if err != nil {
		return nil, err
	}
	ordered := &canonical.Schema{Tables: make([]canonical.Table, 0, len(names))}
	for _, name := range fkgraph.Order(names, edges) {
		ordered.Tables = append(ordered.Tables, byName[name])
	}
	return ordered, nil
}

// sourceHeader describes the source for a JSONL header, as identifySystem
// reads it.
func (c *Conn) sourceHeader(ctx context.Context) (canonical.Header, error) {
	info, err := c.identifySystem(ctx)
	if err != nil {
		return canonical.Header{}, err
	}
	return canonical.Header{Engine: canonical.EnginePostgres, Slot: c.opts.slot,
		SystemID: info.systemID, Timeline: info.timeline, ServerVersion: info.serverVersion}, nil
}

// publishedSchema describes the tables siphon's publication publishes (see
// [Conn.InspectSchema]), with the partitioned tables above them. Its
// errors carry the "siphon:" prefix.
func (c *Conn) publishedSchema(ctx context.Context) (*canonical.Schema, error) {
	if _, err := c.ensurePublication(ctx); err != nil {
		return nil, err
	}
	all, err := c.InspectSchema(ctx)
	if err != nil {
		return nil, err
	}
	published, err := publishedTables(ctx, c.pool, c.opts.publication, c.opts.publication+insertsSuffix)
	if err != nil {
		return nil, fmt.Errorf("siphon: list published tables: %w", err)
	}
	// A partitioned table is kept when something below it is published.
	for changed := true; changed; {
		changed = false
		for _, t := range all.Tables {
			if t.PartitionOf != nil && published[t.TableName()] && !published[*t.PartitionOf] {
				published[*t.PartitionOf], changed = true, true
			}
		}
	}
	schema := &canonical.Schema{}
	for _, t := range all.Tables {
		if published[t.TableName()] && !isCaptureTable(t.TableName()) {
			schema.Tables = append(schema.Tables, t)
		}
	}
	return schema, nil
}

// publishedTables reads which tables the publications publish, as the
// stream names them (pg_publication_tables). That view opens every
// published table, and one dropped while it runs fails it ("could not
// open relation with OID", an internal error): the read is tried again,
// a few times, on a newer catalog snapshot.
func publishedTables(ctx context.Context, q querier, publications ...string) (map[canonical.TableName]bool, error) {
	for attempt := 1; ; attempt++ {
		rows, err := q.Query(ctx, "SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = ANY($1)", publications)
		if err != nil {
			return nil, err
		}
		published := map[canonical.TableName]bool{}
		var n canonical.TableName
		_, err = pgx.ForEachRow(rows, []any{&n.Schema, &n.Name}, func() error {
			published[n] = true
			return nil
		})
		if err == nil || attempt == 5 || !pgerr.Is(err, pgerrcode.InternalError) {
			return published, err
		}
	}
}
