package siphon

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/siphondb/siphon/canonical"
	"github.com/siphondb/siphon/pgdump"
)

// RestoreOptions says how [Conn.Restore] restores a backup. The zero value
// restores everything into the Conn's database, which must be empty, with
// one job.
type RestoreOptions struct {
	// Database names another database of the same server to restore into,
	// which must exist. Defaults to the Conn's database.
	Database string
	// Clean drops each object before creating it (pg_restore --clean
	// --if-exists), so the target need not be empty. Defaults to false:
	// the target must hold no tables, views or sequences (other than
	// extensions'), and Restore refuses one that does with
	// [ErrTargetNotEmpty].
	Clean bool
	// SingleTransaction restores in one transaction: all or nothing.
	// Without it, a failure leaves what was restored before it
	// (pg_restore stops at the first error). Not with Jobs.
	SingleTransaction bool
	// Jobs, above 1, restores that many tables at once. Defaults to 0: one.
	Jobs int
	// NoOwner leaves ownership out: the restored objects belong to the
	// role restoring them (or to Role). NoPrivileges leaves grants out. Use
	// them when the source's roles do not exist on the target.
	NoOwner, NoPrivileges bool
	// Role makes pg_restore SET ROLE to it after connecting: with NoOwner
	// the restored objects belong to it.
	Role string
	// KeepPublications restores the backup's publications too. Defaults
	// to false: a restored database is not a source, and the source's
	// publications (siphon's among them) would make it publish as one.
	// Subscriptions are never restored (they would connect to the
	// source's publishers), nor siphon's own objects (its schema and the
	// schema capture's event triggers).
	KeepPublications bool
	// PgRestore is the pg_restore to run: its path, or the directory that
	// holds it. Defaults to the newest found on PATH or under
	// /usr/lib/postgresql/*/bin, of a release not older than the target
	// server nor than the pg_dump that wrote the backup.
	PgRestore string
	// TempDir is where the backup's body is spooled before pg_restore
	// reads it (mode 0600, removed before Restore returns; the body of a
	// Restore whose process was killed is removed by the next Restore with
	// the same TempDir); it needs room for the whole body. Defaults to
	// [os.TempDir].
	TempDir string
}

// Restore restores a backup that [Conn.Backup] wrote into the Conn's
// database (or opt.Database).
//
// Nothing touches the target until the whole envelope has been read and
// verified: r is spooled to a temporary file (pg_restore cannot seek a
// stream, and parallel jobs need a file) while its chunks, length and
// checksums are checked, and a stream that is cut, corrupted, of another
// format version, not an envelope, or not a dump is refused with an error
// wrapping [*canonical.EnvelopeError] or [ErrNotDump]. Then pg_restore runs
// with --exit-on-error: it stops at the first failing statement, and the
// error is a [*pgdump.ExitError] with pg_restore's messages.
//
// Restoring makes the target equal to the source at the backup's Position
// (header Start), without the source's publications and subscriptions (see
// [RestoreOptions].KeepPublications) and siphon's own objects, and records that Position in the target as
// [Conn.ConsumeCanonical] records what it applied (see
// [Conn.MarkAppliedPosition]): apply the incrementals that follow it to go
// further, and one that does not continue the backup (a link skipped, from
// another source) is refused with an [*ApplyGapError].
func (c *Conn) Restore(ctx context.Context, opt RestoreOptions, r io.Reader) (err error) {
	defer func() { c.countError(ctx, err) }()
	if opt.SingleTransaction && opt.Jobs > 1 {
		return &OptionError{Option: "RestoreOptions", Problem: "SingleTransaction with Jobs", Fix: "pg_restore cannot do both: drop one of them"}
	}
	conn, err := c.clientConn(opt.Database)
	if err != nil {
		return err
	}
	er := canonical.NewEnvelopeReader(&ctxReader{ctx: ctx, r: r})
	h, err := er.Header()
	if err != nil {
		return errorf("siphon: restore refused, nothing was restored: %w", err)
	}
	if h.Kind != canonical.KindDump {
		return errorf("siphon: restore refused, nothing was restored: %w: it is a %s envelope (apply snapshots and incrementals to a database instead)", ErrNotDump, h.Kind)
	}
	prog, err := c.findRestore(ctx, opt.PgRestore, h)
	if err != nil {
		return errorf("siphon: restore: %w", err)
	}
	if !opt.Clean {
		err := c.checkTargetEmpty(ctx, opt.Database, "restore into an empty database, or set RestoreOptions.Clean to replace what the backup holds")
		if err != nil {
			return errorf("siphon: restore refused, nothing was restored: %w", err)
		}
	}
	path, cleanup, err := spoolBody(er, h.Body, opt.TempDir)
	defer cleanup()
	if err != nil {
		return errorf("siphon: restore refused, nothing was restored: %w", err)
	}
	err = pgdump.RestoreFile(ctx, pgdump.RestoreOptions{
		Conn: conn, Exec: pgdump.ExecOptions{Bin: prog.Path, TempDir: opt.TempDir},
		Clean: opt.Clean, SingleTransaction: opt.SingleTransaction, Jobs: opt.Jobs,
		NoOwner: opt.NoOwner, NoPrivileges: opt.NoPrivileges, Role: opt.Role, Exclude: isCaptureEntry,
		NoPublications: !opt.KeepPublications, NoSubscriptions: true,
	}, path)
	if err != nil {
		return errorf("siphon: restore: %w", err)
	}
	if err := c.markApplied(ctx, opt.Database, h.SystemID, h.Slot, h.Start, h.Created); err != nil {
		return errorf("siphon: restore: the backup is restored, but recording its Position %v in the target failed "+
			"(record it with MarkAppliedPosition, or incrementals will not be checked against it): %w", h.Start, err)
	}
	c.log.Info("backup restored", "position", h.Start, "database", conn.Database)
	return nil
}

// findRestore finds a pg_restore not older than the target server nor the
// pg_dump that wrote the backup.
func (c *Conn) findRestore(ctx context.Context, bin string, h canonical.EnvelopeHeader) (pgdump.Program, error) {
	floor, err := c.serverVersion(ctx)
	if err != nil {
		return pgdump.Program{}, err
	}
	if tool, err := pgdump.ParseVersion(h.Tool); err == nil && floor.OlderRelease(tool) {
		floor = tool
	}
	return pgdump.Find(ctx, "pg_restore", bin, floor)
}

// checkTargetEmpty refuses, with an error wrapping ErrTargetNotEmpty that
// ends with fix, a target database ("" for the Conn's) that holds
// relations other than extensions' and siphon's.
func (c *Conn) checkTargetEmpty(ctx context.Context, database, fix string) error {
	const query = `SELECT coalesce(pg_catalog.array_agg(pg_catalog.format('%I.%I', n.nspname, c.relname) ORDER BY n.nspname, c.relname), '{}')
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE c.relkind IN ('r', 'p', 'v', 'm', 'S', 'f') AND ` + inUserSchema + ` AND ` + notOfExtension
	var q interface {
		QueryRow(context.Context, string, ...any) pgx.Row
	} = c.pool
	if database != "" && database != c.config.Database {
		config := c.config.Copy()
		config.Database = database
		conn, err := pgx.ConnectConfig(ctx, config)
		if err != nil {
			return fmt.Errorf("connect to database %q: %w", database, err)
		}
		defer conn.Close(context.Background())
		q = conn
	}
	var names []string
	if err := q.QueryRow(ctx, query).Scan(&names); err != nil {
		return fmt.Errorf("check that the target is empty: %w", err)
	}
	if len(names) > 0 {
		if len(names) > 5 {
			names = append(names[:5], "...")
		}
		return fmt.Errorf("%w: it holds %s: %s", ErrTargetNotEmpty, strings.Join(names, ", "), fix)
	}
	return nil
}

// spoolBody copies the envelope's body to a temporary file (a directory
// for a directory-format dump) and returns its path, once the whole
// envelope checked out. cleanup removes it; call it whatever the error.
// Both are in a directory of their own (see [pgdump.MkdirTemp]): if this
// process is killed first, the next Restore with the same TempDir removes
// it.
func spoolBody(er *canonical.EnvelopeReader, body canonical.BodyFormat, tempDir string) (path string, cleanup func(), err error) {
	dir, remove, err := pgdump.MkdirTemp(tempDir, "siphon-restore-*")
	if err != nil {
		return "", func() {}, fmt.Errorf("make a directory to spool the backup: %w", err)
	}
	cleanup = func() { remove() }
	if body == canonical.BodyPgDumpDirectoryTar {
		return dir, cleanup, untar(er, dir)
	}
	f, err := os.OpenFile(filepath.Join(dir, "body.dump"), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return "", cleanup, fmt.Errorf("make a file to spool the backup: %w", err)
	}
	_, err = io.Copy(f, er)
	if cerr := f.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("spool the backup: %w", cerr)
	}
	return f.Name(), cleanup, err
}

// untar extracts a directory-format dump from the envelope's body into
// dir, then reads the envelope to its end (the trailer's checks).
func untar(er *canonical.EnvelopeReader, dir string) error {
	err := readDumpTar(er, func(name string, body io.Reader) error {
		return writeFile(filepath.Join(dir, name), body)
	})
	if err != nil {
		return err
	}
	// The tar ends before the body does (padding); the envelope's checks
	// are at its very end.
	_, err = io.Copy(io.Discard, er)
	return err
}

// errNoTOC: a tar without toc.dat is not a directory-format dump.
var errNoTOC = errors.New("the dump's tar has no toc.dat: it is not a directory-format dump")

// readDumpTar reads a directory-format dump carried as a tar, calling each
// with every file in turn. It refuses an entry that is not a plain, flat,
// distinct file (see checkTarEntry), and a tar without toc.dat
// ([errNoTOC]).
func readDumpTar(r io.Reader, each func(name string, body io.Reader) error) error {
	tr := tar.NewReader(r)
	seen := map[string]bool{}
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("read the dump's tar: %w", err)
		}
		if err := checkTarEntry(hdr, seen); err != nil {
			return err
		}
		if err := each(hdr.Name, tr); err != nil {
			return err
		}
	}
	if !seen["toc.dat"] {
		return errNoTOC
	}
	return nil
}

// checkTarEntry accepts the plain, flat, distinct files of a
// directory-format dump only.
func checkTarEntry(hdr *tar.Header, seen map[string]bool) error {
	name := hdr.Name
	if hdr.Typeflag != tar.TypeReg || name == "" || name == "." || name == ".." ||
		strings.ContainsAny(name, `/\`) || seen[name] {
		return fmt.Errorf("the dump's tar holds %q (type %q), not a plain file of a directory-format dump", name, hdr.Typeflag)
	}
	seen[name] = true
	return nil
}

func writeFile(path string, r io.Reader) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("spool the backup: %w", err)
	}
	_, err = io.Copy(f, r)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// ctxReader stops reading once ctx is done.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (r *ctxReader) Read(p []byte) (int, error) {
	if err := r.ctx.Err(); err != nil {
		return 0, err
	}
	return r.r.Read(p)
}
