package siphon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/siphondb/siphon/canonical"
)

// ReplicateOptions says where [Conn.Replicate] starts and what it reports.
// The zero value continues from what the target has applied of the source,
// or from where the source's slot stands.
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
	// CopySchema, when set, with Snapshot, first makes the target's
	// schema the source's, as [Conn.CopySchema] with these options does,
	// through the snapshot itself (the schema as of its Position): one
	// call creates the schema, loads the rows and streams. Defaults to
	// nil: the target's tables must exist.
	CopySchema *CopySchemaOptions
	// Progress, when set, receives a report every ProgressInterval and one
	// when Replicate stops, from one goroutine at a time. Defaults to none.
	Progress func(ReplicateProgress)
	// ProgressInterval is how often Progress is called. Defaults to 1s.
	ProgressInterval time.Duration
	// SkipSchemaChanges lists source transactions, by the Position of
	// their commit (a [*SchemaChangeError]'s Position), whose schema
	// changes are not run on the target, as [ApplyOptions] has it.
	// Defaults to none.
	SkipSchemaChanges []canonical.Position
}

// ReplicateProgress is a report of [Conn.Replicate].
type ReplicateProgress struct {
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
	// Transactions and Changes count what was applied since Replicate
	// started; the rates are over the last interval.
	Transactions, Changes                   int64
	TransactionsPerSecond, ChangesPerSecond float64
	// BytesPerSecond is how fast Applied moved along the source's WAL.
	BytesPerSecond float64
}

// Replicate streams c's slot into target, continuously: a live replica of
// c's published tables (a zero-downtime migration, a reporting copy, an
// upgrade to another release). It starts after what the target has
// applied of this source (its system identifier and c's slot), or, when
// the target has applied nothing of it, from opts.From (after an initial
// snapshot with opts.Snapshot). It runs until ctx is cancelled, which is
// the normal stop: it returns the Position the target has applied and nil.
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
func (c *Conn) Replicate(ctx context.Context, target *Conn, opts ReplicateOptions) (canonical.Position, error) {
	if target == nil {
		return 0, errorf("siphon: replicate: the target Conn: %w", ErrNilArgument)
	}
	if opts.ProgressInterval < 0 {
		return 0, &OptionError{Option: "ReplicateOptions.ProgressInterval", Problem: "negative", Fix: "use a positive interval, or 0 for 1s"}
	}
	release, err := c.claimStream()
	if err != nil {
		return 0, errorf("siphon: replicate: %w", err)
	}
	defer release()
	r, err := c.startReplica(ctx, target, opts)
	if err != nil {
		if errors.Is(ctx.Err(), context.Canceled) {
			return r.applied(), nil
		}
		return r.applied(), errorf("siphon: replicate: %w", err)
	}
	defer r.close()
	return r.run(ctx, opts)
}

// replica is one run of Replicate.
type replica struct {
	c, target *Conn
	src       streamInfo
	from      canonical.Position
	schema    *canonical.Schema
	session   *applySession
	durable   atomic.Uint64 // the target's committed Position
	received  atomic.Uint64
	txs, rows atomic.Int64
}

func (r *replica) applied() canonical.Position {
	if r == nil {
		return 0
	}
	return canonical.Position(r.durable.Load())
}

// startReplica finds where to start, loads the snapshot when asked, and
// opens the apply session.
func (c *Conn) startReplica(ctx context.Context, target *Conn, opts ReplicateOptions) (*replica, error) {
	if opts.CopySchema != nil && !opts.Snapshot {
		return nil, &OptionError{Option: "ReplicateOptions.CopySchema", Problem: "without Snapshot",
			Fix: "set Snapshot too: the schema is copied with the initial snapshot"}
	}
	src, err := c.identifySystem(ctx)
	if err != nil {
		return nil, err
	}
	r := &replica{c: c, target: target, src: src}
	applied, err := target.AppliedPositionFor(ctx, src.systemID, c.opts.slot)
	if err != nil {
		return r, err
	}
	r.from = applied
	switch {
	case !applied.IsZero():
	case opts.Snapshot:
		if r.from, err = c.replicateSnapshot(ctx, target, opts.CopySchema); err != nil {
			return r, fmt.Errorf("initial snapshot: %w", err)
		}
		r.durable.Store(uint64(r.from))
	default:
		r.from = opts.From
	}
	r.durable.Store(uint64(r.from))
	if r.schema, err = c.publishedSchema(ctx); err != nil {
		return r, err
	}
	h := canonical.Header{Kind: canonical.KindChanges, Engine: canonical.EnginePostgres, Start: r.from,
		SystemID: src.systemID, Timeline: src.timeline, Slot: c.opts.slot, Checked: true}
	if r.session, err = target.openApplySession(ctx, "", h); err != nil {
		return r, err
	}
	if err := r.session.checkContinues(ctx, h); err != nil {
		r.session.close()
		return r, err
	}
	r.session.skip = opts.SkipSchemaChanges
	r.session.committed = func(pos canonical.Position, txs, changes int) {
		r.durable.Store(uint64(pos))
		r.txs.Add(int64(txs))
		r.rows.Add(int64(changes))
	}
	return r, nil
}

func (r *replica) close() { r.session.close() }

// snapshotAttempts bounds the initial snapshots Replicate takes when a
// table is rewritten (a TRUNCATE, a VACUUM FULL) or changed under the copy:
// the load is one target transaction, so the target is as it was, and a
// new snapshot sees the table as it is now.
const snapshotAttempts = 3

// replicateSnapshot copies c's tables (with copySchema, its schema first)
// into target, through a pipe, and returns the snapshot's Position.
func (c *Conn) replicateSnapshot(ctx context.Context, target *Conn, copySchema *CopySchemaOptions) (canonical.Position, error) {
	prepare := c.schemaCopier(target, copySchema)
	for attempt := 1; ; attempt++ {
		pr, pw := io.Pipe()
		loaded := make(chan error, 1)
		go func() {
			err := target.ConsumeCanonical(ctx, pr)
			pr.CloseWithError(errConsumerDone)
			loaded <- err
		}()
		pos, err := c.emitCanonical(ctx, nil, pw, prepare)
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

// run streams and applies until ctx ends or either side fails.
func (r *replica) run(ctx context.Context, opts ReplicateOptions) (canonical.Position, error) {
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
	stopProgress := r.reportProgress(runCtx, opts)
	stopSequences := r.followSequences(runCtx)
	_, streamErr := r.c.stream(runCtx, streamConfig{from: r.from, durable: &r.durable}, func(ch canonical.Change) error {
		if ch.Op == canonical.OpCommit {
			r.received.Store(uint64(ch.Position))
		}
		return pipe.put(runCtx, ch)
	})
	pipe.close(streamErr)
	applyErr := <-applied
	stopProgress()
	seqErr := stopSequences()
	pos := r.applied()
	switch {
	case streamErr != nil && !errors.Is(streamErr, errApplyStopped):
		return pos, streamErr
	case applyErr != nil && !errors.Is(applyErr, errCaptureStopped) && !errors.Is(applyErr, context.Canceled):
		return pos, errorf("siphon: replicate: %w", applyErr)
	case seqErr != nil:
		return pos, errorf("siphon: replicate: %w", seqErr)
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
func (r *replica) followSequences(ctx context.Context) (stop func() error) {
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

// reportProgress calls opts.Progress every interval until stopped.
func (r *replica) reportProgress(ctx context.Context, opts ReplicateOptions) (stop func()) {
	if opts.Progress == nil {
		return func() {}
	}
	every := opts.ProgressInterval
	if every == 0 {
		every = time.Second
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(every)
		defer t.Stop()
		last := ReplicateProgress{Applied: r.applied()}
		lastAt := time.Now()
		report := func(ctx context.Context, now time.Time) {
			p := r.progress(ctx)
			secs := max(now.Sub(lastAt).Seconds(), 1e-3)
			p.TransactionsPerSecond = float64(p.Transactions-last.Transactions) / secs
			p.ChangesPerSecond = float64(p.Changes-last.Changes) / secs
			p.BytesPerSecond = float64(int64(p.Applied)-int64(last.Applied)) / secs
			opts.Progress(p)
			last, lastAt = p, now
		}
		for {
			select {
			case <-done:
				ctx, cancel := cleanupContext(ctx)
				report(ctx, time.Now()) // where Replicate stopped
				cancel()
				return
			case now := <-t.C:
				report(ctx, now)
			}
		}
	}()
	return func() { close(done); wg.Wait() }
}

// progress reads where the replica stands.
func (r *replica) progress(ctx context.Context) ReplicateProgress {
	p := ReplicateProgress{
		Received: canonical.Position(r.received.Load()), Applied: r.applied(),
		Transactions: r.txs.Load(), Changes: r.rows.Load(),
	}
	if end, _, err := r.c.insertPosition(ctx); err == nil {
		p.SourceEnd = end
		if p.Received > p.Applied {
			p.LagBytes = int64(end) - int64(p.Applied)
		}
	}
	return p
}

// errCaptureStopped ends the apply side when the capture stopped inside a
// transaction: the unit is rolled back to its complete transactions.
// errApplyStopped ends the capture when the apply side stopped.
var (
	errCaptureStopped = errors.New("siphon: the capture stopped inside a transaction")
	errApplyStopped   = errors.New("siphon: the apply side stopped")
)

// capturePipe carries captured changes to the apply session as records,
// with table records where a table's columns change, through a bounded
// queue: a slow target holds the capture back. The queue is handed over
// whole: the capture appends to it under a lock, and the apply side takes
// every record queued at once, then reads them without the lock. Each side
// wakes the other only when that one waits: the apply side once a commit,
// or pipeWakeRecords records, are queued (it could not apply less); the
// capture once the apply side took the queue. A busy pipe so costs a wake-up
// per transaction or per queue, not one per record.
type capturePipe struct {
	mu          sync.Mutex
	queue       []canonical.Record
	readerWaits bool          // the apply side waits for readerWake
	writerWaits bool          // the capture waits for writerWake
	readerWake  chan struct{} // capacity 1, as writerWake
	writerWake  chan struct{}
	closed      bool          // the capture ended: err, end and cut are set
	gone        chan struct{} // closed when the reader stopped
	once        sync.Once

	// Apply side: the records taken from the queue, and how many of them
	// were read.
	batch []canonical.Record
	read  int

	// Capture side.
	tables map[canonical.TableName]*canonical.Table
	source *canonical.Schema
	inTx   bool
	last   canonical.Position // the last commit's end

	// End of the capture, set before closed.
	err error
	end canonical.Position
	cut bool
}

// Bounds of the pipe: the queue holds at most pipeDepth/2 records, and the
// apply side as many, so at most pipeDepth are in flight between capture
// and apply; a waiting apply side is woken at a commit, or once
// pipeWakeRecords records of a transaction are queued.
const (
	pipeDepth       = 4096
	pipeWakeRecords = 256
)

// newCapturePipe returns a pipe for a capture that starts at from.
func newCapturePipe(source *canonical.Schema, from canonical.Position) *capturePipe {
	return &capturePipe{queue: make([]canonical.Record, 0, pipeDepth/2), batch: make([]canonical.Record, 0, pipeDepth/2),
		readerWake: make(chan struct{}, 1), writerWake: make(chan struct{}, 1), gone: make(chan struct{}),
		tables: map[canonical.TableName]*canonical.Table{}, source: source, last: from}
}

// put hands a change on, after a table record when its columns are new.
// A message outside a transaction is not: apply ignores messages, and one
// that followed the last commit would leave records buffered, so that the
// apply side would keep that commit's unit open until the next
// transaction arrived.
func (p *capturePipe) put(ctx context.Context, ch canonical.Change) error {
	switch ch.Op {
	case canonical.OpMessage:
		if !p.inTx {
			return nil
		}
	case canonical.OpBegin:
		p.inTx = true
	case canonical.OpCommit:
		p.inTx, p.last = false, ch.Position
	}
	rec := canonical.Record{Type: canonical.RecordChange, Change: &ch}
	if ch.Op == canonical.OpInsert || ch.Op == canonical.OpUpdate || ch.Op == canonical.OpDelete {
		t, fresh := p.table(&ch)
		if fresh {
			if err := p.send(ctx, canonical.Record{Type: canonical.RecordTable, Table: t}); err != nil {
				return err
			}
		}
		rec.Table = t
	}
	return p.send(ctx, rec)
}

// table returns the table record of ch's table and columns, and whether it
// is new: keys and replica identity come from the source's schema.
func (p *capturePipe) table(ch *canonical.Change) (*canonical.Table, bool) {
	name := ch.TableName()
	if t := p.tables[name]; t != nil && sameColumns(t.Columns, ch.Columns) {
		return t, false
	}
	t := &canonical.Table{Schema: name.Schema, Name: name.Name, Columns: ch.Columns}
	if known := p.source.Table(name.Schema, name.Name); known != nil {
		t.PrimaryKey, t.ReplicaIdentity, t.PartitionOf = known.PrimaryKey, known.ReplicaIdentity, known.PartitionOf
		for _, k := range known.IdentityKey {
			if slices.ContainsFunc(ch.Columns, func(c canonical.Column) bool { return c.Name == k }) {
				t.IdentityKey = append(t.IdentityKey, k)
			}
		}
	}
	p.tables[name] = t
	return t, true
}

// sameColumns reports whether a and b describe the same columns; the
// stream shares one slice per table version, which makes it cheap.
func sameColumns(a, b []canonical.Column) bool {
	if len(a) != len(b) {
		return false
	}
	if len(a) == 0 || &a[0] == &b[0] {
		return true
	}
	return slices.Equal(a, b)
}

func (p *capturePipe) send(ctx context.Context, rec canonical.Record) error {
	p.mu.Lock()
	for len(p.queue) >= pipeDepth/2 {
		p.writerWaits = true
		p.mu.Unlock()
		select {
		case <-p.writerWake:
		case <-p.gone:
			return errApplyStopped
		case <-ctx.Done():
			return context.Cause(ctx)
		}
		p.mu.Lock()
	}
	p.queue = append(p.queue, rec)
	wake := p.readerWaits && (!p.inTx || len(p.queue) >= pipeWakeRecords)
	if wake {
		p.readerWaits = false
	}
	p.mu.Unlock()
	if wake {
		signal(p.readerWake)
	}
	return nil
}

// signal wakes the side waiting on c (a channel of capacity 1).
func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// close ends the capture: err is why it stopped (nil for a clean stop).
func (p *capturePipe) close(err error) {
	p.mu.Lock()
	p.err, p.end, p.cut, p.closed = err, p.last, p.inTx, true
	wake := p.readerWaits
	p.readerWaits = false
	p.mu.Unlock()
	if wake {
		signal(p.readerWake)
	}
}

// abandon tells the capture that nothing reads any more.
func (p *capturePipe) abandon() { p.once.Do(func() { close(p.gone) }) }

// Next returns the next record; once the capture ended cleanly, an end
// record at its last commit, and errCaptureStopped when it ended with an
// error or inside a transaction, so that the apply side keeps only
// complete transactions.
func (p *capturePipe) Next() (canonical.Record, error) {
	if p.read == len(p.batch) && !p.take() {
		if p.cut || p.err != nil {
			return canonical.Record{}, errCaptureStopped
		}
		return canonical.Record{Type: canonical.RecordEnd, Position: p.end}, nil
	}
	rec := p.batch[p.read]
	p.batch[p.read] = canonical.Record{} // the apply side keeps what it needs
	p.read++
	return rec, nil
}

// take waits until records are queued and takes them all, handing the
// emptied batch back to the capture as its queue; it reports false when
// the capture ended with nothing queued.
func (p *capturePipe) take() bool {
	p.mu.Lock()
	for len(p.queue) == 0 && !p.closed {
		p.readerWaits = true
		p.mu.Unlock()
		<-p.readerWake
		p.mu.Lock()
	}
	if len(p.queue) == 0 {
		p.mu.Unlock()
		return false
	}
	p.batch, p.queue, p.read = p.queue, p.batch[:0], 0
	wake := p.writerWaits
	p.writerWaits = false
	p.mu.Unlock()
	if wake {
		signal(p.writerWake)
	}
	return true
}

// Buffered reports whether captured records wait.
func (p *capturePipe) Buffered() bool {
	if p.read < len(p.batch) {
		return true
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.queue) > 0
}
