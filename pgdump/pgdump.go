// Package pgdump runs PostgreSQL's pg_dump and pg_restore from Go.
//
// [Dump] streams a dump to an [io.Writer], [Restore] feeds one from an
// [io.Reader], [DumpDirectory] and [RestoreFile] handle the directory
// format and parallel jobs, and [List] reads an archive's table of
// contents. [Find] picks the programs: the one named by [ExecOptions].Bin,
// or the newest on PATH and under /usr/lib/postgresql/*/bin, never of an
// older major release than the server.
//
// What it guarantees:
//
//   - The password never appears in a program's argv (visible to every
//     user through /proc or ps): the connection ([Conn]) travels in the
//     program's environment and the password in a password file only its
//     owner can read. On Linux the program inherits that file open, and it
//     is unlinked before the program starts, so a killed process leaves no
//     password on disk. Elsewhere it is removed when the program exits
//     (or, if this process is killed first, by the next program run with
//     the same [ExecOptions].TempDir).
//   - Nothing outlives its call. Each program runs in a process group of its
//     own; when the context is done the whole group gets SIGTERM, then
//     SIGKILL after [ExecOptions].WaitDelay, and the call returns only once
//     the program has exited. On Linux a program is also killed if this
//     process dies.
//   - Failures are typed: a program that fails is an [*ExitError] with its
//     command line, exit status and the end of its standard error (bounded
//     to [StderrLimit], password masked); a program too old for the server
//     is a [*VersionError]; a program missing is [ErrNotFound].
//   - Programs never prompt (--no-password), and pg_restore always runs
//     with --exit-on-error: by default it would carry on past errors and
//     report a partial restore as a warning.
//
// The package is independent of siphon's root package and usable on its
// own.
package pgdump

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"
)

// Format is a pg_dump output format.
type Format string

// The formats of pg_dump. Custom is the one pg_restore reads best: it is
// compressed, and restores selectively and in parallel from a file.
const (
	FormatCustom    Format = "custom"
	FormatPlain     Format = "plain"
	FormatTar       Format = "tar"
	FormatDirectory Format = "directory"
)

// Errors callers can branch on with errors.Is.
var (
	// ErrSnapshotSerializable means both Snapshot and
	// SerializableDeferrable were asked for: pg_dump silently drops
	// --serializable-deferrable when given --snapshot, so this package
	// refuses the combination instead.
	ErrSnapshotSerializable = errors.New("pgdump: --serializable-deferrable cannot be combined with --snapshot (pg_dump would ignore it): drop one of them")
	// ErrUnsupported means an option this pg_dump or pg_restore does not
	// support, or a combination they refuse.
	ErrUnsupported = errors.New("pgdump: unsupported option")
)

// DumpOptions says what pg_dump dumps and how.
type DumpOptions struct {
	// Conn is the database to dump.
	Conn Conn
	// Exec says how to find and run pg_dump.
	Exec ExecOptions
	// Format is the output format of [Dump]: custom (the default), plain or
	// tar. [DumpDirectory] always writes the directory format.
	Format Format
	// Snapshot makes pg_dump read through an exported snapshot
	// (--snapshot), so the dump shows exactly what that snapshot shows.
	Snapshot string
	// SerializableDeferrable waits for a snapshot that no serializable
	// transaction can contradict (--serializable-deferrable). Refused with
	// Snapshot: see [ErrSnapshotSerializable].
	SerializableDeferrable bool
	// Tables, ExcludeTables, Schemas and ExcludeSchemas select what is
	// dumped (--table, --exclude-table, --schema, --exclude-schema), as
	// pg_dump patterns: unquoted names fold to lower case and * and ? are
	// wildcards; double-quote a name to take it literally
	// (`"Sales"."Order Lines"`). ExcludeTableData keeps tables' definitions
	// but not their rows.
	Tables, ExcludeTables, Schemas, ExcludeSchemas, ExcludeTableData []string
	// StrictNames makes each Tables and Schemas pattern match something
	// (--strict-names).
	StrictNames bool
	// SchemaOnly and DataOnly restrict the dump to definitions or to rows.
	SchemaOnly, DataOnly bool
	// NoOwner and NoPrivileges leave out ownership and grants.
	NoOwner, NoPrivileges bool
	// NoPublications and NoSubscriptions leave out publications and
	// subscriptions (--no-publications, --no-subscriptions).
	NoPublications, NoSubscriptions bool
	// Compression is pg_dump's --compress: "0" to "9" (gzip levels) or
	// "none" on every release; from release 16 also a method with an
	// optional level ("gzip:9", "lz4", "zstd:3") when pg_dump was built
	// with it. Empty: pg_dump's default (gzip for custom and directory).
	Compression string
	// Jobs dumps that many tables at once ([DumpDirectory] only).
	Jobs int
	// LockWaitTimeout makes pg_dump fail instead of waiting longer for a
	// table lock (--lock-wait-timeout). Zero: wait.
	LockWaitTimeout time.Duration
}

// Dump runs pg_dump and streams its output to w. It returns once pg_dump
// has exited: nil when it succeeded, an [*ExitError] when it failed, the
// context's error (wrapped) when ctx ended first, and w's error (wrapped)
// when w failed, after which pg_dump is stopped.
func Dump(ctx context.Context, opts DumpOptions, w io.Writer) error {
	format := opts.Format
	if format == "" {
		format = FormatCustom
	}
	if format == FormatDirectory {
		return fmt.Errorf("%w: the directory format writes files: use DumpDirectory", ErrUnsupported)
	}
	if opts.Jobs > 1 {
		return fmt.Errorf("%w: parallel jobs need the directory format: use DumpDirectory", ErrUnsupported)
	}
	return dump(ctx, opts, format, "", w)
}

// DumpDirectory runs pg_dump in the directory format into dir, which must
// not exist or be empty, with opts.Jobs tables dumped at once.
func DumpDirectory(ctx context.Context, opts DumpOptions, dir string) error {
	return dump(ctx, opts, FormatDirectory, dir, nil)
}

func dump(ctx context.Context, opts DumpOptions, format Format, dir string, w io.Writer) error {
	if opts.Snapshot != "" && opts.SerializableDeferrable {
		return ErrSnapshotSerializable
	}
	prog, err := Find(ctx, "pg_dump", opts.Exec.Bin, opts.Exec.ServerVersion)
	if err != nil {
		return err
	}
	args, err := dumpArgs(opts, format, dir, prog.Version)
	if err != nil {
		return err
	}
	return run(ctx, command{program: prog, args: args, exec: opts.Exec, conn: &opts.Conn, stdout: w})
}

// dumpArgs builds pg_dump's arguments; the connection is not among them.
func dumpArgs(o DumpOptions, format Format, dir string, v Version) ([]string, error) {
	args := []string{"--no-password", "--format=" + string(format)}
	if dir != "" {
		args = append(args, "--file="+dir)
	}
	if o.Jobs > 1 {
		args = append(args, "--jobs="+strconv.Itoa(o.Jobs))
	}
	flag := func(on bool, name string) {
		if on {
			args = append(args, name)
		}
	}
	value := func(name, v string) {
		if v != "" {
			args = append(args, name+"="+v)
		}
	}
	value("--snapshot", o.Snapshot)
	flag(o.SerializableDeferrable, "--serializable-deferrable")
	for _, list := range []struct {
		name     string
		patterns []string
	}{{"--table", o.Tables}, {"--exclude-table", o.ExcludeTables}, {"--schema", o.Schemas},
		{"--exclude-schema", o.ExcludeSchemas}, {"--exclude-table-data", o.ExcludeTableData}} {
		for _, p := range list.patterns {
			args = append(args, list.name+"="+p)
		}
	}
	flag(o.StrictNames, "--strict-names")
	flag(o.SchemaOnly, "--schema-only")
	flag(o.DataOnly, "--data-only")
	flag(o.NoOwner, "--no-owner")
	flag(o.NoPrivileges, "--no-privileges")
	flag(o.NoPublications, "--no-publications")
	flag(o.NoSubscriptions, "--no-subscriptions")
	if o.LockWaitTimeout > 0 {
		value("--lock-wait-timeout", strconv.FormatInt(o.LockWaitTimeout.Milliseconds(), 10))
	}
	compress, err := compressionArg(o.Compression, v)
	if err != nil {
		return nil, err
	}
	value("--compress", compress)
	return args, nil
}

// compressionArg checks a --compress value against pg_dump's release:
// before 16 it takes a gzip level only.
func compressionArg(spec string, v Version) (string, error) {
	if spec == "" || v.Major >= 16 {
		return spec, nil
	}
	if spec == "none" {
		return "0", nil
	}
	level := spec
	if method, detail, ok := cutColon(spec); ok && method == "gzip" {
		level = detail
	} else if spec == "gzip" {
		return "", nil
	}
	if n, err := strconv.Atoi(level); err == nil && n >= 0 && n <= 9 {
		return level, nil
	}
	return "", fmt.Errorf("%w: compression %q needs pg_dump 16 or later (this one is %s): use 0 to 9 (gzip levels) or none",
		ErrUnsupported, spec, v)
}

func cutColon(s string) (before, after string, ok bool) {
	for i := 0; i < len(s); i++ {
		if s[i] == ':' {
			return s[:i], s[i+1:], true
		}
	}
	return s, "", false
}

// RestoreOptions says how pg_restore restores an archive.
type RestoreOptions struct {
	// Conn is the database to restore into.
	Conn Conn
	// Exec says how to find and run pg_restore.
	Exec ExecOptions
	// Clean drops each object before creating it (--clean --if-exists).
	Clean bool
	// SingleTransaction restores in one transaction: all or nothing.
	// Refused with Jobs.
	SingleTransaction bool
	// Jobs restores that many tables at once ([RestoreFile] only:
	// pg_restore cannot work in parallel from a stream).
	Jobs int
	// NoOwner leaves ownership out: objects belong to the restoring role.
	NoOwner bool
	// NoPrivileges leaves grants out.
	NoPrivileges bool
	// NoPublications and NoSubscriptions leave the archive's publications
	// and subscriptions out (--no-publications, --no-subscriptions).
	NoPublications, NoSubscriptions bool
	// Role makes pg_restore SET ROLE to it after connecting (--role): with
	// NoOwner, the restored objects belong to it.
	Role string
	// Exclude, when set, leaves out the archive's entries it returns true
	// for: pg_restore restores the others, as listed in a --use-list file
	// ([RestoreFile] only).
	Exclude func(Entry) bool
}

// Restore runs pg_restore --exit-on-error on the archive read from r
// (custom or tar format). It returns once pg_restore has exited; see
// [Dump] for the errors.
func Restore(ctx context.Context, opts RestoreOptions, r io.Reader) error {
	if opts.Jobs > 1 {
		return fmt.Errorf("%w: pg_restore cannot restore in parallel from a stream: write the archive to a file and use RestoreFile", ErrUnsupported)
	}
	return restore(ctx, opts, "", r)
}

// RestoreFile runs pg_restore --exit-on-error on the archive at path: a
// custom or tar format file, or a directory format directory.
func RestoreFile(ctx context.Context, opts RestoreOptions, path string) error {
	return restore(ctx, opts, path, nil)
}

func restore(ctx context.Context, opts RestoreOptions, path string, r io.Reader) error {
	if opts.SingleTransaction && opts.Jobs > 1 {
		return fmt.Errorf("%w: pg_restore cannot restore in one transaction with parallel jobs: drop one of them", ErrUnsupported)
	}
	prog, err := Find(ctx, "pg_restore", opts.Exec.Bin, opts.Exec.ServerVersion)
	if err != nil {
		return err
	}
	args := []string{"--no-password", "--exit-on-error"}
	if opts.Clean {
		args = append(args, "--clean", "--if-exists")
	}
	if opts.SingleTransaction {
		args = append(args, "--single-transaction")
	}
	if opts.Jobs > 1 {
		args = append(args, "--jobs="+strconv.Itoa(opts.Jobs))
	}
	if opts.NoOwner {
		args = append(args, "--no-owner")
	}
	if opts.NoPrivileges {
		args = append(args, "--no-privileges")
	}
	if opts.NoPublications {
		args = append(args, "--no-publications")
	}
	if opts.NoSubscriptions {
		args = append(args, "--no-subscriptions")
	}
	if opts.Role != "" {
		args = append(args, "--role="+opts.Role)
	}
	if opts.Exclude != nil {
		if path == "" {
			return fmt.Errorf("%w: leaving entries out needs the archive in a file: use RestoreFile", ErrUnsupported)
		}
		list, remove, err := writeUseList(ctx, opts, path)
		if err != nil {
			return err
		}
		defer remove()
		args = append(args, "--use-list="+list)
	}
	// --dbname names the database to restore into; without it pg_restore
	// prints SQL instead. It is taken from PGDATABASE when given empty.
	args = append(args, "--dbname=")
	if path != "" {
		args = append(args, "--", path)
	}
	return run(ctx, command{program: prog, args: args, exec: opts.Exec, conn: &opts.Conn, stdin: r})
}
