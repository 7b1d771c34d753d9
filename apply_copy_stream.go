package siphon

import (
	"context"
	"fmt"

	"github.com/siphondb/siphon/canonical"
)

// copyStream is a COPY of inserts into one table left open in the
// background and fed batch by batch: the server goes from one batch to
// the next without a round trip, so it waits for the client only when
// the client is slower than the COPY. Any other use of the session ends
// it first (endCopy, from inBackground and await).
type copyStream struct {
	b    *binding
	feed chan copyBatch
	job  *backgroundJob
}

// copyBatch is a batch of rows to copy, and the source transaction being
// read when it was queued (see stmtOwner.tx).
type copyBatch struct {
	rows []canonical.Row
	tx   canonical.Position
}

// copyFeedDepth is how many batches wait in a copyStream's feed. Batches
// go into it only while its COPY runs alone (the work before it has
// ended): then, with the one the COPY sends, maxBackgroundJobs batches are
// in flight, as with as many jobs. Once the COPY is ended, the jobs queued
// behind it add at most maxBackgroundJobs-1 batches more.
const copyFeedDepth = maxBackgroundJobs - 1

// streamCopy copies rows into b's table in the background: into the COPY
// left open for that table, if any, when it runs alone and no statement
// waits in the queue (it must go first); else in a COPY opened for them,
// after what is queued, and left open for the batches that follow. Once
// ctx is done, the COPY left open fails rather than wait for more rows
// (see copyReader.nextRow): it ends at once, and the session stays usable.
func (s *applySession) streamCopy(ctx context.Context, b *binding, table *canonical.Table, rows []canonical.Row, tx canonical.Position) error {
	if cs := s.copying; cs != nil && cs.b == b && len(s.q.owners) == 0 && s.runsAlone(cs.job) {
		select {
		case cs.feed <- copyBatch{rows: rows, tx: tx}:
			return nil
		case <-cs.job.finished: // failed: the feed is never read again
			if err := s.await(); err != nil {
				return err
			}
		}
	}
	// What is queued goes first: both run in the background, after what
	// runs there, while the stream is read on.
	sql := s.copyQuery(b)
	if err := s.sendAhead(ctx, true); err != nil {
		return err
	}
	feed := make(chan copyBatch, copyFeedDepth)
	rd := &copyReader{table: table, first: rows, tx: tx, feed: feed, feedUntil: ctx}
	if err := s.copyInBackground(ctx, sql, rd, b); err != nil {
		return err
	}
	s.copying = &copyStream{b: b, feed: feed, job: s.background[len(s.background)-1]}
	return nil
}

// copyInBackground starts sql, a COPY from rd into b's table (see
// copyQuery), in the background: the stream is read on meanwhile. rd must
// read nothing but memory it owns. Its error is a stmtError, as a queued
// statement's is, naming the rows it read and the source transaction of
// the last batch it read.
func (s *applySession) copyInBackground(ctx context.Context, sql string, rd *copyReader, b *binding) error {
	return s.inBackground(ctx, func(ctx context.Context) error {
		err := copyFromGuarded(ctx, s.pg, rd, sql)
		if rd.err != nil {
			return rd.err
		}
		if err != nil {
			return &stmtError{err: err, owner: stmtOwner{op: canonical.OpInsert, table: b.source, tx: rd.tx,
				label: fmt.Sprintf("copy %d inserts into %s", rd.count, b.source)}}
		}
		return nil
	})
}

// endCopy ends the COPY left open, if any: it ends once it has sent what
// its feed holds.
func (s *applySession) endCopy() {
	if s.copying != nil {
		close(s.copying.feed)
		s.copying = nil
	}
}
