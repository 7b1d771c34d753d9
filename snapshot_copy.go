package siphon

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"

	"github.com/siphondb/siphon/canonical"
	"github.com/siphondb/siphon/internal/pgerr"
)

// How copied rows travel from the copying sessions to the consumer.
const (
	batchRows      = 1024      // rows per batch, at most
	batchValues    = 8192      // values per batch, at most (wide rows)
	batchBytes     = 128 << 10 // text bytes per batch before it is sent
	keepBatchBytes = 1 << 20   // larger buffers are not reused
	progressEvery  = 250 * time.Millisecond
)

// span locates one value's text in a batch's buffer; start -1 is NULL.
type span struct{ start, end int32 }

// rowBatch carries rows of one task from a copying session to the
// consumer. The last batch of a task is empty, with done set.
type rowBatch struct {
	task      *copyTask
	buf       []byte // the values' text, back to back
	spans     []span
	vals      []canonical.Value // rows*columns values, once sealed
	rows      int
	last      CTID // the ctid of the last row
	copyBytes int64
	done      bool
}

var batchPool = sync.Pool{New: func() any { return new(rowBatch) }}

func newBatch(t *copyTask) *rowBatch {
	b := batchPool.Get().(*rowBatch)
	b.task, b.buf, b.spans, b.vals = t, b.buf[:0], b.spans[:0], b.vals[:0]
	b.rows, b.copyBytes, b.done = 0, 0, false
	return b
}

func (b *rowBatch) recycle() {
	if cap(b.buf) > keepBatchBytes {
		b.buf = nil
	}
	clear(b.vals) // let the strings go
	b.task = nil
	batchPool.Put(b)
}

// seal turns the batch's text into values: one string for the whole batch,
// which the values share.
func (b *rowBatch) seal() {
	s := string(b.buf)
	for _, sp := range b.spans {
		if sp.start < 0 {
			b.vals = append(b.vals, canonical.Null())
		} else {
			b.vals = append(b.vals, canonical.Text(s[sp.start:sp.end]))
		}
	}
}

// copyRun is one CopyTables call: the plan, the copying sessions
// (workers) and the consumer, which runs on the caller's goroutine.
//
// Tasks are handed out in order (table by table) to workers, each of which
// first takes a token; the consumer returns a task's token once it has read
// the task's last batch. The consumer reads one group (table) at a time, so
// workers that run ahead block on the later group's bounded channel, and
// the tokens bound how many tasks run ahead. Every task of the group being
// read was handed out before any task of a later group, so the consumer
// never waits for a task that no worker can start.
type copyRun struct {
	c        *Conn
	snapshot string
	position canonical.Position
	groups   []*copyGroup
	tasks    []*copyTask
	// marks is true when checkpoints need every row's ctid (see
	// CopyOptions.Checkpoint); otherwise a task's rows count only once it is done.
	marks  bool
	next   atomic.Int64
	tokens chan struct{}
}

// copyTables runs a copy of schema's tables in snapshot s. A table the
// role may not read is a *PrivilegeError with its GRANT.
func (c *Conn) copyTables(ctx context.Context, s *Snapshot, schema *canonical.Schema, fn RowFunc, cfg CopyOptions) (err error) {
	defer func(ctx context.Context) {
		if pgerr.Is(err, pgerrcode.InsufficientPrivilege) {
			ctx, cancel := cleanupContext(ctx)
			defer cancel()
			err = explainTablePrivileges(ctx, c.pool, err, schemaTables(schema), []string{"SELECT"}, "snapshots: copying each table's rows")
		}
	}(ctx)
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	lead, err := c.newSession(ctx)
	if err != nil {
		return err
	}
	run := &copyRun{c: c, snapshot: s.Name(), position: s.Position(), marks: cfg.Checkpoint != nil}
	sessions, err := run.plan(ctx, lead, schema, cfg)
	if err != nil {
		closeSession(lead.PgConn())
		return err
	}
	workers := min(sessions, len(run.tasks))
	if workers == 0 {
		closeSession(lead.PgConn())
		return run.consume(ctx, fn, cfg)
	}
	// At most 2*workers tasks run ahead of the consumer, so at most that
	// many groups hold batches: about 2*workers² batches in all.
	run.tokens = make(chan struct{}, 2*workers)
	for _, g := range run.groups {
		g.batches = make(chan *rowBatch, workers)
	}
	var wg sync.WaitGroup
	// The workers are stopped and joined however consume ends, a panicking
	// fn included.
	defer func() {
		cancel(err)
		wg.Wait()
	}()
	for i := range workers {
		wg.Go(func() {
			conn := lead
			if i > 0 {
				var err error
				if conn, err = c.newSession(ctx); err != nil {
					cancel(err)
					return
				}
			}
			defer closeSession(conn.PgConn())
			if err := run.work(ctx, conn, i == 0); err != nil {
				cancel(err)
			}
		})
	}
	return run.consume(ctx, fn, cfg)
}

// plan imports the snapshot in the lead session, checks and locks the
// tables, and splits the work into tasks. It returns how many sessions may
// copy.
func (r *copyRun) plan(ctx context.Context, lead *pgx.Conn, schema *canonical.Schema, cfg CopyOptions) (int, error) {
	if err := importSnapshot(ctx, lead, r.snapshot); err != nil {
		return 0, err
	}
	groups, err := planGroups(ctx, lead, schema)
	if err != nil {
		return 0, err
	}
	var rels []*relPlan
	for _, g := range groups {
		rels = append(rels, g.rels...)
	}
	if len(rels) > 0 {
		if err := lockRelations(ctx, lead, rels); err != nil {
			return 0, err
		}
		if err := r.c.checkCurrent(ctx, rels); err != nil {
			return 0, err
		}
	}
	if err := planResume(groups, r.position, cfg); err != nil {
		return 0, err
	}
	var headroom int
	var blockSize int64
	err = r.c.pool.QueryRow(ctx, `
SELECT pg_catalog.current_setting('max_connections')::int - pg_catalog.current_setting('superuser_reserved_connections')::int
       - (SELECT pg_catalog.count(*) FROM pg_stat_activity WHERE backend_type = 'client backend')::int,
       pg_catalog.current_setting('block_size')::int8`).Scan(&headroom, &blockSize)
	if err != nil {
		return 0, fmt.Errorf("read server limits: %w", err)
	}
	// The lead session is open (and counted); open no more than leaves two
	// connections for others.
	sessions := max(1, min(r.c.opts.copySessions, 1+headroom-2))
	for _, g := range groups {
		for _, rel := range g.rels {
			g.progress.EstimatedRows += rel.snap.estRows
			g.progress.EstimatedBytes += rel.snap.size
		}
	}
	r.groups, r.tasks = groups, planTasks(groups, sessions, blockSize)
	return sessions, nil
}

// work runs tasks in one session until none is left. The lead session
// imported the snapshot and locked every relation during planning.
func (r *copyRun) work(ctx context.Context, conn *pgx.Conn, lead bool) error {
	if !lead {
		if err := importSnapshot(ctx, conn, r.snapshot); err != nil {
			return err
		}
	}
	locked := map[*relPlan]bool{}
	for {
		select {
		case r.tokens <- struct{}{}:
		case <-ctx.Done():
			return context.Cause(ctx)
		}
		i := int(r.next.Add(1) - 1)
		if i >= len(r.tasks) {
			<-r.tokens
			return nil
		}
		t := r.tasks[i]
		if !lead && !locked[t.rel] {
			if err := lockRelationNoWait(ctx, conn, t.rel); err != nil {
				return err
			}
			locked[t.rel] = true
		}
		if err := r.copyTask(ctx, conn, t); err != nil {
			return err
		}
	}
}

// copyTask copies one ctid range with binary COPY, parsing the stream as it
// arrives and sending batches of rows to the task's group.
func (r *copyRun) copyTask(ctx context.Context, conn *pgx.Conn, t *copyTask) error {
	g := t.rel.group
	p := &copyParser{kinds: t.rel.kinds, withCTID: r.marks, lo: t.from, hi: t.to, b: newBatch(t)}
	p.row = func() error {
		if p.b.rows < batchRows && len(p.b.spans) < batchValues && len(p.b.buf) < batchBytes {
			return nil
		}
		if err := send(ctx, g, p.b); err != nil {
			return err
		}
		p.b = newBatch(t)
		return nil
	}
	if _, err := conn.PgConn().CopyTo(ctx, p, t.copySQL(r.marks)); err != nil {
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		var schemaErr *SchemaIncompatibleError
		if errors.As(err, &schemaErr) {
			return err
		}
		return fmt.Errorf("copy %s: %w", t.rel.name, err)
	}
	if !p.ended {
		return fmt.Errorf("copy %s: the binary COPY stream ended without its trailer", t.rel.name)
	}
	if p.b.rows > 0 {
		if err := send(ctx, g, p.b); err != nil {
			return err
		}
	} else {
		p.b.recycle()
	}
	done := newBatch(t)
	done.done = true
	return send(ctx, g, done)
}

// send hands a batch to the consumer.
func send(ctx context.Context, g *copyGroup, b *rowBatch) error {
	b.seal()
	select {
	case g.batches <- b:
		return nil
	case <-ctx.Done():
		b.recycle()
		return context.Cause(ctx)
	}
}

// consume delivers the rows group by group on the caller's goroutine, with
// progress reports and checkpoints.
func (r *copyRun) consume(ctx context.Context, fn RowFunc, cfg CopyOptions) error {
	var lastCheckpoint time.Time
	checkpoint := func(final bool) error {
		if cfg.Checkpoint == nil || (!final && time.Since(lastCheckpoint) < cfg.CheckpointInterval) {
			return nil
		}
		lastCheckpoint = time.Now()
		return cfg.Checkpoint(r.checkpoint())
	}
	report := func(p Progress) {
		if f := r.c.opts.progress; f != nil {
			f(p)
		}
		if cfg.progress != nil {
			cfg.progress(p)
		}
	}
	if cfg.progress != nil {
		for _, g := range r.groups {
			cfg.progress(g.progress)
		}
	}
	for _, g := range r.groups {
		for _, rel := range g.rels {
			if rel.restart != nil {
				if err := cfg.Restart(*rel.restart); err != nil {
					return fmt.Errorf("restart %s: %w", rel.name, err)
				}
			}
		}
		var lastReport time.Time
		width := len(g.table.Columns)
		for left := g.tasks; left > 0; {
			var b *rowBatch
			select {
			case b = <-g.batches:
			case <-ctx.Done():
				return context.Cause(ctx)
			}
			t := b.task
			if b.done {
				t.done = true
				left--
				b.recycle()
				<-r.tokens
				if err := checkpoint(false); err != nil {
					return err
				}
				continue
			}
			for i := range b.rows {
				row := b.vals[i*width : (i+1)*width : (i+1)*width]
				if err := fn(g.table, row); err != nil {
					b.recycle()
					return err
				}
			}
			t.started, t.reached = true, b.last.next()
			g.progress.Rows += int64(b.rows)
			g.progress.Bytes += b.copyBytes
			b.recycle()
			if time.Since(lastReport) >= progressEvery {
				lastReport = time.Now()
				report(g.progress)
			}
			if err := checkpoint(false); err != nil {
				return err
			}
		}
		g.progress.Done = true
		report(g.progress)
	}
	return checkpoint(true)
}

// checkpoint describes what the consumer has delivered so far.
func (r *copyRun) checkpoint() *CopyCheckpoint {
	cp := &CopyCheckpoint{Position: r.position}
	for _, g := range r.groups {
		for _, rel := range g.rels {
			e := rel.checkpoint.clone()
			done := true
			for _, t := range rel.tasks {
				switch {
				case t.done:
					e.Copied = addRange(e.Copied, CTIDRange{From: t.from, To: t.to})
				case t.started:
					e.Copied = addRange(e.Copied, CTIDRange{From: t.from, To: t.reached})
					done = false
				default:
					done = false
				}
			}
			if done {
				e.Done, e.Copied = true, nil
			}
			cp.Position = min(cp.Position, e.Position)
			cp.Tables = append(cp.Tables, e)
		}
	}
	return cp
}
