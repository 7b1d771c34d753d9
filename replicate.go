package siphon

import (
	"context"
	"errors"
	"fmt"
	"io"

	"sync"
	"sync/atomic"
	"time"

	"github.com/siphondb/siphon/canonical"
)

// ReplicateOptions says where [Conn.Replicate] starts, where it stops
// and what it reports. The zero value continues from what the target has
// applied of the source, or from where the source's slot stands, until
// ctx ends.
type ReplicateOptions struct {
	// From is where to start when the target has applied nothing of this
	// source (its system identifier and slot): a Position the target holds
	// the source at, such as the Position of a backup restored into it by
	// hand. Defaults to zero: where the slot stands.
	From canonical.Position
	// Snapshot, when the target has applied nothing of this source, first
	// copies the source's tables into it (a snapshot, as EmitCanonical
	// takes it, loaded as ConsumeCanonical loads one; the target's tables
	// must exist and be empty), then streams from the snapshot's Position:
	// one call migrates a database. Defaults to false.
	Snapshot bool
	// StopAt, when set, makes Replicate return, with a nil error, once the
	// target holds every transaction the source committed before it and
	// the target's sequences are set: a source Position such as
	// pg_current_wal_insert_lsn() read after the application stopped
	// writing (see [Conn.Cutover], which does the whole cutover). It is
	// reached on an idle source too. Defaults to zero: Replicate runs until
	// ctx ends.
	StopAt canonical.Position
	// CopySchema, when set, with Snapshot, first makes the target's
	// schema the source's, as [Conn.CopySchema] with these options does,
	// through the snapshot itself (the schema as of its Position): one
	// call creates the schema, loads the rows and streams. Defaults to
	// nil: the target's tables must exist.
	CopySchema *CopySchemaOptions
	// Progress, when set, receives a report every ProgressInterval, from
	// the initial snapshot on, and one when Replicate stops, from one
	// goroutine at a time. Defaults to none.
	Progress func(ReplicateProgress)
	// ProgressInterval is how often Progress is called. Defaults to 1s.
	ProgressInterval time.Duration
	// SkipSchemaChanges lists source transactions, by the Position of
	// their commit (a [*SchemaChangeError]'s Position), whose schema
	// changes are not run on the target, as [ApplyOptions] has it.
	// Defaults to none.
	SkipSchemaChanges []canonical.Position
}

// ReplicatePhase is what Replicate is doing.
type ReplicatePhase string

// Replicate's phases.
const (
	// ReplicateStarting: finding where to start, before the initial
	// snapshot or the stream.
	ReplicateStarting ReplicatePhase = "starting"
	// ReplicateCopying: copying the initial snapshot (see
	// [ReplicateProgress].Snapshot).
	ReplicateCopying ReplicatePhase = "copying"
	// ReplicateStreaming: applying the change stream.
	ReplicateStreaming ReplicatePhase = "streaming"
	// ReplicateStopped: the report Replicate sends as it returns.
	ReplicateStopped ReplicatePhase = "stopped"
)

// ReplicateProgress is a report of [Conn.Replicate]. For a dashboard: Lag
// is the replica's delay in time, LagBytes in WAL; RetainedWAL is what the
// source keeps for the slot (it grows while the target falls behind, and
// should fall back once it catches up); during the initial snapshot,
// Snapshot's Rows against EstimatedRows is the copy's fraction done.
type ReplicateProgress struct {
	Phase ReplicatePhase
	// Snapshot is the initial snapshot's copy: how far it came while
	// Phase is ReplicateCopying, and where it ended after. Zero without
	// one.
	Snapshot SnapshotProgress
	// Received is the end of the last source transaction received.
	Received canonical.Position
	// Applied is the end of the last source transaction the target
	// committed: where Replicate would resume from.
	Applied canonical.Position
	// SourceEnd is the source server's current WAL insert position;
	// LagBytes is how far Applied is behind it (0 when caught up, even if
	// the WAL moved on with nothing published).
	SourceEnd canonical.Position
	LagBytes  int64
	// Lag is how far the target is behind in time: now minus the source
	// commit time of the last transaction it applied, while the target has
	// not applied all the source sent (0 when caught up). LastCommit is
	// that commit time (zero before the first transaction).
	Lag        time.Duration
	LastCommit time.Time
	// RetainedWAL is the WAL, in bytes, the source keeps for the slot:
	// from its restart position to the server's end (-1 when it could not
	// be read).
	RetainedWAL int64
	// Transactions and Changes count what was applied since Replicate
	// started; the rates are over the last interval.
	Transactions, Changes                   int64
	TransactionsPerSecond, ChangesPerSecond float64
	// BytesPerSecond is how fast Applied moved along the source's WAL.
	BytesPerSecond float64
}

// SnapshotProgress is how far the copy of a snapshot has come, over all
// its tables. Estimates come from the catalog (see [Progress]).
type SnapshotProgress struct {
	// Tables is how many tables the snapshot copies; TablesDone how many
	// are complete.
	Tables, TablesDone int
	// Rows and Bytes are what was copied so far; the estimates are the
	// totals the catalog expects.
	Rows, EstimatedRows   int64
	Bytes, EstimatedBytes int64
	// Table is the table the last report was about.
	Table canonical.TableName
}

// Replicate streams c's slot into target, continuously: a live replica of
// c's published tables (a zero-downtime migration, a reporting copy, an
// upgrade to another release). It starts after what the target has
// applied of this source (its system identifier and c's slot), or, when
// the target has applied nothing of it, from opts.From (after an initial
// snapshot with opts.Snapshot). It runs until ctx is cancelled, which is
// the normal stop: it returns the Position the target has applied and nil;
// with opts.StopAt, it stops by itself once the target holds everything
// committed before it.
//
// Each source transaction is applied exactly once, as [Conn.ConsumeCanonical]
// applies a change stream: in one target transaction together with its
// Position (a replication origin, or the bookkeeping table), several small
// ones batched into one target transaction when they arrive faster than
// they apply, with target triggers and foreign keys treated as there. The
// source slot is acknowledged only up to what the target has committed, so
// a Replicate that is killed and started again loses and repeats nothing.
// Capture and apply run side by side: while the target applies, the next
// transactions are read. Memory stays bounded however large a
// transaction is. A source far behind is caught up through the SQL
// interface first, with up to 2 more sessions and 2 temporary slots on
// the source (see [Conn.StreamChanges]).
//
// Schema changes are applied at their place (see the package
// documentation on schema changes), and the target's sequences are set to
// the source's, forward only, every 10 seconds and when Replicate stops.
//
// A source interruption returns a [*StreamInterruptedError] (call
// Replicate again); a change the target refuses returns the error, with
// the target at the last transaction before it. The target's tables must
// exist with the source's columns as of where it starts, or be created by
// it (opts.CopySchema, into an empty target) (for an initial
// snapshot, run no migration until it is loaded: a table changed under it
// makes Replicate take a new one, which needs the new schema). Replicate
// reads c's slot: it returns [ErrAlreadyStreaming] while c streams it
// otherwise.
func (c *Conn) Replicate(ctx context.Context, target *Conn, opts ReplicateOptions) (pos canonical.Position, err error) {
	defer func() { c.countError(ctx, err) }()
	if target == nil {
		return 0, errorf("siphon: replicate: the target Conn: %w", ErrNilArgument)
	}
	switch {
	case opts.ProgressInterval < 0:
		return 0, &OptionError{Option: "ReplicateOptions.ProgressInterval", Problem: "negative", Fix: "use a positive interval, or 0 for 1s"}
	case opts.CopySchema != nil && !opts.Snapshot:
		return 0, &OptionError{Option: "ReplicateOptions.CopySchema", Problem: "without Snapshot",
			Fix: "set Snapshot too: the schema is copied with the initial snapshot"}
	}
	release, err := c.claimStream()
	if err != nil {
		return 0, errorf("siphon: replicate: %w", err)
	}
	defer release()
	r := &replicateRun{c: c, target: target}
	r.setPhase(ReplicateStarting)
	c.stats.replicaRunning.Store(true)
	defer c.stats.replicaRunning.Store(false)
	stopProgress := r.reportProgress(ctx, opts)
	defer stopProgress()
	if err := r.start(ctx, opts); err != nil {
		r.close()
		if errors.Is(ctx.Err(), context.Canceled) {
			return r.applied(), nil
		}
		return r.applied(), errorf("siphon: replicate: %w", err)
	}
	defer r.close()
	return r.run(ctx, opts)
}

// replicateRun is one run of Replicate.
type replicateRun struct {
	c, target *Conn
	src       streamInfo
	from      canonical.Position
	schema    *canonical.Schema
	session   *applySession
	durable   atomic.Uint64 // the target's committed Position
	received  atomic.Uint64
	txs, rows atomic.Int64
	// lastCommit is the source commit time of the last transaction the
	// target committed, Unix nanoseconds.
	lastCommit atomic.Int64
	// phase is a ReplicatePhase; snapshot the initial snapshot's progress;
	// pending the ends and commit times of the transactions received and
	// not yet applied, oldest first.
	phase    atomic.Value
	mu       sync.Mutex
	snapshot SnapshotProgress
	tables   map[canonical.TableName]Progress
	pending  []txEnd
}

func (r *replicateRun) applied() canonical.Position {
	if r == nil {
		return 0
	}
	return canonical.Position(r.durable.Load())
}

func (r *replicateRun) setPhase(p ReplicatePhase) { r.phase.Store(p) }

// start finds where to start, loads the snapshot when asked, and opens
// the apply session.
func (r *replicateRun) start(ctx context.Context, opts ReplicateOptions) error {
	c, target := r.c, r.target
	src, err := c.identifySystem(ctx)
	if err != nil {
		return err
	}
	r.src = src
	applied, err := target.AppliedPositionFor(ctx, src.systemID, c.opts.slot)
	if err != nil {
		return err
	}
	r.from = applied
	switch {
	case !applied.IsZero():
	case opts.Snapshot:
		r.setPhase(ReplicateCopying)
		if r.from, err = c.replicateSnapshot(ctx, target, emitHooks{prepare: c.schemaCopier(target, opts.CopySchema), progress: r.snapshotProgress}); err != nil {
			return fmt.Errorf("initial snapshot: %w", err)
		}
	default:
		r.from = opts.From
	}
	r.durable.Store(uint64(r.from))
	if r.schema, err = c.publishedSchema(ctx); err != nil {
		return err
	}
	h := canonical.Header{Kind: canonical.KindChanges, Engine: canonical.EnginePostgres, Start: r.from,
		SystemID: src.systemID, Timeline: src.timeline, Slot: c.opts.slot, Checked: true}
	if r.session, err = target.openApplySession(ctx, "", h); err != nil {
		return err
	}
	if err := r.session.checkContinues(ctx, h); err != nil {
		return err
	}
	r.session.skip = opts.SkipSchemaChanges
	r.session.committed = func(last txEnd, txs, changes int) {
		r.applyPending(last.pos)
		r.durable.Store(uint64(last.pos))
		r.txs.Add(int64(txs))
		r.rows.Add(int64(changes))
		c.stats.replicaApplied.Store(uint64(last.pos))
		if !last.at.IsZero() {
			r.lastCommit.Store(last.at.UnixNano())
			c.stats.replicaLastCommit.Store(last.at.UnixNano())
		}
	}
	r.setPhase(ReplicateStreaming)
	return nil
}

// close ends the apply session, if one was opened.
func (r *replicateRun) close() {
	if r.session != nil {
		r.session.close()
		r.session = nil
	}
}

// snapshotAttempts bounds the initial snapshots Replicate takes when a
// table is rewritten (a TRUNCATE, a VACUUM FULL) or changed under the copy:
// the load is one target transaction, so the target is as it was, and a
// new snapshot sees the table as it is now.
const snapshotAttempts = 3

// replicateSnapshot copies c's tables into target, through a pipe, and
// returns the snapshot's Position; hooks copy the schema first and receive
// the copy's progress.
func (c *Conn) replicateSnapshot(ctx context.Context, target *Conn, hooks emitHooks) (canonical.Position, error) {
	for attempt := 1; ; attempt++ {
		pr, pw := io.Pipe()
		loaded := make(chan error, 1)
		go func() {
			err := target.ConsumeCanonical(ctx, pr)
			pr.CloseWithError(errConsumerDone)
			loaded <- err
		}()
		pos, err := c.emitCanonical(ctx, nil, pw, hooks)
		pw.CloseWithError(err)
		loadErr := <-loaded
		var changed *SchemaIncompatibleError
		switch {
		case err == nil:
			return pos, loadErr
		case errors.As(err, &changed) && attempt < snapshotAttempts && ctx.Err() == nil:
			c.log.Warn("a table changed under the initial snapshot: taking a new one", "attempt", attempt, "error", err)
		default:
			return 0, err
		}
	}
}

// run streams and applies until ctx ends, the target reached
// opts.StopAt, or either side fails.
func (r *replicateRun) run(ctx context.Context, opts ReplicateOptions) (canonical.Position, error) {
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	pipe := newCapturePipe(r.schema, r.from)
	applied := make(chan error, 1)
	go func() {
		cc := &changeConsumer{s: r.session, src: newRecordSource(pipe)}
		err := cc.consume(runCtx)
		pipe.abandon() // the capture must not wait for a reader that stopped
		cancel()
		applied <- err
	}()
	stopSequences := r.followSequences(runCtx)
	cfg := streamConfig{from: r.from, durable: &r.durable, bound: opts.StopAt}
	if opts.StopAt != 0 && opts.StopAt <= r.from {
		cfg.bound = r.from // the target holds it already: stop at once
	}
	_, streamErr := r.c.stream(runCtx, cfg, func(ch canonical.Change) error {
		if ch.Op == canonical.OpCommit {
			r.receive(txEnd{pos: ch.Position, at: ch.CommitTime})
		}
		return pipe.put(runCtx, ch)
	})
	pipe.close(streamErr)
	applyErr := <-applied
	seqErr := stopSequences()
	r.setPhase(ReplicateStopped)
	pos := r.applied()
	switch {
	case streamErr != nil && !errors.Is(streamErr, errApplyStopped):
		return pos, streamErr
	case applyErr != nil && !errors.Is(applyErr, errCaptureStopped) && !errors.Is(applyErr, context.Canceled):
		return pos, errorf("siphon: replicate: %w", applyErr)
	case seqErr != nil:
		return pos, errorf("siphon: replicate: %w", seqErr)
	case opts.StopAt != 0 && ctx.Err() == nil:
		r.c.log.Info("replicate reached its stop position", "stop_at", opts.StopAt, "applied", pos)
		return pos, nil
	}
	return pos, stopReason(ctx, "replicate", pos)
}

// sequenceInterval is how often Replicate sets the target's sequences to
// the source's.
const sequenceInterval = 10 * time.Second

// followSequences sets the target's sequences to the source's every
// sequenceInterval, and once more when stopped (which returns that last
// attempt's error): the target's next values stay past every key the
// source used, whenever the replica is promoted.
func (r *replicateRun) followSequences(ctx context.Context) (stop func() error) {
	advance := func(ctx context.Context) error {
		seqs, err := r.c.readSequences(ctx)
		if err == nil {
			err = advanceSequences(ctx, r.target.pool, seqs)
		}
		if err != nil {
			return fmt.Errorf("sequences: %w", err)
		}
		return nil
	}
	done := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		t := time.NewTicker(sequenceInterval)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				if err := advance(ctx); err != nil && ctx.Err() == nil {
					r.c.log.Warn("replicate: setting the target's sequences failed; retrying", "err", err)
				}
			}
		}
	}()
	return func() error {
		close(done)
		<-stopped
		ctx, cancel := cleanupContext(ctx)
		defer cancel()
		return advance(ctx)
	}
}
