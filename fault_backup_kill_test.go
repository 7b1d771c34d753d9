package siphon_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/siphondb/siphon"
	"github.com/siphondb/siphon/siphontest"
)

// The environment of the backup child, the test binary in child mode
// "backup-kill".
const (
	backupChildDSN  = "SIPHON_BACKUP_CHILD_DSN"
	backupChildSlot = "SIPHON_BACKUP_CHILD_SLOT"
	backupChildOut  = "SIPHON_BACKUP_CHILD_OUT"  // the file the backup goes to
	backupChildTemp = "SIPHON_BACKUP_CHILD_TEMP" // BackupOptions.TempDir
	backupChildJobs = "SIPHON_BACKUP_CHILD_JOBS"
	backupChildBase = "SIPHON_BACKUP_CHILD_BASE" // "true": BaseSlot
	// backupChildHold is how many body bytes the child writes to its
	// output before its writes block until it is killed: it cannot finish
	// its backup before the test kills it.
	backupChildHold = "SIPHON_BACKUP_CHILD_HOLD"
)

// backupKillMode is one way to run the killed backup.
type backupKillMode struct {
	name     string
	jobs     int
	baseSlot bool
}

func (m backupKillMode) options(tempDir string) siphon.BackupOptions {
	return siphon.BackupOptions{Jobs: m.jobs, BaseSlot: m.baseSlot, TempDir: tempDir}
}

var backupKillModes = []backupKillMode{
	{name: "custom format"},
	{name: "2 parallel jobs", jobs: 2},
	{name: "custom format with a base slot", baseSlot: true},
	{name: "2 parallel jobs with a base slot", jobs: 2, baseSlot: true},
}

// TestKillBackupMidDumpLeavesNothing runs Backup in a child process and
// SIGKILLs it at a random moment while pg_dump runs, N times
// (SIPHON_BACKUP_KILL_ROUNDS, default 5), in the custom format and with
// parallel jobs (a directory-format dump in a temporary directory), with and
// without a base slot. The role has a password, so pg_dump gets a password
// file. After each kill: no pg_dump process is left (pg_dump dies with its
// parent; parallel workers once their table is written), no session, slot,
// walsender or lock on the source, the cut output fails Verify, and the next
// Backup in the same TempDir succeeds, passes Verify, and leaves the
// TempDir empty, the files of the killed run included. A killed backup with
// a base slot leaves no slot: the base slot was still the temporary slot of
// the backup's session. The last backups of each kind restore to the
// source's data. The test runs on a private server: base slots are
// server-wide.
func TestKillBackupMidDumpLeavesNothing(t *testing.T) {
	t.Parallel()
	skipUnlessDumpClients(t)
	ctx := context.Background()
	rounds := envInt(t, "SIPHON_BACKUP_KILL_ROUNDS", 5)
	srv := siphontest.Start(t, siphontest.WithPrivateServer())
	adminDSN := srv.NewDatabase(t)
	admin := connectOrFail(t, adminDSN)
	execSQL(t, admin,
		`CREATE ROLE kb_dumper LOGIN SUPERUSER PASSWORD 'kb secret: 7'`,
		`CREATE TABLE kb_a (id int8 PRIMARY KEY, body text, n int)`,
		`CREATE TABLE kb_b (id int8 PRIMARY KEY, body text, n int)`,
		`INSERT INTO kb_a SELECT i, md5(i::text) || md5((i + 1)::text), i % 97 FROM generate_series(1, 200000) i`,
		`INSERT INTO kb_b SELECT i, md5(i::text), i % 89 FROM generate_series(1, 200000) i`)
	u, err := url.Parse(adminDSN)
	require.NoError(t, err)
	u.User = url.UserPassword("kb_dumper", "kb secret: 7")
	dsn := u.String()
	database := strings.TrimPrefix(u.Path, "/")

	// The test's own sessions are closed while a child runs, so that
	// whatever siphon session is left on the source is the child's.
	c, slot := backupConn(t, dsn)
	connect := func() *siphon.Conn {
		c, err := siphon.Connect(ctx, dsn, siphon.WithSlot(slot), siphon.WithPublication(slot))
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		return c
	}
	temp, out := t.TempDir(), t.TempDir()
	// A first backup of each format, in this process: how large a dump
	// is, so that kills land at a random point of the dump's progress, and
	// a TempDir clean after a backup that ran to its end.
	sizes := map[int]int64{}
	for _, m := range backupKillModes[:2] {
		began := time.Now()
		var buf bytes.Buffer
		require.NoError(t, c.Backup(ctx, m.options(temp), &buf), m.name)
		sizes[m.jobs] = int64(buf.Len())
		assertDirEmpty(t, temp, "after a backup")
		t.Logf("a backup (%s) takes %v and %d bytes", m.name, time.Since(began).Round(time.Millisecond), buf.Len())
	}
	require.NoError(t, c.Close())

	env := []string{backupChildDSN + "=" + dsn, backupChildSlot + "=" + slot,
		backupChildOut + "=" + filepath.Join(out, "cut.siphon"), backupChildTemp + "=" + temp}
	latest := map[int][]byte{} // the last good backup, by jobs
	for i := range rounds {
		m := backupKillModes[i%len(backupKillModes)]
		// The dump's progress: what pg_dump has written to the output, or
		// to the parallel dump's directory.
		progress := func() int64 { return fileSizes(filepath.Join(out, "cut.siphon")) }
		if m.jobs > 1 {
			progress = func() int64 { return fileSizes(filepath.Join(temp, "siphon-backup-*", "*")) }
		}
		// The child's output holds at killAt body bytes (a custom-format
		// dump: pg_dump then blocks on its pipe), or halfway through the
		// tar it writes once its parallel dump is complete: the kill, once
		// progress reaches killAt, always finds it running.
		killAt := rand.Int64N(sizes[m.jobs] * 9 / 10)
		hold := killAt
		if m.jobs > 1 {
			hold = sizes[m.jobs] / 2
		}
		r := killBackupChild(t, append(env, backupChildJobs+"="+strconv.Itoa(m.jobs), backupChildBase+"="+strconv.FormatBool(m.baseSlot),
			backupChildHold+"="+strconv.FormatInt(hold, 10)), database, progress, killAt)
		awaitNoLeftovers(t, admin, slot)
		left := dirNames(t, temp)

		c := connect()
		rep, err := c.Verify(ctx, bytes.NewReader(r.output))
		if err == nil {
			assert.False(t, rep.OK, "Verify refuses a backup cut by a kill")
		}
		waitFor(t, "no base slot is left: a killed backup's went with its session", func() bool { return len(physicalSlots(t, admin)) == 0 })

		var next bytes.Buffer
		require.NoError(t, c.Backup(ctx, m.options(temp), &next), "the next backup, %s", m.name)
		rep, err = c.Verify(ctx, bytes.NewReader(next.Bytes()))
		require.NoError(t, err)
		assert.True(t, rep.OK, "%v", rep.Problems)
		assertDirEmpty(t, temp, "after the next backup")
		if m.baseSlot {
			require.NotNil(t, rep.Base)
			assert.Len(t, physicalSlots(t, admin), 1, "the next backup completed its base slot")
			require.NoError(t, c.DropSlot(ctx, rep.Base.Slot), "its chain is sealed")
		}
		latest[m.jobs] = next.Bytes()
		require.NoError(t, c.Close())
		t.Logf("round %d (%s): killed %v into the dump, at %d of %d bytes (%d%%), %d pg_dump processes, all gone %v after the kill; "+
			"left in TempDir until the next backup: %v", i+1, m.name, r.after.Round(time.Millisecond), r.progress, sizes[m.jobs],
			100*r.progress/sizes[m.jobs], r.procs, r.gone.Round(time.Millisecond), left)
	}

	for jobs, data := range latest {
		dstDSN := srv.NewDatabase(t)
		dst, err := pgx.Connect(ctx, dstDSN)
		require.NoError(t, err)
		target, _ := backupConn(t, dstDSN)
		require.NoError(t, target.Restore(ctx, siphon.RestoreOptions{Jobs: jobs, TempDir: temp}, bytes.NewReader(data)))
		assert.Equal(t, tableDigests(t, admin), tableDigests(t, dst), "restored with %d jobs", jobs)
		dst.Close(ctx)
		require.NoError(t, target.Close())
		assertNoLeaks(t, dstDSN)
	}
	assertDirEmpty(t, temp, "after the restores")
	c = connect()
	require.NoError(t, c.DropSlot(ctx, slot))
	require.NoError(t, c.Close())
	assertNoLeaks(t, dsn)
	assert.Empty(t, physicalSlots(t, admin))
}

// killedBackup is what a killed backup child left.
type killedBackup struct {
	output   []byte        // the cut backup
	after    time.Duration // from pg_dump's start to the kill
	progress int64         // bytes dumped at the kill
	procs    int           // pg_dump processes seen
	gone     time.Duration // from the kill until the last was gone
}

// killBackupChild starts the backup child, waits until its pg_dump runs,
// SIGKILLs the child once progress reports killAt bytes dumped, and waits
// until no pg_dump of database is left. The child holds its output before
// it can end (backupChildHold), so an exit before the kill is a failure.
func killBackupChild(t *testing.T, env []string, database string, progress func() int64, killAt int64) killedBackup {
	t.Helper()
	cmd := childCmd("backup-kill", env...)
	var stderr lockedBuffer
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	var leader int
	if !waitUntil(func() bool {
		for _, p := range pgDumpProcesses(database) {
			if p.ppid == cmd.Process.Pid {
				leader = p.pid
			}
		}
		return leader != 0 || len(exited) > 0
	}) {
		t.Fatalf("pg_dump did not start within %v\nthe child's stderr: %s", waitDeadline, stderr.String())
	}
	started := time.Now()
	seen := map[int]bool{}
	var dumped int64
	for leader != 0 {
		for _, p := range pgDumpProcesses(database) {
			seen[p.pid] = true
		}
		if dumped = progress(); dumped >= killAt {
			break
		}
		select {
		case err := <-exited:
			t.Fatalf("the backup child exited before it was killed: %v\nstderr: %s", err, stderr.String())
		case <-time.After(2 * time.Millisecond):
		}
	}
	if leader == 0 {
		err := <-exited
		t.Fatalf("the backup child exited before pg_dump ran: %v\nstderr: %s", err, stderr.String())
	}
	require.NoError(t, cmd.Process.Kill())
	<-exited
	killed := time.Now()
	var left []procStat
	waitFor(t, fmt.Sprintf("pg_dump processes left: %v", left), func() bool {
		left = pgDumpProcesses(database)
		return len(left) == 0
	})
	output, err := os.ReadFile(envValue(env, backupChildOut))
	require.NoError(t, err)
	return killedBackup{output: output, after: killed.Sub(started), progress: dumped, procs: len(seen), gone: time.Since(killed)}
}

// fileSizes adds up the sizes of the files pattern matches.
func fileSizes(pattern string) int64 {
	paths, _ := filepath.Glob(pattern)
	var n int64
	for _, p := range paths {
		if info, err := os.Stat(p); err == nil {
			n += info.Size()
		}
	}
	return n
}

// envValue returns the value of name in env.
func envValue(env []string, name string) string {
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, name+"="); ok {
			return v
		}
	}
	return ""
}

// procStat is a process as /proc/<pid>/stat describes it.
type procStat struct {
	pid, ppid, pgrp int
	state, comm     string
}

// pgDumpProcesses lists the live (not zombie) pg_dump processes connected
// to database.
func pgDumpProcesses(database string) []procStat { return programProcesses("pg_dump", database) }

// programProcesses lists the live (not zombie) processes of program
// connected to database, which they are told in their environment
// (PGDATABASE), never in argv.
func programProcesses(program, database string) []procStat {
	var found []procStat
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, path := range stats {
		p, ok := readProcStat(path)
		if !ok || p.comm != program || p.state == "Z" {
			continue
		}
		environ, _ := os.ReadFile(filepath.Join(filepath.Dir(path), "environ"))
		if bytes.Contains(environ, []byte("\x00PGDATABASE="+database+"\x00")) ||
			bytes.HasPrefix(environ, []byte("PGDATABASE="+database+"\x00")) {
			found = append(found, p)
		}
	}
	return found
}

func readProcStat(path string) (procStat, bool) {
	data, err := os.ReadFile(path)
	if err != nil {
		return procStat{}, false // it exited meanwhile
	}
	// pid (comm) state ppid pgrp ...; comm may hold spaces and parentheses.
	open, end := bytes.IndexByte(data, '('), bytes.LastIndexByte(data, ')')
	if open < 0 || end < open {
		return procStat{}, false
	}
	fields := strings.Fields(string(data[end+1:]))
	if len(fields) < 3 {
		return procStat{}, false
	}
	p := procStat{comm: string(data[open+1 : end]), state: fields[0]}
	p.pid, _ = strconv.Atoi(strings.TrimSpace(string(data[:open])))
	p.ppid, _ = strconv.Atoi(fields[1])
	p.pgrp, _ = strconv.Atoi(fields[2])
	return p, true
}

// awaitNoLeftovers waits until the source holds nothing of the killed
// child but the persistent slot: no snapshot slot, walsender, lock or
// session (pg_dump's included: it runs as "siphon").
func awaitNoLeftovers(t *testing.T, admin *pgx.Conn, slot string) {
	t.Helper()
	var left []string
	waitUntil(func() bool {
		var err error
		left, err = leftovers(context.Background(), admin, []string{slot})
		require.NoError(t, err)
		return len(left) == 0
	})
	require.Empty(t, left, "left by the killed child")
}

// physicalSlot is a physical replication slot of the server.
type physicalSlot struct {
	name   string
	active bool
}

func physicalSlots(t *testing.T, admin *pgx.Conn) []physicalSlot {
	t.Helper()
	rows, err := admin.Query(context.Background(), `SELECT slot_name, active FROM pg_replication_slots WHERE slot_type = 'physical'`)
	require.NoError(t, err)
	slots, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (physicalSlot, error) {
		var s physicalSlot
		return s, r.Scan(&s.name, &s.active)
	})
	require.NoError(t, err)
	return slots
}

// dirNames lists the names in dir.
func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	names := make([]string, len(entries))
	for i, e := range entries {
		names[i] = e.Name()
	}
	return names
}

// assertDirEmpty checks that dir holds nothing.
func assertDirEmpty(t *testing.T, dir, when string) {
	t.Helper()
	assert.Empty(t, dirNames(t, dir), "temporary files left %s", when)
}

func init() { childModes["backup-kill"] = backupKillChild }

// backupKillChild is the backup child: one Backup into a file, which the
// test kills before it ends.
func backupKillChild() error {
	ctx, cancel := context.WithTimeout(context.Background(), waitDeadline)
	defer cancel()
	jobs, err := strconv.Atoi(os.Getenv(backupChildJobs))
	if err != nil {
		return err
	}
	c, err := siphon.Connect(ctx, os.Getenv(backupChildDSN), siphon.WithSlot(os.Getenv(backupChildSlot)),
		siphon.WithPublication(os.Getenv(backupChildSlot)))
	if err != nil {
		return err
	}
	defer c.Close()
	hold, err := strconv.ParseInt(os.Getenv(backupChildHold), 10, 64)
	if err != nil {
		return err
	}
	f, err := os.Create(os.Getenv(backupChildOut))
	if err != nil {
		return err
	}
	opt := siphon.BackupOptions{Jobs: jobs, BaseSlot: os.Getenv(backupChildBase) == "true", TempDir: os.Getenv(backupChildTemp)}
	err = c.Backup(ctx, opt, &holdingWriter{ctx: ctx, w: f, header: true, left: hold})
	return errors.Join(err, f.Close(), errors.New("the backup ended before the kill"))
}

// holdingWriter passes writes on to w until left bytes have passed, then
// blocks until ctx is done. The first write passes whole when header is
// set: the envelope's magic and header lines, which come before the body.
type holdingWriter struct {
	ctx    context.Context
	w      io.Writer
	header bool
	left   int64
}

func (h *holdingWriter) Write(p []byte) (int, error) {
	if h.header {
		h.header = false
		return h.w.Write(p)
	}
	n := int(min(int64(len(p)), h.left))
	if _, err := h.w.Write(p[:n]); err != nil {
		return 0, err
	}
	if h.left -= int64(n); n < len(p) {
		<-h.ctx.Done()
		return n, h.ctx.Err()
	}
	return n, nil
}

// The environment of the restore child, the test binary in child mode
// "restore-kill".
const (
	restoreChildDSN  = "SIPHON_RESTORE_CHILD_DSN"
	restoreChildIn   = "SIPHON_RESTORE_CHILD_IN"
	restoreChildTemp = "SIPHON_RESTORE_CHILD_TEMP"
	restoreChildJobs = "SIPHON_RESTORE_CHILD_JOBS"
	restoreChildHold = "SIPHON_RESTORE_CHILD_HOLD" // bytes of input read before the input holds
)

// TestKillRestoreLeavesNothing runs Restore in a child process and
// SIGKILLs it N times (SIPHON_RESTORE_KILL_ROUNDS, default 4): while it
// spools the backup's body to TempDir, or while pg_restore loads a table,
// once a random number of its rows are in, with one job or two. After each kill no pg_restore
// process and no session is left, and the next Restore (into a fresh
// database: the killed one holds part of the data) succeeds, gives the
// source's data, and leaves TempDir empty, the killed run's spooled body
// included. The killed restore cannot end before its kill: a spooling
// child's input holds at a random byte, and pg_restore's index builds wait
// for a lock the test holds until after the kill.
func TestKillRestoreLeavesNothing(t *testing.T) {
	t.Parallel()
	skipUnlessDumpClients(t)
	ctx := context.Background()
	rounds := envInt(t, "SIPHON_RESTORE_KILL_ROUNDS", 4)
	srcDSN, src := newDatabase(t)
	execSQL(t, src,
		`CREATE TABLE kr_a (id int8 PRIMARY KEY, body text)`,
		`CREATE TABLE kr_b (id int8 PRIMARY KEY, body text)`,
		`CREATE INDEX ON kr_a (body)`,
		`INSERT INTO kr_a SELECT i, md5(i::text) FROM generate_series(1, 150000) i`,
		`INSERT INTO kr_b SELECT i, md5(i::text) FROM generate_series(1, 150000) i`)
	c, _ := backupConn(t, srcDSN)
	backupFile := filepath.Join(t.TempDir(), "full.siphon")
	data := backup(t, c, siphon.BackupOptions{})
	require.NoError(t, os.WriteFile(backupFile, data, 0o600))
	require.NoError(t, c.Close())
	want := tableDigests(t, src)
	temp := t.TempDir()

	for i := range rounds {
		jobs, spooling := 1+i%2, i%3 == 0
		dstDSN, dst := newDatabase(t)
		database := dst.Config().Database
		hold := int64(len(data)) + 1 // more than the backup: the input never holds
		if spooling {
			hold = 1 + rand.Int64N(int64(len(data))-1)
		}
		release := holdIndexBuilds(t, dstDSN)
		env := []string{restoreChildDSN + "=" + dstDSN, restoreChildIn + "=" + backupFile, restoreChildTemp + "=" + temp,
			restoreChildJobs + "=" + strconv.Itoa(jobs), restoreChildHold + "=" + strconv.FormatInt(hold, 10)}
		cmd := childCmd("restore-kill", env...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		require.NoError(t, cmd.Start())
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		// Killed once the body is being spooled, or once a COPY of
		// pg_restore's has loaded a random number of a table's rows (or
		// every row is in and an index build waits).
		began := time.Now()
		where := restoreKillPoint(t, dst, temp, spooling, 1+rand.Int64N(120000), exited)
		if len(exited) > 0 {
			t.Fatalf("the restore child exited before it was killed: %v\nstderr: %s", <-exited, stderr.String())
		}
		require.NoError(t, cmd.Process.Kill())
		<-exited
		killed := time.Now()
		release()
		waitFor(t, "pg_restore processes left", func() bool { return len(programProcesses("pg_restore", database)) == 0 })
		gone := time.Since(killed)
		awaitNoLeftovers(t, dst, "")
		left := dirNames(t, temp)

		nextDSN, next := newDatabase(t)
		target, _ := backupConn(t, nextDSN)
		f, err := os.Open(backupFile)
		require.NoError(t, err)
		require.NoError(t, target.Restore(ctx, siphon.RestoreOptions{Jobs: jobs, TempDir: temp}, f))
		f.Close()
		assert.Equal(t, want, tableDigests(t, next), "the next restore gives the source's data")
		assertDirEmpty(t, temp, "after the next restore")
		require.NoError(t, target.Close())
		t.Logf("round %d (%d jobs): killed %s, %v after the start; pg_restore gone %v after the kill; left in TempDir until the next restore: %v",
			i+1, jobs, where, killed.Sub(began).Round(time.Millisecond), gone.Round(time.Millisecond), left)
	}
}

// indexBuildLock is the advisory lock that holdIndexBuilds makes CREATE
// INDEX wait for.
const indexBuildLock = 7_201_114

// holdIndexBuilds makes every CREATE INDEX in the database at dsn wait for
// an advisory lock that a session of the test holds until release is
// called (or the test ends): a restore into it can load every row, but it
// cannot end.
func holdIndexBuilds(t *testing.T, dsn string) (release func()) {
	t.Helper()
	holder := connectOrFail(t, dsn)
	execSQL(t, holder,
		fmt.Sprintf(`CREATE FUNCTION hold_index_build() RETURNS event_trigger LANGUAGE plpgsql AS
			$$BEGIN PERFORM pg_advisory_lock(%d); PERFORM pg_advisory_unlock(%[1]d); END$$`, indexBuildLock),
		`CREATE EVENT TRIGGER hold_index_build ON ddl_command_start WHEN TAG IN ('CREATE INDEX') EXECUTE FUNCTION hold_index_build()`,
		fmt.Sprintf(`SELECT pg_advisory_lock(%d)`, indexBuildLock))
	return func() { execSQL(t, holder, fmt.Sprintf(`SELECT pg_advisory_unlock(%d)`, indexBuildLock)) }
}

// restoreKillPoint waits until the restore child is spooling the body
// into temp, or (not spooling) until one of pg_restore's COPY commands in
// the target has loaded rows rows or an index build waits for
// holdIndexBuilds' lock, or the child exited, and says where it stands.
func restoreKillPoint(t *testing.T, dst *pgx.Conn, temp string, spooling bool, rows int64, exited chan error) string {
	t.Helper()
	for deadline := time.Now().Add(waitDeadline); time.Now().Before(deadline) && len(exited) == 0; time.Sleep(time.Millisecond) {
		if spooling {
			if entries, _ := os.ReadDir(temp); len(entries) > 0 {
				return "while spooling"
			}
			continue
		}
		var copied int64
		var waiting bool
		err := dst.QueryRow(context.Background(), `SELECT
			(SELECT coalesce(max(tuples_processed), 0) FROM pg_stat_progress_copy WHERE datname = current_database()),
			EXISTS (SELECT FROM pg_locks WHERE locktype = 'advisory' AND objid = $1 AND NOT granted)`, indexBuildLock).Scan(&copied, &waiting)
		require.NoError(t, err)
		switch {
		case copied >= rows:
			return fmt.Sprintf("mid-COPY, %d rows into a table", copied)
		case waiting:
			return "with every row in, at an index build"
		}
	}
	require.NotZero(t, len(exited), "the restore child neither spooled nor copied within %v", waitDeadline)
	return "after it exited"
}

func init() { childModes["restore-kill"] = restoreKillChild }

// restoreKillChild is the restore child: one Restore from a file, which
// the test kills before it ends. Its input holds after restoreChildHold
// bytes.
func restoreKillChild() error {
	ctx, cancel := context.WithTimeout(context.Background(), waitDeadline)
	defer cancel()
	jobs, err := strconv.Atoi(os.Getenv(restoreChildJobs))
	if err != nil {
		return err
	}
	hold, err := strconv.ParseInt(os.Getenv(restoreChildHold), 10, 64)
	if err != nil {
		return err
	}
	c, err := siphon.Connect(ctx, os.Getenv(restoreChildDSN))
	if err != nil {
		return err
	}
	defer c.Close()
	f, err := os.Open(os.Getenv(restoreChildIn))
	if err != nil {
		return err
	}
	defer f.Close()
	err = c.Restore(ctx, siphon.RestoreOptions{Jobs: jobs, TempDir: os.Getenv(restoreChildTemp)}, &holdingReader{ctx: ctx, r: f, left: hold})
	return errors.Join(err, errors.New("the restore ended before the kill"))
}

// holdingReader reads from r until left bytes have passed, then blocks
// until ctx is done.
type holdingReader struct {
	ctx  context.Context
	r    io.Reader
	left int64
}

func (h *holdingReader) Read(p []byte) (int, error) {
	if h.left == 0 {
		<-h.ctx.Done()
		return 0, h.ctx.Err()
	}
	n, err := h.r.Read(p[:min(int64(len(p)), h.left)])
	h.left -= int64(n)
	return n, err
}
