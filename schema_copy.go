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

	"github.com/jackc/pgx/v5"

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
	// may give objects to. Keep them when the source's objects belong to
	// roles that are not superusers (an application's role): its schema
	// changes, replayed on the target as that role, need to own what they
	// change. Defaults to false: every object belongs to the target Conn's
	// role (pg_restore --no-owner), the role that applies into it; objects
	// that run with their owner's rights (tables, views, SECURITY DEFINER
	// functions) must then belong, on the source, to a superuser or to a
	// role of the target Conn's role's name, or the copy is refused with
	// an [*OwnershipError] (they would run with more rights than their
	// owners have).
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
// source has them, which the target's server must offer. Objects that run
// with their owner's rights are not given to the target Conn's role when a
// role that is not a superuser owns them on the source: that is an
// [*OwnershipError] before anything is created, unless opt.KeepOwners.
//
// It runs pg_dump --schema-only on c and pg_restore on target, in one
// target transaction (all or nothing), as the target Conn's role; the
// passwords travel as for [Conn.Backup], never in argv. A target that
// already holds tables is refused unless opt.NonEmptyTarget.
// [ReplicateOptions].CopySchema does this in the initial snapshot of
// [Conn.Replicate], at the snapshot's Position.
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
	if !opt.KeepOwners {
		if err := c.checkOwners(ctx, target.config.User); err != nil {
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

// ownersQuery lists the objects of the source's schema that run with
// their owner's rights and belong to a role that is not a superuser, nor
// named $1: role, what the object is.
const ownersQuery = `
SELECT r.rolname::text, o.what FROM (
  SELECT c.relowner AS owner, CASE c.relkind WHEN 'v' THEN 'view ' WHEN 'm' THEN 'materialized view ' WHEN 'f' THEN 'foreign table '
         ELSE 'table ' END || pg_catalog.format('%I.%I', n.nspname, c.relname) AS what
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
  WHERE c.relkind IN ('r', 'p', 'v', 'm', 'f') AND c.relpersistence <> 't' AND ` + inUserSchema + ` AND ` + notOfExtension + `
  UNION ALL
  SELECT p.proowner, pg_catalog.format('SECURITY DEFINER function %I.%I(%s)', n.nspname, p.proname, pg_catalog.pg_get_function_identity_arguments(p.oid))
  FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
  WHERE p.prosecdef AND ` + inUserSchema + `
    AND NOT EXISTS (SELECT FROM pg_depend d WHERE d.classid = 'pg_proc'::regclass AND d.objid = p.oid AND d.deptype = 'e')
) o JOIN pg_roles r ON r.oid = o.owner
WHERE NOT r.rolsuper AND r.rolname <> $1
ORDER BY 1, 2`

// checkOwners refuses, with an *OwnershipError, a copy that would give
// target (the target's role) objects that run with their owner's rights
// and belong on the source to a role with less than it may have.
func (c *Conn) checkOwners(ctx context.Context, target string) error {
	rows, err := c.pool.Query(ctx, ownersQuery, target)
	if err != nil {
		return fmt.Errorf("read the owners of the source's objects: %w", err)
	}
	owned, err := pgx.CollectRows(rows, pgx.RowToStructByPos[struct{ Role, What string }])
	if err != nil {
		return fmt.Errorf("read the owners of the source's objects: %w", err)
	}
	if len(owned) == 0 {
		return nil
	}
	e := &OwnershipError{Target: target, Owners: map[string][]string{}}
	for _, o := range owned {
		switch n := len(e.Owners[o.Role]); {
		case n < maxGapsShown:
			e.Owners[o.Role] = append(e.Owners[o.Role], o.What)
		case n == maxGapsShown:
			e.Owners[o.Role] = append(e.Owners[o.Role], "...")
		}
	}
	return e
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
	opt       CopySchemaOptions
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
// opt (nil), nil.
func (c *Conn) schemaCopier(target *Conn, opt *CopySchemaOptions) func(context.Context, *Snapshot) error {
	if opt == nil {
		return nil
	}
	return (&initialSchema{c: c, target: target, opt: *opt}).prepare
}

func (s *initialSchema) prepare(ctx context.Context, snap *Snapshot) error {
	text, err := s.c.schemaText(ctx, snap.Name())
	if err != nil {
		return err
	}
	if s.copied == nil {
		if err := s.c.copySchema(ctx, s.target, s.opt, snap.Name()); err != nil {
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
