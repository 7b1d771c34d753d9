package siphon

import (
	"context"
	"errors"
	"time"
)

// Work in the background on the apply session: the server runs a batch
// while the stream is read and decoded on. Jobs run one after another in
// the order they were started, each once the one before has ended; a job
// after one that failed is skipped. Every use of the session outside them
// waits for them all first (await). The last may be a COPY left open for
// the batches that follow (copyStream): starting other work, or waiting
// for it, ends that COPY first.
const (
	// maxBackgroundJobs bounds the jobs started and not awaited yet: one
	// running and those queued behind it, so that the server goes from one
	// batch to the next without waiting for the stream's decoding, which
	// runs ahead by up to this many batches.
	maxBackgroundJobs = 3
	// backgroundGrace is how long work running in the background on the
	// apply session (a COPY, statements sent ahead) goes on once ctx is
	// cancelled: long enough to end as it would have, so that the unit's
	// complete source transactions can still be committed (see fail).
	backgroundGrace = 5 * time.Second
)

// backgroundJob is one piece of work started in the background on the
// apply session.
type backgroundJob struct {
	finished chan struct{} // closed once the work has returned, or was skipped
	err      error         // the work's; set before finished is closed
}

// errAfterFailure is a skipped job's error; await reports the failure
// before it instead.
var errAfterFailure = errors.New("siphon: not run: the work before it failed")

// sendAhead sends the queued statements in the background, so that the
// server runs them while the stream is read on; unless, without send,
// other work runs there still: then they stay queued and go with the next
// (send is for a full queue). A statement whose rows are needed
// (stmtOwner.onRow) is sent by flush right after it is queued, never
// ahead.
func (s *applySession) sendAhead(ctx context.Context, send bool) error {
	if len(s.q.owners) == 0 || (!send && s.busy()) {
		return nil
	}
	batch := s.q.take()
	return s.inBackground(ctx, func(ctx context.Context) error { return batch.flush(ctx, s.pg) })
}

// inBackground starts work on the session in a goroutine, to run once the
// jobs started before it have ended, under a context that outlives ctx by
// backgroundGrace. Work that has not started when ctx is cancelled is
// skipped, and reports ctx's cause: the session stays usable, so that the
// unit's complete source transactions can be applied again (the grace is
// for work already on the server). With maxBackgroundJobs not awaited
// yet, it first waits for the oldest, and returns its error, if any, once
// all have ended.
func (s *applySession) inBackground(ctx context.Context, work func(context.Context) error) error {
	s.endCopy()
	if len(s.background) >= maxBackgroundJobs {
		oldest := s.background[0]
		<-oldest.finished
		s.background = s.background[1:]
		if oldest.err != nil {
			s.await()
			return oldest.err
		}
	}
	var before *backgroundJob
	if n := len(s.background); n > 0 {
		before = s.background[n-1]
	}
	job := &backgroundJob{finished: make(chan struct{})}
	go func() {
		defer close(job.finished)
		if before != nil {
			if <-before.finished; before.err != nil {
				job.err = errAfterFailure
				return
			}
		}
		if ctx.Err() != nil {
			job.err = context.Cause(ctx)
			return
		}
		bg, stop := afterGrace(ctx, backgroundGrace)
		defer stop()
		job.err = work(bg)
	}()
	s.background = append(s.background, job)
	return nil
}

// afterGrace returns a context for work ctx starts in the background: it
// is cancelled grace after ctx is, with ctx's cause, or when stop is called.
func afterGrace(ctx context.Context, grace time.Duration) (_ context.Context, stop func()) {
	bg, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	unwatch := context.AfterFunc(ctx, func() {
		time.AfterFunc(grace, func() { cancel(context.Cause(ctx)) })
	})
	return bg, func() {
		unwatch()
		cancel(nil)
	}
}

// busy reports whether work runs in the background and has not ended.
func (s *applySession) busy() bool {
	n := len(s.background)
	if n == 0 {
		return false
	}
	select {
	case <-s.background[n-1].finished: // jobs end in order: all have
		return false
	default:
		return true
	}
}

// runsAlone reports whether job is the first of the work started in the
// background that has not ended.
func (s *applySession) runsAlone(job *backgroundJob) bool {
	for _, before := range s.background {
		if before == job {
			return true
		}
		select {
		case <-before.finished:
		default:
			return false
		}
	}
	return false
}

// backgroundDone returns a channel closed once the work started in the
// background has ended (closed already when there is none). It ends the
// COPY left open, if any.
func (s *applySession) backgroundDone() <-chan struct{} {
	s.endCopy()
	if n := len(s.background); n > 0 {
		return s.background[n-1].finished
	}
	return closedChan()
}

// await ends the COPY left open, if any, waits for the work started in
// the background, and returns the first error of it.
func (s *applySession) await() error {
	s.endCopy()
	var first error
	for _, job := range s.background {
		<-job.finished
		if first == nil && job.err != nil {
			first = job.err
		}
	}
	s.background = nil
	return first
}
