package repository

// Retention: chains the policy no longer keeps are removed, with their
// base slots on the source, and what failed calls left is swept.

import (
	"context"
	"fmt"
	"strings"
	"time"

	"gocloud.dev/blob"

	"github.com/siphondb/siphon"
)

// ExpireOptions is a retention policy: which chains Repository.Expire
// keeps. A chain is kept when any rule keeps it; the newest chain is
// always kept. At least one of KeepChains and KeepFor must be set.
type ExpireOptions struct {
	// KeepChains keeps the newest KeepChains chains. Defaults to 0: no
	// rule by count.
	KeepChains int
	// KeepFor keeps every chain whose newest link was written within
	// KeepFor: every point in time since then stays restorable. Defaults
	// to 0: no rule by age.
	KeepFor time.Duration
	// OrphansAfter is how old an object no manifest lists (the link of a
	// call that failed, was killed, or lost a ConflictError; the base of a
	// chain that never got a manifest) must be before Expire deletes it:
	// longer than any upload takes, so that a link being added is not
	// taken for one. Defaults to 24 hours.
	OrphansAfter time.Duration
	// DryRun reports what would be removed and removes nothing.
	DryRun bool
}

// ExpireReport says what Repository.Expire did (or, with DryRun, would
// do).
type ExpireReport struct {
	// Kept and Expired list chain ids, oldest first.
	Kept, Expired []string
	// DroppedSlots lists the base slots dropped on the source.
	DroppedSlots []string
	// Orphans lists the orphan objects deleted.
	Orphans []string
	// Skipped lists chains left alone because their manifest does not
	// check out (see Chain.Err): look at them by hand.
	Skipped []string
	// DeletedObjects counts every object deleted.
	DeletedObjects int
}

// Expire applies a retention policy: it removes the chains opt does not
// keep, oldest first, and drops each one's base slot on src, the source
// (the slot pins WAL for the chain), then deletes the orphan objects older
// than opt.OrphansAfter. The newest chain is never removed, nor a chain
// whose manifest does not check out. A chain is removed in an order that
// a killed Expire cannot leave half-listed: a tombstone object first (the
// chain leaves listings at once), the base slot, its objects, the
// tombstone last; the next Expire finishes what a killed one began.
// An *OptionError for a policy that keeps everything by omission (neither
// KeepChains nor KeepFor) or negative values, before anything is done.
func (r *Repository) Expire(ctx context.Context, src *siphon.Conn, opt ExpireOptions) (_ *ExpireReport, err error) {
	defer r.in.call(ctx, "expire")(err)
	if err := r.use(); err != nil {
		return nil, err
	}
	if err := opt.check(); err != nil {
		return nil, err
	}
	if src == nil && !opt.DryRun {
		return nil, errorf("repository: expire: the source Conn (which drops the base slots): %w", ErrNilArgument)
	}
	if opt.OrphansAfter == 0 {
		opt.OrphansAfter = 24 * time.Hour
	}
	states, err := r.loadChains(ctx)
	if err != nil {
		return nil, errorf("repository: expire: %w", err)
	}
	rep := &ExpireReport{}
	expire, keep := opt.decide(states, time.Now(), rep)
	for _, st := range expire {
		rep.Expired = append(rep.Expired, st.id)
		if opt.DryRun {
			continue
		}
		if err := r.removeChain(ctx, src, st, rep); err != nil {
			return rep, errorf("repository: expire chain %s: %w", st.id, err)
		}
	}
	for _, st := range keep {
		rep.Kept = append(rep.Kept, st.id)
	}
	if err := r.sweepOrphans(ctx, states, opt, rep); err != nil {
		return rep, errorf("repository: expire: %w", err)
	}
	return rep, nil
}

func (o ExpireOptions) check() error {
	switch {
	case o.KeepChains < 0:
		return &OptionError{Option: "ExpireOptions.KeepChains", Problem: fmt.Sprintf("%d", o.KeepChains), Fix: "give 0 (no rule by count) or more"}
	case o.KeepFor < 0:
		return &OptionError{Option: "ExpireOptions.KeepFor", Problem: o.KeepFor.String(), Fix: "give 0 (no rule by age) or more"}
	case o.OrphansAfter < 0:
		return &OptionError{Option: "ExpireOptions.OrphansAfter", Problem: o.OrphansAfter.String(), Fix: "give 0 (24 hours) or more"}
	case o.KeepChains == 0 && o.KeepFor == 0:
		return &OptionError{Option: "ExpireOptions", Problem: "neither KeepChains nor KeepFor is set",
			Fix: "say what to keep: the newest KeepChains chains, and/or the chains written within KeepFor"}
	}
	return nil
}

// decide splits the chains into those to expire and those to keep;
// tombstoned chains (an Expire that was stopped) are expired again.
func (o ExpireOptions) decide(states []*chainState, now time.Time, rep *ExpireReport) (expire, keep []*chainState) {
	var valid []*chainState
	for _, st := range states {
		switch {
		case st.tombstone:
			expire = append(expire, st)
		case st.err != nil:
			rep.Skipped = append(rep.Skipped, st.id)
		case st.m != nil:
			valid = append(valid, st)
		}
	}
	for i, st := range valid {
		newest := i == len(valid)-1
		byCount := o.KeepChains > 0 && i >= len(valid)-o.KeepChains
		byAge := o.KeepFor > 0 && now.Sub(st.m.last().Written) < o.KeepFor
		if newest || byCount || byAge {
			keep = append(keep, st)
		} else {
			expire = append(expire, st)
		}
	}
	return expire, keep
}

// removeChain removes one chain: tombstone, base slot, objects, tombstone.
func (r *Repository) removeChain(ctx context.Context, src *siphon.Conn, st *chainState, rep *ExpireReport) error {
	prefix := chainPrefix(st.id)
	if !st.tombstone {
		if err := r.bucket.WriteAll(ctx, prefix+tombstoneName, []byte(`{"expired":"`+time.Now().UTC().Format(time.RFC3339Nano)+`"}`+"\n"), nil); err != nil {
			return fmt.Errorf("write its tombstone: %w", err)
		}
	}
	if st.m != nil && st.m.BaseSlot != "" {
		if err := src.DropSlot(ctx, st.m.BaseSlot); err != nil {
			return fmt.Errorf("drop its base slot %s: %w", st.m.BaseSlot, err)
		}
		rep.DroppedSlots = append(rep.DroppedSlots, st.m.BaseSlot)
		r.log.Info("base slot dropped", "chain", st.id, "slot", st.m.BaseSlot)
	}
	objs, err := r.list(ctx, prefix, false)
	if err != nil {
		return err
	}
	// Manifests last but the tombstone: a listing never shows part of the
	// chain even without the tombstone.
	var manifests []string
	for _, o := range objs {
		base := baseName(o.Key)
		if base == tombstoneName {
			continue
		}
		if _, _, ok := parseManifestName(base); ok {
			manifests = append(manifests, o.Key)
			continue
		}
		if err := r.delete(ctx, o.Key, rep); err != nil {
			return err
		}
	}
	for i := len(manifests) - 1; i >= 0; i-- {
		if err := r.delete(ctx, manifests[i], rep); err != nil {
			return err
		}
	}
	if err := r.delete(ctx, prefix+tombstoneName, rep); err != nil {
		return err
	}
	r.log.Info("backup chain expired", "chain", st.id, "objects", len(objs))
	return nil
}

func (r *Repository) delete(ctx context.Context, key string, rep *ExpireReport) error {
	if err := r.bucket.Delete(ctx, key); err != nil && !isNotFound(err) {
		return fmt.Errorf("delete %s: %w", key, err)
	}
	rep.DeletedObjects++
	r.in.deleted(ctx, 1)
	return nil
}

// sweepOrphans deletes the objects no manifest lists, once older than
// opt.OrphansAfter, in the folders of kept chains and of chains that never
// got a manifest.
func (r *Repository) sweepOrphans(ctx context.Context, states []*chainState, opt ExpireOptions, rep *ExpireReport) error {
	cutoff := time.Now().Add(-opt.OrphansAfter)
	for _, st := range states {
		if st.tombstone || st.err != nil {
			continue
		}
		listed := map[string]bool{}
		if st.m != nil {
			for _, l := range st.m.Links {
				listed[l.Object] = true
			}
		}
		for _, o := range st.objects {
			if listed[o.Key] || !isOrphanCandidate(o, st.m == nil) || !o.ModTime.Before(cutoff) {
				continue
			}
			rep.Orphans = append(rep.Orphans, o.Key)
			if opt.DryRun {
				continue
			}
			if err := r.delete(ctx, o.Key, rep); err != nil {
				return err
			}
		}
	}
	return nil
}

// isOrphanCandidate reports whether an object is a link object (numbered,
// "0003-incr-..."), or any object of a folder without a manifest.
func isOrphanCandidate(o *blob.ListObject, noManifest bool) bool {
	base := baseName(o.Key)
	if noManifest {
		return true
	}
	return len(base) > 5 && base[4] == '-' && strings.Trim(base[:4], "0123456789") == ""
}
