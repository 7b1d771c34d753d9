package siphon

// Copying a source's schema to a target: pg_dump --schema-only of the
// user's objects into pg_restore, through package pgdump (the custom
// format, which pg_restore reads and filters; no SQL text is handled).

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/siphondb/siphon/pgdump"
)

// CopySchemaOptions says how [Conn.CopySchema] copies a schema. The zero
// value copies into an empty target, every object owned by the target
// Conn's role, with its grants.
type CopySchemaOptions struct {
	// NonEmptyTarget copies into a target that holds tables, views or
	// sequences already, of its own: none may be an object of the
	// source's schema (the copy is one transaction, and creates nothing
	// when one is). Defaults to false: such a target is refused with an
	// error wrapping [ErrTargetNotEmpty] before anything is created.
	// (Replacing objects is not offered: pg_restore --clean cannot drop
	// the constraints of partitioned tables.)
	NonEmptyTarget bool
	// KeepOwners makes each object belong to the role that owns it on
	// the source, which must exist on the target (roles belong to a
	// cluster: CopySchema creates none) and be one the target Conn's role
	// may give objects to. Defaults to false: every object belongs to the
	// target Conn's role (pg_restore --no-owner), the role that applies
	// into it.
	KeepOwners bool
	// NoPrivileges leaves out the source's grants, for a target cluster
	// that lacks the roles they name. Defaults to false: grants are
	// copied, and a role they name must exist on the target.
	NoPrivileges bool
	// PgDump and PgRestore are the programs to run, as
	// [BackupOptions].PgDump and [RestoreOptions].PgRestore. Defaults to
	// the newest found on PATH or under /usr/lib/postgresql/*/bin, of a
	// release not older than the source server (pg_dump), and than the
	// target server and that pg_dump (pg_restore).
	PgDump, PgRestore string
	// TempDir holds the schema's dump between the two (mode 0600,
	// removed before CopySchema returns; pg_restore reads a file to
	// leave entries out) and the programs' password files. Defaults to
	// [os.TempDir].
	TempDir string
}

// CopySchema makes target's schema the source's: it creates in the
// database target is connected to every user object of c's database
// (schemas, types, domains, enums, sequences, tables and their
// partitions, constraints, indexes, views, functions, triggers, comments
// and grants), without rows. Left out: publications and subscriptions
// (the target is not a source), siphon's own objects (schema siphon and
// the schema capture's event triggers) and roles, which belong to the
// cluster: those the objects name must exist on the target (see
// KeepOwners and NoPrivileges in opt). Extensions are created as the
// source has them, which the target's server must offer.
//
// It runs pg_dump --schema-only on c and pg_restore on target, in one
// target transaction (all or nothing), as the target Conn's role; the
// passwords travel as for [Conn.Backup], never in argv. A target that
// already holds tables is refused unless opt.NonEmptyTarget. [ReplicateOptions]
// CopySchema does this in the initial snapshot of [Conn.Replicate], at
// the snapshot's Position.
func (c *Conn) CopySchema(ctx context.Context, target *Conn, opt CopySchemaOptions) error {
	if target == nil {
		return errorf("siphon: copy schema: the target Conn: %w", ErrNilArgument)
	}
	if err := c.copySchema(ctx, target, opt, ""); err != nil {
		return errorf("siphon: copy schema: %w", err)
	}
	return nil
}

// copySchema copies c's schema into target as of the exported snapshot
// ("" for now).
func (c *Conn) copySchema(ctx context.Context, target *Conn, opt CopySchemaOptions, snapshot string) error {
	if !opt.NonEmptyTarget {
		err := target.checkTargetEmpty(ctx, "", "copy the schema into an empty database, or set CopySchemaOptions.NonEmptyTarget "+
			"if what it holds is its own (none of the source's objects)")
		if err != nil {
			return err
		}
	}
	dump, restore, err := c.schemaPrograms(ctx, target, opt)
	if err != nil {
		return err
	}
	source, err := c.clientConn("")
	if err != nil {
		return err
	}
	dest, err := target.clientConn("")
	if err != nil {
		return err
	}
	dir, remove, err := pgdump.MkdirTemp(opt.TempDir, "siphon-schema-*")
	if err != nil {
		return err
	}
	defer remove()
	path := filepath.Join(dir, "schema.dump")
	dumpOpts := pgdump.DumpOptions{Conn: source, Exec: pgdump.ExecOptions{Bin: dump.Path, TempDir: opt.TempDir},
		Snapshot: snapshot, SchemaOnly: true, ExcludeSchemas: []string{`"siphon"`},
		NoPublications: true, NoSubscriptions: true, NoOwner: !opt.KeepOwners, NoPrivileges: opt.NoPrivileges}
	if err := dumpToFile(ctx, dumpOpts, path); err != nil {
		if exitErr := (*pgdump.ExitError)(nil); errors.As(err, &exitErr) {
			err = c.explainDumpFailure(ctx, BackupOptions{}, true, err)
		}
		return err
	}
	err = pgdump.RestoreFile(ctx, pgdump.RestoreOptions{Conn: dest, Exec: pgdump.ExecOptions{Bin: restore.Path, TempDir: opt.TempDir},
		SingleTransaction: true, NoOwner: !opt.KeepOwners, NoPrivileges: opt.NoPrivileges,
		NoPublications: true, NoSubscriptions: true, Exclude: isCaptureEntry}, path)
	if err != nil {
		return err
	}
	c.log.Info("schema copied", "target", dest.Database)
	return nil
}

// schemaPrograms finds pg_dump for c's server and pg_restore for
// target's, neither older than the other's server nor than each other.
func (c *Conn) schemaPrograms(ctx context.Context, target *Conn, opt CopySchemaOptions) (dump, restore pgdump.Program, err error) {
	source, err := c.serverVersion(ctx)
	if err != nil {
		return dump, restore, err
	}
	if dump, err = pgdump.Find(ctx, "pg_dump", opt.PgDump, source); err != nil {
		return dump, restore, err
	}
	floor, err := target.serverVersion(ctx)
	if err != nil {
		return dump, restore, err
	}
	if floor.OlderRelease(dump.Version) {
		floor = dump.Version
	}
	restore, err = pgdump.Find(ctx, "pg_restore", opt.PgRestore, floor)
	return dump, restore, err
}

// dumpToFile runs pg_dump into a new file at path (mode 0600).
func dumpToFile(ctx context.Context, opts pgdump.DumpOptions, path string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	err = pgdump.Dump(ctx, opts, f)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// initialSchema is the schema copy of one Replicate's initial snapshot,
// across its attempts (a table changed under a snapshot makes Replicate
// take another).
type initialSchema struct {
	c, target *Conn
	// copied is the schema copied into the target, as pg_dump prints it
	// (without its \restrict lines); empty until it is.
	copied []byte
}

// schemaCopier returns what the initial snapshot of Replicate runs once
// each snapshot is taken, before its rows are written: with copy, the
// first copies c's schema into target through the snapshot (so the rows
// and the stream after them continue that very schema), and each later
// one checks that the source's schema is still the one copied (the
// target's was made once: a change in between would be missed). Without
// copy, nil.
func (c *Conn) schemaCopier(target *Conn, copy bool) func(context.Context, *Snapshot) error {
	if !copy {
		return nil
	}
	return (&initialSchema{c: c, target: target}).prepare
}

func (s *initialSchema) prepare(ctx context.Context, snap *Snapshot) error {
	text, err := s.c.schemaText(ctx, snap.Name())
	if err != nil {
		return err
	}
	if s.copied == nil {
		if err := s.c.copySchema(ctx, s.target, CopySchemaOptions{}, snap.Name()); err != nil {
			return fmt.Errorf("copy the schema: %w", err)
		}
		s.copied = text
		return nil
	}
	if !bytes.Equal(text, s.copied) {
		return errors.New("the source's schema changed between two attempts at the initial snapshot (a table changed under the first), " +
			"after the target's was copied: drop and create the target database, and call Replicate again")
	}
	return nil
}

// schemaText is the schema of c's database as of the exported snapshot,
// as pg_dump --schema-only prints it, for comparing: the same schema
// prints the same, but for the \restrict and \unrestrict lines (psql
// meta-commands with a random key, from pg_dump 15.14, 16.10 and 17.6),
// which are left out.
func (c *Conn) schemaText(ctx context.Context, snapshot string) ([]byte, error) {
	server, err := c.serverVersion(ctx)
	if err != nil {
		return nil, err
	}
	prog, err := pgdump.Find(ctx, "pg_dump", "", server)
	if err != nil {
		return nil, err
	}
	conn, err := c.clientConn("")
	if err != nil {
		return nil, err
	}
	var out bytes.Buffer
	err = pgdump.Dump(ctx, pgdump.DumpOptions{Conn: conn, Exec: pgdump.ExecOptions{Bin: prog.Path}, Format: pgdump.FormatPlain,
		Snapshot: snapshot, SchemaOnly: true, ExcludeSchemas: []string{`"siphon"`}, NoPublications: true, NoSubscriptions: true}, &out)
	if err != nil {
		return nil, err
	}
	var kept []byte
	for line := range bytes.Lines(out.Bytes()) {
		if !bytes.HasPrefix(line, []byte(`\restrict `)) && !bytes.HasPrefix(line, []byte(`\unrestrict `)) {
			kept = append(kept, line...)
		}
	}
	return kept, nil
}
