package siphon

import (
	"archive/tar"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgerrcode"

	"github.com/siphondb/siphon/canonical"
	"github.com/siphondb/siphon/internal/pgerr"
	"github.com/siphondb/siphon/internal/sqltext"
	"github.com/siphondb/siphon/pgdump"
)

// Full backups: pg_dump through a snapshot exported by a replication slot,
// in a checksummed envelope (canonical.EnvelopeWriter) whose header
// records the snapshot's Position, so that the first incremental backup
// starts exactly there. Restore and Verify read envelopes back.

// BackupOptions says what [Conn.Backup] dumps and how. The zero value
// dumps the whole database in pg_dump's custom format, compressed with
// pg_dump's default.
type BackupOptions struct {
	// Tables, when set, restricts the dump to these tables; ExcludeTables
	// leaves tables out; ExcludeTableData keeps tables' definitions but not
	// their rows. Each is a name written as for [WithTables]
	// ("schema.table", unquoted parts folded to lower case, double-quoted
	// parts taken as written) and matches that table only: no wildcards.
	// Defaults to every table.
	Tables, ExcludeTables, ExcludeTableData []string
	// Schemas, when set, restricts the dump to these schemas;
	// ExcludeSchemas leaves schemas out. Names as for Tables, one part.
	Schemas, ExcludeSchemas []string
	// Compression is pg_dump's --compress: "0" to "9" (gzip levels) or
	// "none" on every release; with pg_dump 16 or later also "gzip:N",
	// "lz4[:N]" or "zstd[:N]" when pg_dump was built with them. Defaults to
	// pg_dump's default (gzip).
	Compression string
	// Jobs, above 1, dumps that many tables at once. pg_dump then writes
	// its directory format into a temporary directory (under TempDir),
	// which is streamed into the envelope as a tar once complete: the body
	// is then [canonical.BodyPgDumpDirectoryTar], the temporary directory
	// needs room for the whole dump, and Restore can restore it in parallel
	// too. If this process is killed, pg_dump dies with it (on Linux) but
	// its workers finish the table each is dumping before they exit.
	// Defaults to 0: one job, the custom format streamed as pg_dump writes
	// it, no temporary file.
	Jobs int
	// SerializableDeferrable asks for pg_dump's --serializable-deferrable,
	// which pg_dump silently drops when dumping through an exported
	// snapshot, as Backup always does. Backup refuses it with
	// [ErrSerializableDeferrable] rather than pretend; dump with package
	// pgdump instead when you need it (the dump is then not aligned).
	SerializableDeferrable bool
	// StartChain makes the backup the base of a chain of incrementals:
	// Backup makes sure siphon's publication and persistent slot exist
	// before the dump's snapshot, so that [Conn.BackupIncrementalAfter]
	// from the backup's [VerifyReport.ChainLink] continues it with no gap.
	// The slot then keeps the WAL from there until incrementals consume it,
	// or [Conn.Detach] drops it. Defaults to false: a one-off backup, that
	// leaves no slot and no publication behind; it is still the base of a
	// chain when the persistent slot existed already (the envelope's Slot
	// then names it), and otherwise nothing can continue it.
	StartChain bool
	// BaseSlot makes Backup create a physical base slot ([Conn.CreateBaseSlot])
	// before the dump and capture its end after ([Conn.CaptureBaseEnd]):
	// the envelope records the slot and its WAL range, and the slot pins
	// WAL from its start until you drop it with [Conn.DropSlot] when the
	// chain that starts with this backup is sealed. Until the backup is
	// complete it is a temporary slot of a session of the Backup's own
	// (see [Conn.CreateBaseSlot]): a failed backup, or one whose process
	// was killed, leaves none. Defaults to false.
	BaseSlot bool
	// Previous is the Link of the chain's previous envelope, if this backup
	// continues a chain (rare: a dump usually starts one).
	Previous string
	// PgDump is the pg_dump to run: its path, or the directory that holds
	// it. Defaults to the newest found on PATH or under
	// /usr/lib/postgresql/*/bin, which must not be of an older release
	// than the server.
	PgDump string
	// TempDir holds the password file given to pg_dump and, with Jobs,
	// the directory-format dump. Both are removed before Backup returns.
	// What a Backup whose process was killed left is removed by the next
	// Backup with the same TempDir: the directory by the next with Jobs,
	// the password file by the next that writes one. On Linux there is
	// no such password file: it has a name only until pg_dump starts,
	// which reads it from an inherited descriptor, so no password stays
	// on disk. Defaults to [os.TempDir].
	TempDir string
}

// Backup writes a full backup of the database to w: an envelope
// ([canonical.EnvelopeWriter]) whose body is pg_dump's custom-format
// archive (or, with Jobs, its directory format as a tar).
//
// The dump is aligned with the change stream: Backup creates a temporary
// slot that exports a snapshot, and runs pg_dump --snapshot inside it. The
// envelope's Start (and End) is that snapshot's consistent point: the dump
// holds exactly the transactions committed at or before it, and, when the
// persistent slot existed before it (see StartChain),
// [Conn.BackupIncremental] from it continues with no gap and no duplicate. The header also records
// the system identifier and timeline (IDENTIFY_SYSTEM), the server
// version, the slot, and the tables dumped.
//
// Before pg_dump starts, a transaction in the snapshot, in a session of
// its own, locks every table the dump holds (ACCESS SHARE, as pg_dump
// does, without ever waiting for one while it holds another) until pg_dump
// ends, and checks that none was rewritten since the snapshot. A TRUNCATE
// or a table-rewriting ALTER TABLE committed in between, which pg_dump
// would read as an empty table through the snapshot, or a statement that
// queued for a table before pg_dump locked it (pg_dump gives up waiting
// behind it after 10 s, a parallel dump at once), is a
// [*BackupConflictError]: run Backup again. Each table is locked twice
// then, by that session and by pg_dump: a database of very many tables
// and partitions may need a larger max_locks_per_transaction than pg_dump
// alone does.
//
// pg_dump gets the Conn's password through a password file, never argv.
// When ctx is done, pg_dump's process group is stopped and every temporary
// file and slot removed before Backup returns; w then holds an incomplete
// envelope, which Verify and Restore refuse.
func (c *Conn) Backup(ctx context.Context, opt BackupOptions, w io.Writer) (err error) {
	defer func() { c.countError(ctx, err) }()
	dumpOpts, prog, err := c.prepareDump(ctx, opt)
	if err != nil {
		return err
	}
	identify := c.identifyInBackground(ctx) // while the slots are made
	defer identify()
	var base *IncrementalBaseInfo
	if opt.BaseSlot {
		if base, err = c.CreateBaseSlot(ctx); err != nil {
			return errorf("siphon: backup: %w", err)
		}
		defer func() {
			if err != nil {
				c.dropFailedBase(base.Slot)
			}
		}()
	}
	snap, err := c.createSnapshotSlot(ctx, opt.StartChain)
	if err != nil {
		return errorf("siphon: backup: %w", err)
	}
	defer func() {
		if cerr := snap.Close(ctx); err == nil && cerr != nil {
			err = errorf("siphon: backup: %w", cerr)
		}
	}()
	src, err := identify()
	if err != nil {
		return errorf("siphon: backup: %w", err)
	}
	run := &backupRun{opt: opt, dump: dumpOpts, prog: prog, src: src, snap: snap, base: base}
	return c.writeBackup(ctx, run, w)
}

// chainSlot is the slot the backup's incrementals continue from: the
// persistent slot, when it existed before the snapshot; "" for a backup
// nothing can continue.
func (run *backupRun) chainSlot(c *Conn) string {
	if run.snap.Anchored {
		return c.opts.slot
	}
	return ""
}

// backupRun is what one Backup has gathered once its slots exist.
type backupRun struct {
	opt  BackupOptions
	dump pgdump.DumpOptions
	prog pgdump.Program
	src  streamInfo
	snap *snapshotSlot
	base *IncrementalBaseInfo // nil without BaseSlot
}

// prepareDump checks the options and finds a pg_dump fit for the server.
func (c *Conn) prepareDump(ctx context.Context, opt BackupOptions) (pgdump.DumpOptions, pgdump.Program, error) {
	dumpOpts, err := c.dumpOptions(opt)
	if err != nil {
		return dumpOpts, pgdump.Program{}, err
	}
	server, err := c.serverVersion(ctx)
	if err != nil {
		return dumpOpts, pgdump.Program{}, errorf("siphon: backup: %w", err)
	}
	prog, err := pgdump.Find(ctx, "pg_dump", opt.PgDump, server)
	if err != nil {
		return dumpOpts, pgdump.Program{}, errorf("siphon: backup: %w", err)
	}
	dumpOpts.Exec.Bin, dumpOpts.Exec.ServerVersion = prog.Path, server
	return dumpOpts, prog, nil
}

// identifyInBackground runs identifySystem in a goroutine and returns the
// function that waits for its result; call it on every path (it may be
// called more than once).
func (c *Conn) identifyInBackground(ctx context.Context) func() (streamInfo, error) {
	type result struct {
		info streamInfo
		err  error
	}
	done := make(chan result, 1)
	go func() {
		info, err := c.identifySystem(ctx)
		done <- result{info, err}
	}()
	return sync.OnceValues(func() (streamInfo, error) {
		r := <-done
		return r.info, r.err
	})
}

// writeBackup writes the envelope: header, pg_dump's output run through
// the snapshot, trailer.
func (c *Conn) writeBackup(ctx context.Context, run *backupRun, w io.Writer) error {
	c.backupTest.run(c.backupTest.afterSnapshot)
	guard, err := c.guardBackup(ctx, run.snap.SnapshotName, run.opt)
	if pgerr.Is(err, pgerrcode.InsufficientPrivilege) {
		err = c.explainDumpFailure(ctx, run.opt, false, err) // a privilege the guard's LOCK lacked, as pg_dump would
	}
	var conflict *BackupConflictError
	if errors.As(err, &conflict) {
		return conflict
	} else if err != nil {
		return errorf("siphon: backup: %w", err)
	}
	defer guard.release()
	c.backupTest.run(c.backupTest.afterGuard)
	tables := guard.names()
	ew, err := canonical.NewEnvelopeWriter(w, c.backupHeader(run, tables))
	if err != nil {
		return errorf("siphon: backup: %w", err)
	}
	run.dump.Snapshot = run.snap.SnapshotName
	run.dump.LockWaitTimeout = cmp.Or(c.backupTest.lockWait, backupLockWait)
	if run.opt.Jobs > 1 {
		err = dumpParallel(ctx, run.dump, run.opt.TempDir, ew)
	} else {
		err = pgdump.Dump(ctx, run.dump, ew)
	}
	if exitErr := (*pgdump.ExitError)(nil); errors.As(err, &exitErr) {
		if conflict := guard.queuedConflict(ctx, c.pool, exitErr); conflict != nil {
			return conflict
		}
		err = c.explainDumpFailure(ctx, run.opt, false, err) // a privilege pg_dump lacked, with its GRANT
	}
	if err == nil {
		err = guard.alive(ctx)
	}
	guard.release()
	if err != nil {
		return errorf("siphon: backup: %w", err)
	}
	if run.base != nil {
		if err := c.CaptureBaseEnd(ctx, run.base); err != nil {
			return errorf("siphon: backup: %w", err)
		}
		ew.SetBaseWALEnd(run.base.WALEnd)
	}
	if err := ew.Close(); err != nil {
		return errorf("siphon: backup: %w", err)
	}
	c.log.Info("backup written", "position", run.snap.ConsistentPoint, "body_bytes", ew.Trailer().BodyBytes, "tables", len(tables))
	return nil
}

// backupHeader describes the backup: a dump whose Start and End are the
// snapshot's consistent point.
func (c *Conn) backupHeader(run *backupRun, tables []canonical.TableName) canonical.EnvelopeHeader {
	h := canonical.EnvelopeHeader{
		Kind: canonical.KindDump, Body: canonical.BodyPgDumpCustom, Engine: canonical.EnginePostgres,
		ServerVersion: run.src.serverVersion, Tool: "pg_dump " + run.prog.Version.String(),
		SystemID: run.src.systemID, Timeline: run.src.timeline, Slot: run.chainSlot(c),
		Start: run.snap.ConsistentPoint, End: run.snap.ConsistentPoint, Previous: run.opt.Previous, Tables: tables,
	}
	if run.opt.Jobs > 1 {
		h.Body = canonical.BodyPgDumpDirectoryTar
	}
	if run.base != nil {
		h.Base = &canonical.EnvelopeBase{Slot: run.base.Slot, WALStart: run.base.WALStart}
	}
	return h
}

// dropFailedBase abandons the base slot of a backup that failed: nothing
// will continue from it. Its session goes, and its temporary slot with it.
func (c *Conn) dropFailedBase(slot string) {
	if held := c.bases.take(slot); held != nil {
		closeSession(held.PgConn())
	}
}

// dumpOptions checks opt and turns it into pg_dump's options.
func (c *Conn) dumpOptions(opt BackupOptions) (pgdump.DumpOptions, error) {
	if opt.SerializableDeferrable {
		return pgdump.DumpOptions{}, errorf("siphon: backup: %w", ErrSerializableDeferrable)
	}
	if opt.Jobs < 0 {
		return pgdump.DumpOptions{}, errorf("siphon: backup: Jobs is %d: use 0 or 1 for one job, more for parallel jobs", opt.Jobs)
	}
	conn, err := c.clientConn("")
	if err != nil {
		return pgdump.DumpOptions{}, err
	}
	o := pgdump.DumpOptions{Conn: conn, Compression: opt.Compression, Jobs: opt.Jobs, StrictNames: true,
		Exec: pgdump.ExecOptions{TempDir: opt.TempDir}, ExcludeSchemas: []string{`"siphon"`}}
	lists := []struct {
		option string
		names  []string
		out    *[]string
		schema bool
	}{{"Tables", opt.Tables, &o.Tables, false}, {"ExcludeTables", opt.ExcludeTables, &o.ExcludeTables, false},
		{"ExcludeTableData", opt.ExcludeTableData, &o.ExcludeTableData, false},
		{"Schemas", opt.Schemas, &o.Schemas, true}, {"ExcludeSchemas", opt.ExcludeSchemas, &o.ExcludeSchemas, true}}
	for _, l := range lists {
		for _, name := range l.names {
			pattern, err := literalPattern(name, l.schema)
			if err != nil {
				return pgdump.DumpOptions{}, &OptionError{Option: "BackupOptions." + l.option, Problem: err.Error(),
					Fix: `write each name as for WithTables: schema.table, or "Odd Schema"."Odd Table" for names with upper case or odd characters`}
			}
			*l.out = append(*l.out, pattern)
		}
	}
	return o, nil
}

// literalPattern turns a SQL name into a pg_dump pattern that matches it
// alone: every part double-quoted, which also makes *, ? and regular
// expression characters literal.
func literalPattern(name string, schema bool) (string, error) {
	if schema {
		ident, rest, err := parseIdentifier(strings.TrimSpace(name))
		if err != nil {
			return "", fmt.Errorf("%q: %v", name, err)
		}
		if rest != "" {
			return "", fmt.Errorf("%q: a schema name has one part", name)
		}
		return sqltext.Ident(ident), nil
	}
	t, err := parseTableName(name)
	if err != nil {
		return "", err
	}
	return sqltext.Name(t.Schema, t.Name), nil
}

// clientConn describes the Conn's database (or another of the same
// server) for pg_dump and pg_restore.
func (c *Conn) clientConn(database string) (pgdump.Conn, error) {
	conn, err := pgdump.ParseDSN(c.config.ConnString())
	if err != nil {
		return pgdump.Conn{}, errorf("siphon: %w", err)
	}
	// The Conn's own settings win: they are what its sessions use.
	conn.Host, conn.Port, conn.User, conn.Password = c.config.Host, c.config.Port, c.config.User, c.config.Password
	conn.Database = c.config.Database
	if database != "" {
		conn.Database = database
	}
	if conn.ApplicationName == "" {
		conn.ApplicationName = "siphon"
	}
	return conn, nil
}

// selectTables keeps the tables opt selects.
func selectTables(all []canonical.TableName, opt BackupOptions) ([]canonical.TableName, error) {
	set := func(names []string, schema bool) (map[canonical.TableName]bool, error) {
		m := map[canonical.TableName]bool{}
		for _, s := range names {
			var t canonical.TableName
			var err error
			if schema {
				t.Schema, _, err = parseIdentifier(strings.TrimSpace(s))
			} else {
				t, err = parseTableName(s)
			}
			if err != nil {
				return nil, err
			}
			m[t] = true
		}
		return m, nil
	}
	tables, err1 := set(opt.Tables, false)
	excluded, err2 := set(opt.ExcludeTables, false)
	schemas, err3 := set(opt.Schemas, true)
	excludedSchemas, err4 := set(opt.ExcludeSchemas, true)
	if err := errors.Join(err1, err2, err3, err4); err != nil {
		return nil, err
	}
	// pg_dump's rules: with tables named, the schema options do not
	// apply; excluded tables are excluded either way.
	var out []canonical.TableName
	for _, t := range all {
		inSchema := canonical.TableName{Schema: t.Schema}
		keep := tables[t]
		if len(tables) == 0 {
			keep = (len(schemas) == 0 || schemas[inSchema]) && !excludedSchemas[inSchema]
		}
		if keep && !excluded[t] {
			out = append(out, t)
		}
	}
	return out, nil
}

// dumpParallel runs pg_dump in the directory format with parallel jobs
// into a temporary directory, then streams it into w as a tar: toc.dat
// first, then the other files in name order. The directory is removed
// whatever happens; if this process is killed first, the next parallel
// backup with the same TempDir removes it (see [pgdump.MkdirTemp]).
func dumpParallel(ctx context.Context, opts pgdump.DumpOptions, tempDir string, w io.Writer) error {
	dir, remove, err := pgdump.MkdirTemp(tempDir, "siphon-backup-*")
	if err != nil {
		return fmt.Errorf("make a directory for the parallel dump: %w", err)
	}
	defer remove()
	if err := pgdump.DumpDirectory(ctx, opts, dir); err != nil {
		return err
	}
	return tarDirectory(ctx, dir, w)
}

// tarDirectory writes the regular files of dir (no subdirectories: that is
// the directory format) to w as a tar stream, toc.dat first.
func tarDirectory(ctx context.Context, dir string, w io.Writer) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	slices.SortFunc(entries, func(a, b os.DirEntry) int {
		return compareTOCFirst(a.Name(), b.Name())
	})
	tw := tar.NewWriter(w)
	for _, e := range entries {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := tarFile(tw, filepath.Join(dir, e.Name())); err != nil {
			return err
		}
	}
	return tw.Close()
}

func compareTOCFirst(a, b string) int {
	switch {
	case a == b:
		return 0
	case a == "toc.dat":
		return -1
	case b == "toc.dat":
		return 1
	}
	return strings.Compare(a, b)
}

func tarFile(tw *tar.Writer, path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return err
	}
	if !info.Mode().IsRegular() {
		return fmt.Errorf("parallel dump holds %s, which is not a regular file", info.Name())
	}
	hdr := &tar.Header{Typeflag: tar.TypeReg, Name: info.Name(), Mode: 0o600, Size: info.Size(),
		ModTime: info.ModTime().UTC().Truncate(time.Second), Format: tar.FormatPAX}
	if err := tw.WriteHeader(hdr); err != nil {
		return err
	}
	_, err = io.Copy(tw, f)
	return err
}
