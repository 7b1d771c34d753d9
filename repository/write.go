package repository

// Writing chains: a base backup starts one, incrementals continue it, and
// each is added by a new manifest generation written last.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/siphondb/siphon"
	"github.com/siphondb/siphon/canonical"
)

// StartChainOptions says how Repository.StartChain takes the chain's base
// backup. The zero value dumps the whole database as siphon's Conn.Backup
// does by default.
type StartChainOptions struct {
	// Backup says what the base backup dumps and how, as for
	// siphon.Conn.Backup (tables, schemas, pg_dump's compression, jobs,
	// pg_dump, temporary directory). StartChain sets its StartChain and
	// BaseSlot itself: the base anchors the source's persistent slot and
	// makes a physical base slot, which the chain keeps until Expire
	// removes it. Previous must be left empty.
	Backup siphon.BackupOptions
}

// StartChain starts a new chain with a base backup of src (siphon's
// Conn.Backup, with StartChain and BaseSlot), streamed into the bucket as
// pg_dump writes it: the object holds pg_dump's archive as it is (a person
// can pg_restore it, see the package documentation), encrypted in a keyed
// repository, and the envelope's header and trailer go to the manifest.
// The chain exists once its first manifest is written, last: a StartChain
// that fails or is killed leaves no chain that Chains lists (and no base
// slot: siphon's base slot is temporary until the backup completes, and
// StartChain drops it when what follows fails). It returns the new chain.
func (r *Repository) StartChain(ctx context.Context, src *siphon.Conn, opt StartChainOptions) (_ *Chain, err error) {
	defer r.in.call(ctx, "start_chain")(err)
	if err := r.use(); err != nil {
		return nil, err
	}
	if src == nil {
		return nil, errorf("repository: start chain: the source Conn: %w", ErrNilArgument)
	}
	if opt.Backup.Previous != "" {
		return nil, &OptionError{Option: "StartChainOptions.Backup.Previous", Problem: "it is set",
			Fix: "leave it empty: a chain starts with its base backup, and AddLink continues it"}
	}
	id := newChainID(time.Now())
	body := canonical.BodyPgDumpCustom
	if opt.Backup.Jobs > 1 {
		body = canonical.BodyPgDumpDirectoryTar
	}
	name := linkObjectName(id, 1, canonical.KindDump, body, false, r.Encrypted())
	prog := r.uploadProgress(ctx, id, 1, name, true)
	ow, err := r.newObjectWriter(ctx, name, kindDump, false, prog)
	if err != nil {
		return nil, errorf("repository: start chain %s: %w", id, err)
	}
	bopt := opt.Backup
	bopt.StartChain, bopt.BaseSlot = true, true
	sp, err := r.backupInto(ctx, src, bopt, ow)
	if err != nil {
		ow.abort()
		return nil, errorf("repository: start chain %s: %w", id, err)
	}
	// From here the base slot is complete: drop it on any failure.
	dropBase := func(cause error) error {
		if sp.base == nil {
			return cause
		}
		if derr := src.DropSlot(context.WithoutCancel(ctx), sp.base.Slot); derr != nil {
			return errors.Join(cause, fmt.Errorf("drop the base slot %s of the chain that failed: %w", sp.base.Slot, derr))
		}
		return cause
	}
	if err := ow.commit(); err != nil {
		return nil, errorf("repository: start chain %s: %w", id, dropBase(err))
	}
	m := r.firstManifest(id, name, ow, sp)
	if err := r.writeManifest(ctx, m); err != nil {
		r.deleteQuietly(ctx, name)
		return nil, errorf("repository: start chain %s: %w", id, dropBase(err))
	}
	r.in.upload(ctx, kindDump, ow.stored)
	r.log.Info("backup chain started", "chain", id, "position", m.Links[0].Start, "base_slot", m.BaseSlot, "bytes", ow.plain)
	return chainOf(m, nil), nil
}

// split is what backupInto read of a base backup's envelope.
type split struct {
	head    []byte
	header  canonical.EnvelopeHeader
	trailer canonical.EnvelopeTrailer
	base    *canonical.EnvelopeBase
}

// backupInto runs src.Backup and writes the body of the envelope it
// writes into ow, keeping the header lines and the trailer.
func (r *Repository) backupInto(ctx context.Context, src *siphon.Conn, opt siphon.BackupOptions, ow *objectWriter) (*split, error) {
	es := newEnvelopeSplitter(ow)
	if err := src.Backup(ctx, opt, es); err != nil {
		return nil, err // siphon dropped the base slot of a failed backup
	}
	sp, err := es.split()
	if err != nil && es.header.Base != nil {
		// Backup completed its base slot: nothing will list it.
		err = errors.Join(err, src.DropSlot(context.WithoutCancel(ctx), es.header.Base.Slot))
	}
	return sp, err
}

// firstManifest is generation 1 of a chain: its base.
func (r *Repository) firstManifest(id, name string, ow *objectWriter, s *split) *manifest {
	h := s.header
	now := time.Now().UTC()
	rec := linkRecord{
		N: 1, Kind: canonical.KindDump, Body: h.Body, Object: name, Encrypted: r.Encrypted(),
		Start: h.Start, End: h.Start, Link: s.trailer.Link(), Previous: h.Previous,
		Created: h.Created, Written: now, Bytes: ow.plain, StoredBytes: ow.stored, SHA256: ow.checksum(),
		Tables:   h.Tables,
		Envelope: &envelopeRecord{Head: string(s.head), Trailer: s.trailer, Base: s.base},
	}
	m := &manifest{
		Format: manifestFormat, Version: manifestVersion, Chain: id, Generation: 1, Written: now, Writer: r.writer,
		SystemID: h.SystemID, Timeline: h.Timeline, Slot: h.Slot, ServerVersion: h.ServerVersion,
		Links: []linkRecord{rec},
	}
	if s.base != nil {
		m.BaseSlot = s.base.Slot
	}
	if k := r.keys.current(); k != nil {
		m.KeyID = fmt.Sprintf("%x", k.id)
		m.StreamKeyID = canonical.KeyID(k.stream)
	}
	return m
}

// AddLink continues a chain with an incremental backup of src (siphon's
// Conn.BackupIncrementalAfter from the chain's last link), compressed with
// zstd and, in a keyed repository, encrypted, streamed into the bucket,
// then adds it with a new manifest generation. chain names the chain; ""
// means the newest. src must read the chain's source (the same cluster,
// timeline and slot: a *MismatchError otherwise), and in a keyed
// repository be connected with Repository.StreamKey, so that the link is
// authenticated (a *MismatchError before anything is added otherwise).
// A link that fails, or whose process is killed, is never listed: its
// object, if complete, is an orphan that Expire removes. Another writer
// that added to the chain meanwhile makes it a *ConflictError. It returns
// the chain as it now stands.
func (r *Repository) AddLink(ctx context.Context, src *siphon.Conn, chain string) (_ *Chain, err error) {
	defer r.in.call(ctx, "add_link")(err)
	if err := r.use(); err != nil {
		return nil, err
	}
	if src == nil {
		return nil, errorf("repository: add link: the source Conn: %w", ErrNilArgument)
	}
	st, err := r.resolveChain(ctx, chain)
	if err != nil {
		return nil, errorf("repository: add link: %w", err)
	}
	m := st.m
	last := m.last()
	n := len(m.Links) + 1
	name := linkObjectName(m.Chain, n, canonical.KindIncremental, canonical.BodyJSONL, true, r.Encrypted())
	ow, err := r.newObjectWriter(ctx, name, kindIncremental, true, r.uploadProgress(ctx, m.Chain, n, name, false))
	if err != nil {
		return nil, errorf("repository: add link to chain %s: %w", m.Chain, err)
	}
	scan := newJSONLScanner(func(h jsonlHeader) error { return r.checkLinkHeader(m, h) })
	next, err := src.BackupIncrementalAfter(ctx, siphon.ChainLink{End: last.End, Link: last.Link}, tapWriter{scan: scan, obj: ow})
	if err != nil {
		ow.abort()
		var mismatch *MismatchError
		if errors.As(err, &mismatch) {
			return nil, mismatch
		}
		return nil, errorf("repository: add link to chain %s: %w", m.Chain, err)
	}
	if err := ow.commit(); err != nil {
		return nil, errorf("repository: add link to chain %s: %w", m.Chain, err)
	}
	if scan.header == nil {
		r.deleteQuietly(ctx, name)
		return nil, errorf("repository: add link to chain %s: the incremental has no header", m.Chain)
	}
	next2 := r.nextManifest(m, name, ow, scan, last, next)
	if err := r.writeManifest(ctx, next2); err != nil {
		r.deleteQuietly(ctx, name)
		return nil, errorf("repository: add link to chain %s: %w", m.Chain, err)
	}
	r.in.upload(ctx, kindIncremental, ow.stored)
	r.log.Info("backup chain link added", "chain", m.Chain, "link", n, "start", last.End, "end", next.End, "bytes", ow.plain)
	return chainOf(next2, st.verified), nil
}

// checkLinkHeader vets an incremental's header against its chain before
// anything of it is kept.
func (r *Repository) checkLinkHeader(m *manifest, h jsonlHeader) error {
	fix := "connect src to the chain's source database with the chain's slot (siphon.WithSlot), or start a new chain"
	switch {
	case h.SystemID != m.SystemID:
		return &MismatchError{Chain: m.Chain, What: "system identifier", Want: m.SystemID, Got: h.SystemID, Fix: fix}
	case h.Timeline != m.Timeline:
		return &MismatchError{Chain: m.Chain, What: "timeline", Want: fmt.Sprint(m.Timeline), Got: fmt.Sprint(h.Timeline),
			Fix: "the source changed timelines (a failover): start a new chain"}
	case h.Slot != m.Slot:
		return &MismatchError{Chain: m.Chain, What: "slot", Want: m.Slot, Got: h.Slot, Fix: fix}
	}
	if k := r.keys.current(); k != nil {
		if want := canonical.KeyID(k.stream); h.KeyID != want {
			return &MismatchError{Chain: m.Chain, What: "stream key", Want: want, Got: h.KeyID,
				Fix: "connect src with the repository's stream key, siphon.Connect(ctx, dsn, repo.StreamKey(), ...), so that its links are authenticated"}
		}
	}
	return nil
}

// nextManifest is m with the incremental just written added.
func (r *Repository) nextManifest(m *manifest, name string, ow *objectWriter, scan *jsonlScanner, last *linkRecord, next siphon.ChainLink) *manifest {
	now := time.Now().UTC()
	rec := linkRecord{
		N: len(m.Links) + 1, Kind: canonical.KindIncremental, Body: canonical.BodyJSONL, Object: name,
		Compression: "zstd", Encrypted: r.Encrypted(),
		Start: last.End, End: next.End, Link: next.Link, Previous: last.Link,
		Created: scan.header.Created, Written: now, Bytes: ow.plain, StoredBytes: ow.stored, SHA256: ow.checksum(),
		Tables: scan.tables, Transactions: scan.tx, SchemaChanges: scan.ddl, FirstCommit: scan.first, LastCommit: scan.last,
		StreamKeyID: scan.header.KeyID,
	}
	out := *m
	out.Generation, out.Written, out.Writer = rec.N, now, r.writer
	out.Links = append(append([]linkRecord(nil), m.Links...), rec)
	return &out
}

// writeManifest writes a manifest generation, once: a conditional write
// that fails when the generation exists, then a read back that checks it
// is this one (for buckets that ignore the condition).
func (r *Repository) writeManifest(ctx context.Context, m *manifest) error {
	data, err := encodeManifest(m)
	if err != nil {
		return err
	}
	if r.beforeManifest != nil {
		r.beforeManifest(m.Chain, m.Generation)
	}
	name := manifestName(m.Chain, m.Generation, r.Encrypted())
	err = r.putSmall(ctx, name, data, roleManifest, kindManifest, true)
	if err != nil && !errors.Is(err, errAlreadyExists) {
		return err
	}
	got, rerr := r.readManifest(ctx, m.Chain, m.Generation, name)
	if errors.Is(err, errAlreadyExists) || rerr == nil && (got.Writer != m.Writer || !got.Written.Equal(m.Written)) {
		conflict := &ConflictError{Chain: m.Chain, Generation: m.Generation}
		if rerr == nil {
			conflict.Writer = got.Writer
		}
		return conflict
	}
	return rerr
}

// readManifest reads and checks generation gen of chain id's manifest.
func (r *Repository) readManifest(ctx context.Context, id string, gen int, name string) (*manifest, error) {
	data, err := r.getSmall(ctx, name, roleManifest, kindManifest, maxManifest)
	if err != nil {
		return nil, err
	}
	m, err := decodeManifest(data)
	if err == nil {
		err = m.check(id, gen)
	}
	if err != nil {
		return nil, &IntegrityError{Object: name, Problem: err.Error()}
	}
	for i := range m.Links {
		if r.Encrypted() && !m.Links[i].Encrypted {
			return nil, &IntegrityError{Object: name, Problem: fmt.Sprintf("it lists link %d as not encrypted, in a repository opened WithKey", i+1)}
		}
	}
	return m, nil
}

// deleteQuietly deletes an object a failed call wrote; what it cannot
// delete, Expire removes as an orphan.
func (r *Repository) deleteQuietly(ctx context.Context, name string) {
	if err := r.bucket.Delete(context.WithoutCancel(ctx), name); err != nil && !isNotFound(err) {
		r.log.Warn("could not delete the object of a failed call; the next Expire removes it", "object", name, "err", err)
		return
	}
	r.in.deleted(ctx, 1)
}

// uploadProgress returns the progress counter of an upload (nil without
// WithProgress). The estimate of a base is the previous base's size.
func (r *Repository) uploadProgress(ctx context.Context, chain string, link int, name string, base bool) *progressCounter {
	if r.in.progress == nil {
		return nil
	}
	p := Progress{Op: "upload", Chain: chain, Link: link, Object: name}
	if base {
		if chains, err := r.Chains(ctx); err == nil {
			for i := len(chains) - 1; i >= 0; i-- {
				if chains[i].Err == nil && len(chains[i].Links) > 0 {
					p.EstimatedBytes = chains[i].Links[0].Bytes
					break
				}
			}
		}
	}
	return &progressCounter{in: r.in, p: p}
}
