package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/siphondb/siphon"
	"github.com/siphondb/siphon/canonical"
)

// stream follows the change stream from the snapshot's Position until every
// transaction the workload committed has arrived, recording it as JSONL.
func (t *tour) stream(ctx context.Context) error {
	began := time.Now()
	header, err := canonical.NewDecoder(bytes.NewReader(t.snapshotFile.Bytes())).Header()
	if err != nil {
		return err
	}
	header.Kind, header.Start, header.End, header.Created = canonical.KindChanges, t.snapshotAt, 0, time.Now().UTC()
	enc := canonical.NewEncoder(&t.changes)
	if err := enc.WriteHeader(header); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx) // the tour's deadline bounds the wait
	defer cancel()
	commits, changes, last := 0, 0, t.snapshotAt
	_, err = t.c.StreamChanges(ctx, t.snapshotAt, func(ch canonical.Change) error {
		if err := enc.WriteChange(&ch); err != nil {
			return err
		}
		switch ch.Op {
		case canonical.OpInsert, canonical.OpUpdate, canonical.OpDelete:
			changes++
		case canonical.OpCommit:
			commits, last = commits+1, ch.Position
			if commits == t.txns {
				cancel() // seen everything: the normal way to stop a stream
			}
		}
		return nil
	})
	if err == nil && commits < t.txns {
		err = fmt.Errorf("%d of %d transactions arrived before the deadline", commits, t.txns)
	}
	if err != nil {
		return fmt.Errorf("stream: %w", err)
	}
	if err := enc.WriteEnd(last); err != nil {
		return err
	}
	fmt.Fprintf(t.out, "5. stream       from %v: %d transactions, %d row changes, up to %v, in %v\n",
		t.snapshotAt, commits, changes, last, since(began))
	return nil
}

// incremental takes the bounded change set since the backup, on the backup's
// own slot.
func (t *tour) incremental(ctx context.Context) error {
	began := time.Now()
	end, err := t.backups.BackupIncremental(ctx, t.backupAt, &t.incrementalFile)
	if err != nil {
		return fmt.Errorf("incremental: %w", err)
	}
	fmt.Fprintf(t.out, "6. incremental  since the backup %v: up to %v, %s, in %v\n", t.backupAt, end, size(t.incrementalFile.Len()), since(began))
	return nil
}

// apply builds two copies and checks each equals the source: a replica
// from the snapshot plus the stream, and a restore of the backup plus the
// incremental.
func (t *tour) apply(ctx context.Context) error {
	began := time.Now()
	want, err := digest(ctx, t.source)
	if err != nil {
		return err
	}
	replica, err := t.newCopy(ctx, "replica", true)
	if err != nil {
		return err
	}
	if err := consume(ctx, replica, &t.snapshotFile, &t.changes); err != nil {
		return fmt.Errorf("replica: %w", err)
	}
	restored, err := t.newCopy(ctx, "restored", false)
	if err != nil {
		return err
	}
	if err := restore(ctx, restored, &t.backupFile, &t.incrementalFile); err != nil {
		return fmt.Errorf("restored: %w", err)
	}
	fmt.Fprintf(t.out, "7. apply        in %v\n", since(began))
	for _, cp := range []struct{ name, dsn, how string }{
		{"replica", replica, "snapshot + stream"},
		{"restored", restored, "backup + incremental"},
	} {
		got, err := digest(ctx, cp.dsn)
		if err != nil {
			return err
		}
		verdict := "identical to the source"
		if got != want {
			verdict = "DIFFERENT from the source"
		}
		pos, err := appliedPosition(ctx, cp.dsn)
		if err != nil {
			return err
		}
		fmt.Fprintf(t.out, "   %-9s = %-21s -> %s, applied up to %v\n", cp.name, cp.how, verdict, pos)
		if got != want {
			return errors.New(cp.name + " differs from the source")
		}
	}
	return nil
}

// consume applies canonical streams, in order, to the database dsn names.
func consume(ctx context.Context, dsn string, streams ...*bytes.Buffer) error {
	c, err := siphon.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer c.Close()
	for _, s := range streams {
		if err := c.ConsumeCanonical(ctx, bytes.NewReader(s.Bytes())); err != nil {
			return err
		}
	}
	return nil
}

// restore restores a backup into the database dsn names, then applies the
// incremental that continues it.
func restore(ctx context.Context, dsn string, backup, incremental *bytes.Buffer) error {
	c, err := siphon.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer c.Close()
	if err := c.Restore(ctx, siphon.RestoreOptions{}, bytes.NewReader(backup.Bytes())); err != nil {
		return err
	}
	return c.ConsumeCanonical(ctx, bytes.NewReader(incremental.Bytes()))
}

func appliedPosition(ctx context.Context, dsn string) (canonical.Position, error) {
	c, err := siphon.Connect(ctx, dsn)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	return c.AppliedPosition(ctx)
}
