package repository

// Verification: every link of a chain read back from the bucket, checked
// object by object (size, SHA-256, authentication) and by siphon's
// VerifyStreamChain (envelope, pg_restore --list, a full decode of each
// incremental, the chain's contiguity), against the manifest.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/siphondb/siphon"
)

// VerifyOptions says how Repository.Verify and VerifyAll check chains.
// The zero value checks with the repository's keys and records the result
// in the bucket.
type VerifyOptions struct {
	// StreamKeys are stream keys of your own (siphon.WithStreamKey's),
	// for a repository without a key whose sources' Conns had keys: they
	// authenticate the incrementals, whose schema changes are otherwise a
	// problem. A keyed repository uses its own stream keys, and these too.
	// Defaults to none.
	StreamKeys [][]byte
	// ReadOnly leaves no verification record in the bucket (Chain.Verified
	// stays as it was). Defaults to false: the result is recorded.
	ReadOnly bool
}

// VerifyReport says what Repository.Verify found in a chain.
type VerifyReport struct {
	Chain string
	// Generation is the manifest generation verified: its number of links.
	Generation int
	// OK is true when every object checked out, every link verified and
	// they form one chain, as the manifest says.
	OK bool
	// Problems says what is wrong, each naming the link or the object.
	Problems []string
	// Report is siphon's report of the chain; nil when an object was
	// refused before siphon could read the chain to its end.
	Report *siphon.ChainReport
}

// Verify reads every link of a chain back from the bucket and checks it:
// each object's size and SHA-256 against the manifest, in a keyed
// repository every segment's authentication, then the links as siphon's
// VerifyStreamChain does (the base's envelope and pg_restore --list, a
// full decode of each incremental with its checksums and authentication,
// the chain's contiguity and identity), and that each link is where the
// manifest says. chain names the chain; "" means the newest. Problems go
// in the report (OK false); Verify returns an error only when it could
// not check: the bucket failed, ctx ended, pg_restore is missing. Unless
// opt.ReadOnly, the result is recorded in the bucket, for Chains.
func (r *Repository) Verify(ctx context.Context, chain string, opt VerifyOptions) (_ *VerifyReport, err error) {
	defer r.in.call(ctx, "verify")(err)
	if err := r.use(); err != nil {
		return nil, err
	}
	st, err := r.resolveChain(ctx, chain)
	if err != nil {
		var integrity *IntegrityError
		if errors.As(err, &integrity) {
			return &VerifyReport{Chain: chain, Problems: []string{integrity.Error()}}, nil
		}
		return nil, errorf("repository: verify: %w", err)
	}
	rep, err := r.verifyChain(ctx, st.m, opt)
	if err != nil {
		return nil, errorf("repository: verify chain %s: %w", st.m.Chain, err)
	}
	if !opt.ReadOnly {
		if err := r.recordVerification(ctx, rep); err != nil {
			return rep, errorf("repository: verify chain %s: record the result: %w", st.m.Chain, err)
		}
	}
	return rep, nil
}

// VerifyAll verifies every chain Chains lists, oldest first, as Verify
// does; a chain whose manifest does not check out gets a report with that
// problem.
func (r *Repository) VerifyAll(ctx context.Context, opt VerifyOptions) ([]*VerifyReport, error) {
	chains, err := r.Chains(ctx)
	if err != nil {
		return nil, err
	}
	var out []*VerifyReport
	for _, c := range chains {
		if c.Err != nil {
			out = append(out, &VerifyReport{Chain: c.ID, Problems: []string{c.Err.Error()}})
			continue
		}
		rep, err := r.Verify(ctx, c.ID, opt)
		if err != nil {
			return out, err
		}
		out = append(out, rep)
	}
	return out, nil
}

// verifyChain reads the chain m describes and checks it.
func (r *Repository) verifyChain(ctx context.Context, m *manifest, opt VerifyOptions) (*VerifyReport, error) {
	rep := &VerifyReport{Chain: m.Chain, Generation: m.Generation}
	readers := r.linkReaders(ctx, m, len(m.Links))
	defer closeAll(readers)
	keys := append(r.keys.streamKeys(), opt.StreamKeys...)
	cr, err := siphon.VerifyStreamChain(ctx, siphon.VerifyOptions{Keys: keys}, asReadSeekers(readers)...)
	if err != nil {
		var integrity *IntegrityError
		if !errors.As(err, &integrity) {
			return nil, err
		}
		rep.Problems = append(rep.Problems, integrity.Error())
		return rep, nil
	}
	rep.Report = cr
	rep.Problems = append(rep.Problems, cr.Problems...)
	for i, l := range cr.Links {
		rec := &m.Links[i]
		if l.Start != rec.Start || l.End != rec.End || l.Link != rec.Link {
			rep.Problems = append(rep.Problems, fmt.Sprintf("link %d (%s): it runs from %v to %v with link %s; the manifest says %v to %v with link %s",
				i+1, rec.Object, l.Start, l.End, l.Link, rec.Start, rec.End, rec.Link))
		}
		if i > 0 && r.Encrypted() && !l.Authenticated {
			rep.Problems = append(rep.Problems, fmt.Sprintf("link %d (%s): it is not authenticated with the repository's stream key", i+1, rec.Object))
		}
	}
	rep.OK = len(rep.Problems) == 0
	return rep, nil
}

// recordVerification keeps a verification's result in the bucket.
func (r *Repository) recordVerification(ctx context.Context, rep *VerifyReport) error {
	now := time.Now().UTC()
	data, err := json.MarshalIndent(verificationRecord{Format: verificationFormat, Chain: rep.Chain, Generation: rep.Generation,
		At: now, OK: rep.OK, Problems: rep.Problems}, "", "  ")
	if err != nil {
		return err
	}
	return r.putSmall(ctx, verifiedName(rep.Chain, now, r.Encrypted()), data, roleObject, kindRecord, false)
}

// linkReaders returns readers of the first n links of m.
func (r *Repository) linkReaders(ctx context.Context, m *manifest, n int) []*linkReader {
	out := make([]*linkReader, n)
	for i := range n {
		out[i] = r.newLinkReader(ctx, m.Chain, m.Links[i])
	}
	return out
}

func asReadSeekers(ls []*linkReader) []io.ReadSeeker {
	out := make([]io.ReadSeeker, len(ls))
	for i, l := range ls {
		out[i] = l
	}
	return out
}

func closeAll(ls []*linkReader) {
	for _, l := range ls {
		l.Close()
	}
}

// OpenLink returns a reader of link n (1: the base) of a chain ("": the
// newest), as siphon reads it: a base backup's envelope (siphon's
// Conn.Restore and Verify read it), an incremental's JSONL (a
// canonical.Decoder, Conn.ConsumeCanonical). It is checked as it is read
// (see IntegrityError) and seeks only to its start or where it stands.
// Close it.
func (r *Repository) OpenLink(ctx context.Context, chain string, n int) (io.ReadSeekCloser, error) {
	if err := r.use(); err != nil {
		return nil, err
	}
	st, err := r.resolveChain(ctx, chain)
	if err != nil {
		return nil, errorf("repository: open link: %w", err)
	}
	if n < 1 || n > len(st.m.Links) {
		return nil, errorf("repository: open link: %w", noChain("chain %s has links 1 to %d, not %d", st.m.Chain, len(st.m.Links), n))
	}
	return r.newLinkReader(ctx, st.m.Chain, st.m.Links[n-1]), nil
}
