package siphon

import (
	"context"
	"sync"
	"time"

	"github.com/siphondb/siphon/canonical"
)

// Replicate's progress reports.

// reportProgress calls opts.Progress every interval until stopped.
func (r *replicateRun) reportProgress(ctx context.Context, opts ReplicateOptions) (stop func()) {
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
		var last ReplicateProgress
		lastAt := time.Now()
		report := func(ctx context.Context, now time.Time) {
			p := r.progress(ctx, now)
			secs := max(now.Sub(lastAt).Seconds(), 1e-3)
			p.TransactionsPerSecond = float64(p.Transactions-last.Transactions) / secs
			p.ChangesPerSecond = float64(p.Changes-last.Changes) / secs
			if last.Applied != 0 && p.Applied > last.Applied {
				p.BytesPerSecond = float64(p.Applied-last.Applied) / secs
			}
			opts.Progress(p)
			last, lastAt = p, now
		}
		for {
			select {
			case <-done:
				ctx, cancel := cleanupContext(ctx)
				r.setPhase(ReplicateStopped)
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

// progress reads where the replica stands at now.
func (r *replicateRun) progress(ctx context.Context, now time.Time) ReplicateProgress {
	p := ReplicateProgress{
		Phase:    r.phase.Load().(ReplicatePhase),
		Received: canonical.Position(r.received.Load()), Applied: r.applied(),
		Transactions: r.txs.Load(), Changes: r.rows.Load(), RetainedWAL: -1,
	}
	r.mu.Lock()
	p.Snapshot = r.snapshot
	r.mu.Unlock()
	if commit := r.lastCommit.Load(); commit != 0 {
		p.LastCommit = time.Unix(0, commit)
	}
	r.mu.Lock()
	if len(r.pending) > 0 && !r.pending[0].at.IsZero() {
		p.Lag = max(0, now.Sub(r.pending[0].at))
	}
	r.mu.Unlock()
	if _, seconds := r.c.stats.streamLag(now); p.Lag == 0 && seconds > 0 {
		p.Lag = time.Duration(seconds * float64(time.Second)) // all it received is applied; the stream is behind
	}
	if end, _, err := r.c.insertPosition(ctx); err == nil {
		p.SourceEnd = end
		if p.Received > p.Applied {
			p.LagBytes = int64(end) - int64(p.Applied)
		}
	}
	var retained *int64
	if err := r.c.pool.QueryRow(ctx, `SELECT pg_catalog.pg_wal_lsn_diff(pg_catalog.pg_current_wal_insert_lsn(), restart_lsn)::int8
		FROM pg_replication_slots WHERE slot_name = $1`, r.c.opts.slot).Scan(&retained); err == nil && retained != nil {
		p.RetainedWAL = *retained
	}
	return p
}

// receive notes a transaction the stream delivered, for the lag.
func (r *replicateRun) receive(end txEnd) {
	r.received.Store(uint64(end.pos))
	r.c.stats.replicaReceived.Store(uint64(end.pos))
	r.mu.Lock()
	r.pending = append(r.pending, end)
	r.mu.Unlock()
}

// applyPending forgets the received transactions the target committed,
// up to the one that ends at applied.
func (r *replicateRun) applyPending(applied canonical.Position) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for n < len(r.pending) && r.pending[n].pos <= applied {
		n++
	}
	r.pending = append(r.pending[:0], r.pending[n:]...)
}

// snapshotProgress takes a table's copy progress into the initial
// snapshot's (the copy reports each table with its estimates first).
func (r *replicateRun) snapshotProgress(t Progress) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.tables == nil {
		r.tables = map[canonical.TableName]Progress{}
	}
	r.tables[t.Table] = t
	s := SnapshotProgress{Tables: len(r.tables), Table: t.Table}
	for _, tp := range r.tables {
		s.Rows, s.Bytes = s.Rows+tp.Rows, s.Bytes+tp.Bytes
		s.EstimatedRows, s.EstimatedBytes = s.EstimatedRows+tp.EstimatedRows, s.EstimatedBytes+tp.EstimatedBytes
		if tp.Done {
			s.TablesDone++
		}
	}
	r.snapshot = s
}
