package repository

// Restore: the chain that covers a target, read from the bucket into
// siphon's RestoreChain.

import (
	"context"
	"time"

	"github.com/siphondb/siphon"
	"github.com/siphondb/siphon/canonical"
)

// RestoreOptions says what Repository.Restore restores and how. The zero
// value restores the newest chain whole.
type RestoreOptions struct {
	// Chain names the chain to restore. Defaults to "": the newest chain
	// whose base backup was taken at or before Time and Position (the
	// newest chain when neither is set).
	Chain string
	// Time, when set, restores as of that time: the transactions that
	// committed at or before it (the source's commit timestamps), as
	// siphon.RestoreChainOptions.TargetTime. Defaults to the zero time:
	// no limit.
	Time time.Time
	// Position, when set, restores up to the last transaction whose commit
	// ends at or before it, as siphon.RestoreChainOptions.TargetPosition.
	// Defaults to zero: no limit.
	Position canonical.Position
	// Restore says how the base backup is restored (siphon.RestoreOptions;
	// its Database must be empty: the chain goes to the target Conn's
	// database). Defaults to siphon's defaults: an empty target, one job.
	Restore siphon.RestoreOptions
	// Apply says how the incrementals are applied (siphon.ApplyOptions).
	// A keyed repository's incrementals are authenticated with its stream
	// key: connect the target with Repository.StreamKey for their schema
	// changes to run. Defaults to the zero ApplyOptions.
	Apply siphon.ApplyOptions
}

// RestoreReport says what Repository.Restore restored.
type RestoreReport struct {
	// Chain is the chain restored; Links how many of its links were read
	// (those a Position target leaves out are not).
	Chain string
	Links int
	// Reached is the Position the target stands at: the end of the last
	// transaction applied.
	Reached canonical.Position
	// Covered is false when the target is past what the chain holds (a
	// Time after its last link was taken, a Position after its end): the
	// target then holds the whole chain, and the transactions between its
	// end and the target are in no backup of the repository.
	Covered bool
}

// Restore restores a chain into the target's database, which must be
// empty: the chain that covers opt.Time and opt.Position (or opt.Chain),
// read from the bucket into siphon's RestoreChain with those targets.
// Nothing is applied before every link was read from the bucket and
// checked: each object's size and SHA-256 against the manifest, in a keyed
// repository every segment's authentication (a changed, cut or swapped
// object is an *IntegrityError naming it), and the chain as siphon's
// VerifyChain checks it (a *siphon.ChainError). The links are then read a
// second time to restore them (a third for the incremental cut at a
// target). A target before the chosen chain's base is refused with
// siphon.ErrTargetBeforeBase; no chain taken at or before the target is
// ErrNoChain (wrapped). A chain whose manifest does not check out,
// met while looking for the chain to restore (newest first), stops the
// restore with its *IntegrityError rather than restoring an older chain:
// name the chain to restore with opt.Chain.
func (r *Repository) Restore(ctx context.Context, target *siphon.Conn, opt RestoreOptions) (_ *RestoreReport, err error) {
	defer r.in.call(ctx, "restore")(err)
	if err := r.use(); err != nil {
		return nil, err
	}
	if target == nil {
		return nil, errorf("repository: restore: the target Conn: %w", ErrNilArgument)
	}
	if opt.Restore.Database != "" {
		return nil, &OptionError{Option: "RestoreOptions.Restore.Database", Problem: "it is set",
			Fix: "connect the target Conn to the database to restore into: the incrementals are applied there"}
	}
	m, err := r.chooseChain(ctx, opt)
	if err != nil {
		return nil, errorf("repository: restore: %w", err)
	}
	n := len(m.Links)
	if opt.Position != 0 {
		// A link that starts at or after the target holds only later
		// transactions.
		for n > 1 && m.Links[n-1].Start >= opt.Position {
			n--
		}
	}
	readers := r.linkReaders(ctx, m, n)
	defer closeAll(readers)
	reached, err := target.RestoreChain(ctx, siphon.RestoreChainOptions{
		Restore: opt.Restore, TargetPosition: opt.Position, TargetTime: opt.Time, Apply: opt.Apply,
	}, asReadSeekers(readers)...)
	if err != nil {
		return nil, errorf("repository: restore chain %s: %w", m.Chain, err)
	}
	last := m.last()
	rep := &RestoreReport{Chain: m.Chain, Links: n, Reached: reached,
		Covered: (opt.Time.IsZero() || !opt.Time.After(last.Created)) && (opt.Position == 0 || opt.Position <= last.End)}
	r.log.Info("backup chain restored", "chain", m.Chain, "links", n, "position", reached)
	return rep, nil
}

// chooseChain returns the manifest of the chain a restore reads.
func (r *Repository) chooseChain(ctx context.Context, opt RestoreOptions) (*manifest, error) {
	if opt.Chain != "" {
		st, err := r.resolveChain(ctx, opt.Chain)
		if err != nil {
			return nil, err
		}
		return st.m, nil
	}
	states, err := r.loadChains(ctx)
	if err != nil {
		return nil, err
	}
	var oldest *manifest
	for i := len(states) - 1; i >= 0; i-- {
		m := states[i].m
		if states[i].err != nil {
			return nil, states[i].err // never fall back past a damaged chain
		}
		if states[i].tombstone || m == nil {
			continue
		}
		oldest = m
		base := m.Links[0]
		if (opt.Time.IsZero() || !base.Created.After(opt.Time)) && (opt.Position == 0 || base.Start <= opt.Position) {
			return m, nil
		}
	}
	if oldest == nil {
		return nil, noChain("the repository holds no chain")
	}
	return nil, noChain("no chain's base backup was taken at or before %s: the oldest chain, %s, starts at %v, taken at %s",
		describeTarget(opt.Time, opt.Position), oldest.Chain, oldest.Links[0].Start, oldest.Links[0].Created.UTC().Format(time.RFC3339Nano))
}
