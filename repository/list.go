package repository

// Listing: the chains and their links, as their newest manifests say.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"gocloud.dev/blob"

	"github.com/siphondb/siphon/canonical"
)

// Chain is a chain of backups as its newest manifest describes it: a base
// backup, then the incrementals that continue it.
type Chain struct {
	// ID names the chain: the UTC time it was started, to the
	// millisecond, and 6 random characters ("20261201T100000.000Z-k3m9x2");
	// ids sort by time, and Chains lists them in that order.
	ID string
	// Generation is the newest manifest's generation: the number of links.
	Generation int
	// SystemID, Timeline and Slot identify the source and its persistent
	// slot; ServerVersion is the source's version.
	SystemID      string
	Timeline      uint32
	Slot          string
	ServerVersion string
	// BaseSlot is the physical slot that pins the chain's WAL on the
	// source, dropped when the chain is expired.
	BaseSlot string
	// Start is the base backup's Position, End the last link's.
	Start, End canonical.Position
	// Created is when the base backup was taken (the earliest time a
	// restore from this chain can reach); Covered is when the last link
	// was taken (it holds the transactions committed up to then), and
	// Updated when it was written.
	Created, Covered, Updated time.Time
	// Links are the chain's links, the base first.
	Links []Link
	// StoredBytes is the size of the chain's link objects in the bucket.
	StoredBytes int64
	// Encrypted is true when the chain's objects are encrypted; KeyID
	// names the master key they were written with.
	Encrypted bool
	KeyID     string
	// Verified is the newest verification of the chain (Repository.Verify),
	// nil when it was never verified. A verification of an earlier
	// generation covers the links it had then.
	Verified *Verification
	// Err is set, and the rest empty, for a chain whose manifest could
	// not be read: it did not check out (an *IntegrityError naming it), or
	// it is encrypted and the repository was opened without a key (an
	// error wrapping ErrNeedsKey). Such a chain is not restored nor
	// expired.
	Err error
}

// Link is one link of a chain.
type Link struct {
	// N is the link's number, from 1 (the base backup).
	N int
	// Kind is canonical.KindDump for the base, KindIncremental after it.
	Kind canonical.Kind
	// Object is the object's key in the bucket, under the repository's
	// prefix.
	Object string
	// Start and End are where the link starts and ends on the source's
	// timeline (equal for the base).
	Start, End canonical.Position
	// Created is when the backup began on the source, Written when its
	// object was complete.
	Created, Written time.Time
	// FirstCommit and LastCommit are the commit times of an incremental's
	// first and last transactions (zero when it holds none).
	FirstCommit, LastCommit time.Time
	// Transactions and SchemaChanges count an incremental's transactions
	// and schema changes.
	Transactions, SchemaChanges int64
	// Bytes is the plaintext size (a dump's archive, an incremental's
	// JSONL), StoredBytes the object's size in the bucket.
	Bytes, StoredBytes int64
	// Tables are the tables the link holds: a dump's tables, or those an
	// incremental changed or described.
	Tables []canonical.TableName
	// Authenticated is true for an incremental authenticated with a
	// stream key (StreamKeyID names it), which lets a restore run its
	// schema changes.
	Authenticated bool
	StreamKeyID   string
	// Link and Previous are the link's chain identity and the previous
	// link's (siphon.ChainLink).
	Link, Previous string
	// Compression is "zstd" for an incremental, "" for a dump (stored as
	// pg_dump compressed it); Encrypted is true in a keyed repository.
	Compression string
	Encrypted   bool
}

// Verification is the result of a Repository.Verify of a chain, kept in
// the bucket.
type Verification struct {
	// At is when it ran; Generation the manifest generation it verified.
	At         time.Time
	Generation int
	// OK is true when every link checked out and they form one chain.
	OK       bool
	Problems []string
}

// verificationRecord is a Verification as stored.
type verificationRecord struct {
	Format     string    `json:"format"`
	Chain      string    `json:"chain"`
	Generation int       `json:"generation"`
	At         time.Time `json:"at"`
	OK         bool      `json:"ok"`
	Problems   []string  `json:"problems,omitempty"`
}

const verificationFormat = "siphon-repository-verification/1"

// chainState is what the bucket holds of one chain.
type chainState struct {
	id        string
	m         *manifest // nil: no manifest (yet), or it did not check out
	err       error
	tombstone bool
	verified  *Verification
	objects   []*blob.ListObject
}

// Chains lists the repository's chains, oldest first, each as its newest
// manifest describes it, with its newest verification. A chain whose
// manifest does not check out is listed with Err set; a chain whose base
// never got a manifest (a StartChain that failed or was killed), or that
// is being expired, is not listed. It reads one manifest and at most one
// verification record per chain.
func (r *Repository) Chains(ctx context.Context) (_ []*Chain, err error) {
	defer r.in.call(ctx, "list")(err)
	if err := r.use(); err != nil {
		return nil, err
	}
	states, err := r.loadChains(ctx)
	if err != nil {
		return nil, errorf("repository: list chains: %w", err)
	}
	var out []*Chain
	for _, st := range states {
		switch {
		case st.tombstone:
		case st.err != nil:
			out = append(out, &Chain{ID: st.id, Err: st.err})
		case st.m != nil:
			out = append(out, chainOf(st.m, st.verified))
		}
	}
	return out, nil
}

// Chain returns chain id as Chains lists it; ErrNoChain (wrapped) when it
// does not exist.
func (r *Repository) Chain(ctx context.Context, id string) (_ *Chain, err error) {
	defer r.in.call(ctx, "list")(err)
	if err := r.use(); err != nil {
		return nil, err
	}
	st, err := r.resolveChain(ctx, id)
	if err != nil {
		return nil, errorf("repository: chain %s: %w", id, err)
	}
	return chainOf(st.m, st.verified), nil
}

// chainIDs lists the ids of the chain folders, sorted.
func (r *Repository) chainIDs(ctx context.Context) ([]string, error) {
	objs, err := r.list(ctx, chainsDir, true)
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, o := range objs {
		if !o.IsDir {
			continue
		}
		id := strings.TrimSuffix(strings.TrimPrefix(o.Key, chainsDir), "/")
		if validChainID(id) {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids, nil
}

// loadChains loads every chain folder's state, in id order.
func (r *Repository) loadChains(ctx context.Context) ([]*chainState, error) {
	ids, err := r.chainIDs(ctx)
	if err != nil {
		return nil, err
	}
	var out []*chainState
	for _, id := range ids {
		st, err := r.loadChain(ctx, id)
		if err != nil {
			return nil, err
		}
		out = append(out, st)
	}
	return out, nil
}

// loadChain reads chain id's folder: its newest manifest, its newest
// verification, whether it is being expired. An error is returned only
// when the bucket could not be read; a manifest that does not check out is
// the state's err.
func (r *Repository) loadChain(ctx context.Context, id string) (*chainState, error) {
	objs, err := r.list(ctx, chainPrefix(id), false)
	if err != nil {
		return nil, err
	}
	st := &chainState{id: id, objects: objs}
	newest, newestName := 0, ""
	verified := ""
	for _, o := range objs {
		base := baseName(o.Key)
		if base == tombstoneName {
			st.tombstone = true
		}
		if gen, _, ok := parseManifestName(base); ok && gen > newest {
			newest, newestName = gen, o.Key
		}
		if strings.HasPrefix(base, verifiedPrefix) && base > baseName(verified) {
			verified = o.Key
		}
	}
	if newest == 0 {
		return st, nil
	}
	m, err := r.readManifest(ctx, id, newest, newestName)
	if err != nil {
		if _, ok := err.(*IntegrityError); !ok && !isNotFound(err) && !errors.Is(err, ErrNeedsKey) {
			return nil, err
		}
		st.err = err
		return st, nil
	}
	st.m = m
	if verified != "" {
		st.verified = r.readVerification(ctx, id, verified)
	}
	return st, nil
}

// resolveChain loads chain id, or the newest chain for "", and requires
// its manifest.
func (r *Repository) resolveChain(ctx context.Context, id string) (*chainState, error) {
	if id == "" {
		states, err := r.loadChains(ctx)
		if err != nil {
			return nil, err
		}
		for i := len(states) - 1; i >= 0; i-- {
			if st := states[i]; !st.tombstone && st.m != nil {
				return st, nil
			}
		}
		return nil, noChain("the repository holds no chain: start one with StartChain")
	}
	if !validChainID(id) {
		return nil, noChain("%q is not a chain id (such as 20261201T100000.000Z-k3m9x2)", id)
	}
	st, err := r.loadChain(ctx, id)
	switch {
	case err != nil:
		return nil, err
	case st.tombstone:
		return nil, noChain("chain %s was expired", id)
	case st.err != nil:
		return nil, st.err
	case st.m == nil:
		return nil, noChain("chain %s does not exist (or its base backup never completed)", id)
	}
	return st, nil
}

// readVerification reads a verification record; one that does not check
// out counts as none (and is logged).
func (r *Repository) readVerification(ctx context.Context, id, name string) *Verification {
	data, err := r.getSmall(ctx, name, roleObject, kindRecord, 1<<20)
	var rec verificationRecord
	if err == nil {
		err = json.Unmarshal(data, &rec)
	}
	if err == nil && (rec.Format != verificationFormat || rec.Chain != id) {
		err = fmt.Errorf("it is not a verification of chain %s", id)
	}
	if err != nil {
		r.log.Warn("a verification record does not check out; ignored", "object", name, "err", err)
		return nil
	}
	return &Verification{At: rec.At, Generation: rec.Generation, OK: rec.OK, Problems: rec.Problems}
}

// chainOf describes a manifest as a Chain.
func chainOf(m *manifest, v *Verification) *Chain {
	c := &Chain{
		ID: m.Chain, Generation: m.Generation, SystemID: m.SystemID, Timeline: m.Timeline, Slot: m.Slot,
		ServerVersion: m.ServerVersion, BaseSlot: m.BaseSlot, Start: m.Links[0].Start, End: m.last().End,
		Created: m.Links[0].Created, Covered: m.last().Created, Updated: m.last().Written,
		Encrypted: m.KeyID != "", KeyID: m.KeyID, Verified: v,
	}
	for _, l := range m.Links {
		c.StoredBytes += l.StoredBytes
		c.Links = append(c.Links, Link{
			N: l.N, Kind: l.Kind, Object: l.Object, Start: l.Start, End: l.End, Created: l.Created, Written: l.Written,
			FirstCommit: l.FirstCommit, LastCommit: l.LastCommit, Transactions: l.Transactions, SchemaChanges: l.SchemaChanges,
			Bytes: l.Bytes, StoredBytes: l.StoredBytes, Tables: l.Tables, Authenticated: l.StreamKeyID != "",
			StreamKeyID: l.StreamKeyID, Link: l.Link, Previous: l.Previous, Compression: l.Compression, Encrypted: l.Encrypted,
		})
	}
	return c
}
