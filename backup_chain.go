package siphon

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/siphondb/siphon/canonical"
)

// Chain restore: a base backup restored with Restore, then the incrementals
// that continue it applied in order with ConsumeCanonical, up to an optional
// point in time.

// RestoreChainOptions says how [Conn.RestoreChain] restores a chain and how
// far it goes. The zero value restores the whole chain into the Conn's
// database, which must be empty.
type RestoreChainOptions struct {
	// Restore says how the base backup is restored, as for [Conn.Restore];
	// its Database must be empty: the whole chain goes to the Conn's
	// database, where the incrementals are applied.
	Restore RestoreOptions
	// TargetPosition, when set, stops the restore at the last transaction
	// whose commit ends at or before it (a Position read from the source,
	// such as pg_current_wal_insert_lsn() right after a commit, or one a
	// change stream reported). It may not be before the base backup's
	// Position. Defaults to zero: no limit.
	TargetPosition canonical.Position
	// TargetTime, when set, stops the restore at the last transaction that
	// committed at or before it (the source's commit timestamp). Defaults
	// to the zero time: no limit. With both targets, a transaction is
	// applied only when it is within both.
	TargetTime time.Time
	// Apply says how the incrementals are applied, as for
	// [Conn.ConsumeCanonicalWith], and which links the verification that
	// comes first accepts: one without checksums only with Apply.Unchecked,
	// one with schema changes no key of the Conn authenticates only with
	// Apply.UnauthenticatedSchemaChanges. Defaults to the zero
	// [ApplyOptions].
	Apply ApplyOptions
}

// hasTarget reports whether the options limit the restore.
func (o RestoreChainOptions) hasTarget() bool { return o.TargetPosition != 0 || !o.TargetTime.IsZero() }

// within reports whether a transaction that ends at pos and committed at
// at is within the target.
func (o RestoreChainOptions) within(pos canonical.Position, at time.Time) bool {
	if o.TargetPosition != 0 && pos > o.TargetPosition {
		return false
	}
	return o.TargetTime.IsZero() || !at.After(o.TargetTime)
}

// RestoreChain restores a chain of backups into the Conn's database: the
// first link, a full backup from [Conn.Backup], with [Conn.Restore], then
// the incrementals that follow it, from [Conn.BackupIncremental] (checked
// JSONL, or JSONL in an envelope), in order, with
// [Conn.ConsumeCanonicalWith]. It returns the Position the database then
// stands at: the end of the last transaction applied (the base's Position
// when none was).
//
// Before anything is restored, the whole chain is read and checked as
// [Conn.VerifyChain] does: a chain that does not verify (a link damaged,
// missing, repeated or out of order, from another cluster or timeline) is
// refused with a [*ChainError] naming the first bad link, and the target
// is left untouched. So is a chain with a schema change in an incremental
// that is not authenticated with one of the Conn's keys ([WithStreamKey]),
// or with an unauthenticated link after an authenticated one: restoring an
// incremental runs its schema changes as statements on the target (see
// [ApplyOptions].UnauthenticatedSchemaChanges), as restoring the base runs
// the SQL of its dump, which no key authenticates: keep the base where only
// trusted writers reach. That is why the links are io.ReadSeekers: each is
// read from its current offset to verify it, then sought back there and
// read again to restore it (an incremental cut at a target is read a third
// time, to find the cut first). Pass *os.File or *bytes.Reader values;
// nothing is spooled or held in memory.
//
// With a TargetPosition or TargetTime in opt, the restore is a
// point-in-time restore at transaction granularity: transactions are
// applied in commit order up to the first that is past the target, which
// and all after it are not; the incremental holding it is applied through
// a filter that passes its table records and the complete transactions
// before the cut, then ends the stream at the last one's commit. A target
// past the chain's end restores the whole chain; compare the returned
// Position with the target to tell. A TargetPosition before the base's
// Position, or a TargetTime before the base was taken (its envelope's
// Created), is refused with [ErrTargetBeforeBase], before anything is
// restored. Sequences are not transactional, so the restore cannot put
// them where they were at the target: it sets them as they were at the
// end of the link that is cut, ahead of where the source had them at the
// target, never behind (target >= source), so the restored database never
// hands out a value the source had used.
//
// On an error after the base was restored, the database holds the base
// and the transactions applied before the error ([Conn.AppliedPosition]
// says up to where), and the returned Position is that of the last link
// applied whole.
func (c *Conn) RestoreChain(ctx context.Context, opt RestoreChainOptions, links ...io.ReadSeeker) (canonical.Position, error) {
	switch {
	case opt.Restore.Database != "":
		return 0, &OptionError{Option: "RestoreChainOptions", Problem: "Restore.Database is set",
			Fix: "connect to the target database instead: the incrementals are applied to the Conn's database"}
	case len(links) == 0:
		return 0, errorf("siphon: restore chain: no link given: %w", ErrNilArgument)
	}
	rules := c.rules(opt.Apply)
	chain, rewind, err := verifyLinks(ctx, links, rules)
	if err != nil {
		c.countError(ctx, err) // the calls below count their own
		return 0, err
	}
	if opt.TargetPosition != 0 && opt.TargetPosition < chain.Start {
		return 0, errorf("siphon: restore chain refused, nothing was restored: %w: target %v, base at %v",
			ErrTargetBeforeBase, opt.TargetPosition, chain.Start)
	}
	if base := chain.Links[0].Created; !opt.TargetTime.IsZero() && opt.TargetTime.Before(base) {
		return 0, errorf("siphon: restore chain refused, nothing was restored: %w: target time %v, base taken at %v",
			ErrTargetBeforeBase, opt.TargetTime.UTC().Format(time.RFC3339Nano), base.UTC().Format(time.RFC3339Nano))
	}
	if err := rewind(0); err != nil {
		return 0, err
	}
	if err := c.Restore(ctx, opt.Restore, links[0]); err != nil {
		return 0, errorf("siphon: restore chain, link 1: %w", err)
	}
	reached := chain.Start
	for i := 1; i < len(links); i++ {
		if err := rewind(i); err != nil {
			return reached, err
		}
		end, whole, err := c.applyLink(ctx, opt, rules, links[i], chain.Links[i], func() error { return rewind(i) })
		if err != nil {
			return reached, errorf("siphon: restore chain, link %d: %w", i+1, err)
		}
		if !end.IsZero() {
			reached = end
		}
		if !whole {
			c.log.Info("backup chain restored to a target", "position", reached, "links", i+1)
			return reached, nil
		}
	}
	c.log.Info("backup chain restored", "position", reached, "links", len(links))
	return reached, nil
}

// verifyLinks verifies the chain links form from their current offsets,
// with the call's rules, and returns its report and a function that seeks
// link i back there.
func verifyLinks(ctx context.Context, links []io.ReadSeeker, rules streamRules) (*ChainReport, func(i int) error, error) {
	offsets := make([]int64, len(links))
	for i, r := range links {
		off, err := r.Seek(0, io.SeekCurrent)
		if err != nil {
			return nil, nil, errorf("siphon: restore chain, link %d: %w", i+1, err)
		}
		offsets[i] = off
	}
	rewind := func(i int) error {
		if _, err := links[i].Seek(offsets[i], io.SeekStart); err != nil {
			return errorf("siphon: restore chain, link %d: seek back to read it again: %w", i+1, err)
		}
		return nil
	}
	chain, err := verifyChain(ctx, links, rules)
	if err != nil {
		return nil, nil, errorf("siphon: restore chain: %w", err)
	}
	if err := brokenLink(chain); err != nil {
		return nil, nil, err
	}
	return chain, rewind, nil
}

// brokenLink returns a *ChainError for the first bad link of a chain, as
// VerifyChain found them, or nil when the chain verified and starts with a
// dump.
func brokenLink(chain *ChainReport) error {
	for i, problems := range chain.byLink {
		if i == 0 && chain.Links[0].Kind != canonical.KindDump {
			problems = append(problems, fmt.Sprintf("link 1: is a %s: a chain starts with a full backup (a dump)", chain.Links[0].Kind))
		}
		if len(problems) > 0 {
			return &ChainError{Link: i + 1, Problems: problems, Report: chain}
		}
	}
	if !chain.OK {
		return &ChainError{Link: 1, Problems: chain.Problems, Report: chain}
	}
	return nil
}

// applyLink applies one incremental, whole or up to the target, and returns
// where it ended (zero when it applied nothing) and whether it was applied
// whole (the next link may follow).
func (c *Conn) applyLink(ctx context.Context, opt RestoreChainOptions, rules streamRules, r io.Reader, rep *VerifyReport, rewind func() error) (canonical.Position, bool, error) {
	cut, whole := rep.End, true
	if opt.hasTarget() && !(opt.TargetTime.IsZero() && rep.End <= opt.TargetPosition) {
		body, err := linkBody(ctx, r, rep)
		if err != nil {
			return 0, false, err
		}
		if cut, whole, err = findCut(body, opt); err != nil {
			return 0, false, fmt.Errorf("find the target: %w", err)
		}
		if err := rewind(); err != nil {
			return 0, false, err
		}
	}
	if !whole && cut.IsZero() {
		return 0, false, nil // the first transaction is past the target
	}
	body, err := linkBody(ctx, r, rep)
	if err != nil {
		return 0, false, err
	}
	if whole {
		return rep.End, true, c.ConsumeCanonicalWith(ctx, opt.Apply, body)
	}
	return cut, false, c.consumeUpTo(ctx, opt.Apply, rules, body, cut)
}

// linkBody returns the JSONL of an incremental, reading it out of its
// envelope when it has one.
func linkBody(ctx context.Context, r io.Reader, rep *VerifyReport) (io.Reader, error) {
	r = &ctxReader{ctx: ctx, r: r}
	if !rep.Enveloped {
		return r, nil
	}
	er := canonical.NewEnvelopeReader(r)
	if _, err := er.Header(); err != nil {
		return nil, err
	}
	return er, nil
}

// findCut reads an incremental and returns the end of the last transaction
// within the target before the first past it (zero when the first one is
// past it), and whether there was none past it.
func findCut(body io.Reader, opt RestoreChainOptions) (cut canonical.Position, whole bool, err error) {
	d := canonical.NewDecoder(body)
	if _, err := d.Header(); err != nil {
		return 0, false, err
	}
	var committed time.Time
	for {
		rec, err := d.Next()
		if err == io.EOF {
			return cut, true, nil
		}
		if err != nil {
			return 0, false, err
		}
		if rec.Type != canonical.RecordChange {
			continue
		}
		switch ch := rec.Change; ch.Op {
		case canonical.OpBegin:
			committed = ch.CommitTime
		case canonical.OpCommit:
			if !ch.CommitTime.IsZero() {
				committed = ch.CommitTime
			}
			if !opt.within(ch.Position, committed) {
				return cut, false, nil
			}
			cut = ch.Position
		}
	}
}

// consumeUpTo applies an incremental up to the commit that ends at cut:
// a goroutine of the call re-encodes its records up to there into a pipe
// that ConsumeCanonical reads, then an end record at cut.
func (c *Conn) consumeUpTo(ctx context.Context, opt ApplyOptions, rules streamRules, body io.Reader, cut canonical.Position) error {
	pr, pw := io.Pipe()
	filtered := make(chan error, 1)
	go func() {
		err := copyUpTo(body, pw, cut, rules, &c.opts)
		pw.CloseWithError(err) // nil: the reader sees EOF
		filtered <- err
	}()
	err := c.ConsumeCanonicalWith(ctx, opt, pr)
	pr.CloseWithError(errConsumerDone)
	ferr := <-filtered
	switch {
	case err != nil:
		return err // holds ferr when the filter failed first: the pipe passes it on
	case ferr != nil:
		return fmt.Errorf("filter the incremental: %w", ferr)
	}
	return nil
}

// copyUpTo copies a JSONL stream's header, table records and changes to w
// up to the commit that ends at cut, then the stream's sequences (read at
// its end, so at or after the cut), then writes an end record at cut. A
// stream authenticated with one of the rules' keys is written
// authenticated with the Conn's current key (of o), having been verified
// as it is read: its schema changes stay the key holder's. Any other is
// written unauthenticated.
func copyUpTo(body io.Reader, w io.Writer, cut canonical.Position, rules streamRules, o *options) error {
	d := rules.newDecoder(body)
	h, err := d.Header()
	if err != nil {
		return err
	}
	h.End = 0 // the end record carries the cut
	enc := canonical.NewEncoder(w)
	if d.Authenticated() {
		enc = o.newEncoder(w)
	}
	if err := enc.WriteHeader(h); err != nil {
		return err
	}
	for {
		rec, err := d.Next()
		if err == io.EOF || (err == nil && rec.Type == canonical.RecordEnd) {
			return fmt.Errorf("the stream ended before the commit at %v", cut)
		}
		if err != nil {
			return err
		}
		if err := enc.WriteRecord(rec); err != nil {
			return err
		}
		if rec.Type == canonical.RecordChange && rec.Change.Op == canonical.OpCommit && rec.Change.Position == cut {
			return copySequences(d, enc, cut)
		}
	}
}

// copySequences reads the rest of a stream, writes its sequences to enc,
// then an end record at cut.
func copySequences(d *canonical.Decoder, enc *canonical.Encoder, cut canonical.Position) error {
	for {
		rec, err := d.Next()
		switch {
		case err == io.EOF:
			return enc.WriteEnd(cut)
		case err != nil:
			return err
		case rec.Type == canonical.RecordSequence:
			if err := enc.WriteSequence(*rec.Sequence); err != nil {
				return err
			}
		}
	}
}
