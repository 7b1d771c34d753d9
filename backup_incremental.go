package siphon

import (
	"context"
	"io"
	"time"

	"github.com/siphondb/siphon/canonical"
)

// Incremental backups: bounded runs of the change stream, written as
// checked canonical JSONL that chains onto the backup it continues.

// BackupIncremental writes, as canonical JSONL (kind incremental), every
// transaction committed after since and at or before a bound read when it
// starts, and none after, then returns the end Position of the last
// transaction written (since itself when there was none): the since of the
// next incremental. A transaction still open at the bound belongs to the
// next incremental. A zero since means "where the slot stands". It is
// [Conn.BackupIncrementalAfter] without the previous link's identity.
//
// The bound is pg_current_wal_insert_lsn(), not pg_current_wal_lsn(): with
// synchronous_commit=off a transaction the caller saw committed may have its
// commit record past the write position. The header's Start is since (or
// the slot's position for a zero since); its End is left out, since it is
// known only at the end; the end record carries the returned Position.
//
// Schema changes come at their place as ddl records (see the package
// documentation on schema changes), and the state of the sequences c
// carries, read once the bound is reached, comes before the end record.
//
// The stream is checked (see [canonical.Encoder]): its header, every
// commit and its end record carry a running CRC-32C of the stream, which
// [Conn.Verify] and [Conn.ConsumeCanonical] check as they read, so a
// changed value, a missing or repeated transaction is refused before it is
// applied.
//
// The capture ends as soon as the stream passes the bound, so on an idle
// database it returns within a fraction of a second. BackupIncremental
// acknowledges since to the slot (the previous incremental is then known to
// be kept) but nothing past it: a failed or lost incremental can be taken
// again with the same since. When it returns, the server has confirmed
// that: the slot's confirmed_flush_lsn is at since (or past it, where an
// earlier stream had moved it), as [Conn.StreamChanges] promises. Errors are those of [Conn.StreamChanges]; a
// cancelled ctx returns its error, since the output is incomplete.
//
// A backlog of 4 MiB of WAL or more is read through the SQL interface,
// up to about twice as fast as through a walsender, with up to 2 more sessions
// and 2 temporary replication slots (see [Conn.StreamChanges]); with no
// room for them it is read through the walsender.
func (c *Conn) BackupIncremental(ctx context.Context, since canonical.Position, w io.Writer) (canonical.Position, error) {
	next, err := c.BackupIncrementalAfter(ctx, ChainLink{End: since}, w)
	return next.End, err
}

// BackupIncrementalAfter is [Conn.BackupIncremental] from prev.End that
// also records prev.Link, the identity of the backup it continues, as its
// header's Previous: [Conn.VerifyChain] then checks that each link names
// the one before it. It returns the incremental's own ChainLink, for the
// next one. prev comes from [VerifyReport.ChainLink] for a base backup, or
// from the previous BackupIncrementalAfter.
func (c *Conn) BackupIncrementalAfter(ctx context.Context, prev ChainLink, w io.Writer) (_ ChainLink, err error) {
	defer func() { c.countError(ctx, err) }()
	release, err := c.claimStream()
	if err != nil {
		return prev, errorf("siphon: incremental backup: %w", err)
	}
	defer release()
	since := prev.End
	bound, err := c.boundPosition(ctx)
	if err != nil {
		return prev, errorf("siphon: incremental backup: %w", err)
	}
	schema, err := c.InspectSchema(ctx)
	if err != nil {
		return prev, errorf("siphon: incremental backup: %w", err)
	}
	enc := c.opts.newEncoder(w)
	end := since
	cfg := streamConfig{from: since, bound: bound, holdAck: true}
	cfg.onStart = func(start canonical.Position, info streamInfo) error {
		end = start
		h := canonical.Header{
			Kind: canonical.KindIncremental, Engine: canonical.EnginePostgres, Start: start,
			SystemID: info.systemID, Timeline: info.timeline, Slot: c.opts.slot,
			ServerVersion: info.serverVersion, Created: time.Now().UTC(), Previous: prev.Link,
		}
		if err := enc.WriteHeader(h); err != nil {
			return err
		}
		for i := range schema.Tables {
			if err := enc.WriteTable(&schema.Tables[i]); err != nil {
				return err
			}
		}
		return nil
	}
	res, err := c.stream(ctx, cfg, func(ch canonical.Change) error {
		if err := enc.WriteChange(&ch); err != nil {
			return err
		}
		if ch.Op == canonical.OpCommit {
			end = ch.Position
		}
		return nil
	})
	if err != nil {
		return prev, errorf("siphon: incremental backup: %w", err)
	}
	if !res.reachedBound {
		return prev, errorf("siphon: incremental backup: stopped before the bound %v: %w", bound, context.Cause(ctx))
	}
	if err := c.writeSequences(ctx, enc); err != nil {
		return prev, errorf("siphon: incremental backup: %w", err)
	}
	if err := enc.WriteEnd(end); err != nil {
		return prev, errorf("siphon: incremental backup: %w", err)
	}
	return ChainLink{End: end, Link: enc.Link()}, nil
}
