package pgdump_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/siphondb/siphon/pgdump"
	"github.com/siphondb/siphon/siphontest"
)

func TestMain(m *testing.M) { siphontest.Main(m, siphontest.CheckLeaks()) }

// database returns a fresh database as a pgdump.Conn and an admin session.
func database(t *testing.T) (pgdump.Conn, *pgx.Conn) {
	t.Helper()
	dsn := siphontest.Start(t).NewDatabase(t)
	conn, err := pgx.Connect(context.Background(), dsn)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close(context.Background()) })
	c, err := pgdump.ParseDSN(dsn)
	require.NoError(t, err)
	return c, conn
}

func execSQL(t *testing.T, conn *pgx.Conn, statements ...string) {
	t.Helper()
	for _, s := range statements {
		_, err := conn.Exec(context.Background(), s)
		require.NoError(t, err, s)
	}
}

// digest returns an ordered digest of a table's rows.
func digest(t *testing.T, conn *pgx.Conn, table string) string {
	t.Helper()
	var d *string
	require.NoError(t, conn.QueryRow(context.Background(),
		"SELECT md5(string_agg(x::text, '|' ORDER BY x::text)) FROM "+table+" x").Scan(&d))
	require.NotNil(t, d, "table %s is empty", table)
	return *d
}

const fillTable = `CREATE TABLE items AS SELECT g AS id, md5(g::text) || md5((g * 7)::text) AS body FROM generate_series(1, %d) g`

func TestDumpRestoreRoundTrip(t *testing.T) {
	t.Parallel()
	src, srcConn := database(t)
	execSQL(t, srcConn, fmt.Sprintf(fillTable, 1000), `ALTER TABLE items ADD PRIMARY KEY (id)`,
		`CREATE TABLE "Odd ""Name"" ü" (v text)`, `INSERT INTO "Odd ""Name"" ü" VALUES ('x'), (NULL)`)
	ctx := context.Background()

	var archive bytes.Buffer
	require.NoError(t, pgdump.Dump(ctx, pgdump.DumpOptions{Conn: src}, &archive))
	assert.True(t, bytes.HasPrefix(archive.Bytes(), []byte("PGDMP")), "custom format by default")

	listing, err := pgdump.List(ctx, pgdump.ListOptions{}, bytes.NewReader(archive.Bytes()))
	require.NoError(t, err)
	assert.Equal(t, "CUSTOM", listing.Format)
	assert.Equal(t, src.Database, listing.Database)
	_, ok := listing.Find("TABLE DATA", "public", "items")
	assert.True(t, ok, "the listing names the table's data")
	_, ok = listing.Find("TABLE", "public", `Odd "Name" ü`)
	assert.True(t, ok, "odd names are found as written")

	dst, dstConn := database(t)
	require.NoError(t, pgdump.Restore(ctx, pgdump.RestoreOptions{Conn: dst}, &archive))
	assert.Equal(t, digest(t, srcConn, "items"), digest(t, dstConn, "items"))
	assert.Equal(t, digest(t, srcConn, `"Odd ""Name"" ü"`), digest(t, dstConn, `"Odd ""Name"" ü"`))
}

func TestDumpDirectoryRestoreFileInParallel(t *testing.T) {
	t.Parallel()
	// As a role with a password: the workers pg_dump and pg_restore fork
	// connect with it too.
	src, srcConn := database(t)
	src = passwordRole(t, src, srcConn, "parallel-pw-5521", 2000)
	execSQL(t, srcConn, `CREATE TABLE other AS SELECT * FROM items`, "ALTER TABLE other OWNER TO "+src.User)
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "dump")
	require.NoError(t, pgdump.DumpDirectory(ctx, pgdump.DumpOptions{Conn: src, Jobs: 2}, dir))
	assert.FileExists(t, filepath.Join(dir, "toc.dat"))

	dst, dstConn := database(t)
	execSQL(t, dstConn, "GRANT CREATE ON SCHEMA public TO "+src.User)
	t.Cleanup(func() { dstConn.Exec(context.Background(), "DROP OWNED BY "+src.User) })
	dst.User, dst.Password = src.User, src.Password
	require.NoError(t, pgdump.RestoreFile(ctx, pgdump.RestoreOptions{Conn: dst, Jobs: 2}, dir))
	assert.Equal(t, digest(t, srcConn, "items"), digest(t, dstConn, "items"))
	assert.Equal(t, digest(t, srcConn, "other"), digest(t, dstConn, "other"))

	err := pgdump.Restore(ctx, pgdump.RestoreOptions{Conn: dst, Jobs: 2}, strings.NewReader(""))
	assert.ErrorIs(t, err, pgdump.ErrUnsupported, "parallel restore from a stream is refused up front")
}

func TestDumpFailureIsAnExitErrorWithStderr(t *testing.T) {
	t.Parallel()
	src, _ := database(t)
	err := pgdump.Dump(context.Background(), pgdump.DumpOptions{Conn: src, Tables: []string{"no_such_table"}, StrictNames: true}, &bytes.Buffer{})
	var exitErr *pgdump.ExitError
	require.ErrorAs(t, err, &exitErr)
	assert.Equal(t, 1, exitErr.ExitCode)
	assert.Contains(t, exitErr.Stderr, "no matching tables were found")
	assert.Contains(t, exitErr.Args, "--table=no_such_table")
	assert.Contains(t, err.Error(), "no matching tables were found", "the message carries pg_dump's own words")
}

func TestRestoreStopsAtFirstError(t *testing.T) {
	t.Parallel()
	src, srcConn := database(t)
	execSQL(t, srcConn, `CREATE TABLE a (id int)`, `CREATE TABLE b (id int)`, `INSERT INTO b VALUES (1)`)
	var archive bytes.Buffer
	require.NoError(t, pgdump.Dump(context.Background(), pgdump.DumpOptions{Conn: src}, &archive))

	dst, dstConn := database(t)
	execSQL(t, dstConn, `CREATE TABLE a (other text)`) // makes CREATE TABLE a fail
	err := pgdump.Restore(context.Background(), pgdump.RestoreOptions{Conn: dst}, &archive)
	var exitErr *pgdump.ExitError
	require.ErrorAs(t, err, &exitErr)
	assert.Contains(t, exitErr.Stderr, `relation "a" already exists`)
	var exists bool
	require.NoError(t, dstConn.QueryRow(context.Background(), "SELECT to_regclass('b') IS NOT NULL").Scan(&exists))
	assert.False(t, exists, "--exit-on-error: nothing after the failing statement ran")
}

// processes returns the child processes of this test binary named name
// whose environment holds marker (tests run in parallel), with their
// process group IDs.
func processes(t *testing.T, name, marker string) map[int]int {
	t.Helper()
	return childrenOf(t, os.Getpid(), name, marker)
}

// childrenOf is processes for the children of parent; 0 means any.
func childrenOf(t *testing.T, parent int, name, marker string) map[int]int {
	t.Helper()
	found := map[int]int{}
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, path := range stats {
		data, err := os.ReadFile(path)
		if err != nil {
			continue // gone meanwhile
		}
		open, close := bytes.IndexByte(data, '('), bytes.LastIndexByte(data, ')')
		if open < 0 || close < open {
			continue
		}
		fields := strings.Fields(string(data[close+1:]))
		if len(fields) < 3 || string(data[open+1:close]) != name {
			continue
		}
		ppid, _ := strconv.Atoi(fields[1])
		pgid, _ := strconv.Atoi(fields[2])
		pid, _ := strconv.Atoi(strings.TrimSpace(string(data[:open])))
		environ, _ := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
		if (parent == 0 || ppid == parent) && bytes.Contains(environ, []byte(marker)) {
			found[pid] = pgid
		}
	}
	return found
}

// groupGone reports whether no process of the group is left.
func groupGone(pgid int) bool { return errors.Is(syscall.Kill(-pgid, 0), syscall.ESRCH) }

// gate is a writer whose first Write blocks until release is closed (or
// ctx ends), so that the program writing to it stays alive.
type gate struct {
	ctx     context.Context
	cancel  context.CancelFunc
	once    sync.Once
	started chan struct{}
	release chan struct{}
}

func newGate(ctx context.Context) *gate {
	return &gate{ctx: ctx, started: make(chan struct{}), release: make(chan struct{})}
}

func (g *gate) Write(p []byte) (int, error) {
	g.once.Do(func() { close(g.started) })
	select {
	case <-g.release:
		return len(p), nil
	case <-g.ctx.Done():
		return 0, g.ctx.Err()
	}
}

// passwordRole makes a role that must give its password and owns a table
// of rows rows in src's database, and returns src connecting as it.
func passwordRole(t *testing.T, src pgdump.Conn, admin *pgx.Conn, password string, rows int) pgdump.Conn {
	t.Helper()
	role := fmt.Sprintf("dump_role_%d", time.Now().UnixNano())
	execSQL(t, admin, fmt.Sprintf("CREATE ROLE %s LOGIN PASSWORD '%s'", role, password),
		fmt.Sprintf(fillTable, rows), "ALTER TABLE items OWNER TO "+role)
	t.Cleanup(func() {
		admin.Exec(context.Background(), "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1", role)
		admin.Exec(context.Background(), "DROP OWNED BY "+role+"; DROP ROLE "+role)
	})
	src.User, src.Password = role, password
	return src
}

// databaseMarker picks out, by its environment, a program connected to
// database.
func databaseMarker(database string) string { return "PGDATABASE=" + database + "\x00" }

// passfileDescriptors lists the descriptors of process pid open on a
// password file made in dir.
func passfileDescriptors(t *testing.T, pid int, dir string) []string {
	t.Helper()
	links, err := filepath.Glob(fmt.Sprintf("/proc/%d/fd/*", pid))
	require.NoError(t, err)
	var found []string
	for _, link := range links {
		if target, err := os.Readlink(link); err == nil && strings.HasPrefix(target, filepath.Join(dir, "siphon-pgpass-")) {
			found = append(found, filepath.Base(link)+" -> "+target)
		}
	}
	return found
}

func TestPasswordNeverInArgv(t *testing.T) {
	t.Parallel()
	src, admin := database(t)
	const password = `pa:ss\wörd-87125`
	src = passwordRole(t, src, admin, password, 50000)
	tmp := t.TempDir()

	w, done := startDump(t, pgdump.DumpOptions{Conn: src, Tables: []string{"items"}, Exec: pgdump.ExecOptions{TempDir: tmp}})
	procs := processes(t, "pg_dump", databaseMarker(src.Database))
	require.Len(t, procs, 1)
	for pid := range procs {
		cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		require.NoError(t, err)
		assert.Contains(t, string(cmdline), "--table=items")
		assert.NotContains(t, string(cmdline), password)
		assert.NotContains(t, string(cmdline), "pa:ss")
		environ, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
		require.NoError(t, err)
		assert.NotContains(t, string(environ), password, "not in the environment either: in a password file")
		assert.Contains(t, string(environ), "\x00PGPASSFILE=/proc/self/fd/3\x00")
		fds := passfileDescriptors(t, pid, tmp)
		require.Len(t, fds, 1, "pg_dump holds the password file open")
		assert.True(t, strings.HasPrefix(fds[0], "3 -> ") && strings.HasSuffix(fds[0], " (deleted)"),
			"as its descriptor 3, unlinked: %s", fds[0])
		assert.Empty(t, passfileDescriptors(t, os.Getpid(), tmp), "this process closed its copy once pg_dump started")
	}
	entries, err := os.ReadDir(tmp)
	require.NoError(t, err)
	assert.Empty(t, entries, "while pg_dump runs, no password file is on disk")
	close(w.release)
	require.NoError(t, <-done, "the role authenticated with the password from the file")
	entries, err = os.ReadDir(tmp)
	require.NoError(t, err)
	assert.Empty(t, entries)
}

// The environment of the killed dump's child (TestKilledDumpChild): the
// connection, as JSON, and the TempDir.
const (
	killChildConn = "SIPHON_PGDUMP_KILL_CHILD_CONN"
	killChildTemp = "SIPHON_PGDUMP_KILL_CHILD_TEMP"
)

// killChildDumping is what the child prints once pg_dump, authenticated,
// has written.
const killChildDumping = "pg_dump is dumping"

// TestKilledProcessLeavesNoPassword runs a dump as a role with a password
// in a child process, SIGKILLs the child while pg_dump writes, and finds
// no password anywhere in TempDir afterwards, nor the pg_dump (it dies
// with its parent, and its descriptor, the password file's last link,
// with it).
func TestKilledProcessLeavesNoPassword(t *testing.T) {
	t.Parallel()
	src, admin := database(t)
	const password = "killed-pw-40417"
	src = passwordRole(t, src, admin, password, 50000)
	tmp := t.TempDir()
	conn, err := json.Marshal(src)
	require.NoError(t, err)

	cmd := exec.Command(os.Args[0], "-test.run=^TestKilledDumpChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), killChildConn+"="+string(conn), killChildTemp+"="+tmp)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	waited := false
	t.Cleanup(func() {
		if !waited {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	// Test output goes to stdout: the child's says why it ended, if it
	// ends before it is dumping.
	dumping := make(chan error, 1)
	go func() {
		var output strings.Builder
		scanner := bufio.NewScanner(stdout)
		for scanner.Scan() {
			if scanner.Text() == killChildDumping {
				dumping <- nil
				for scanner.Scan() { // until the child is gone
				}
				return
			}
			output.WriteString(scanner.Text() + "\n")
		}
		dumping <- errors.New(output.String())
	}()
	select {
	case err := <-dumping:
		if err != nil {
			cmd.Wait()
			waited = true
			t.Fatalf("the child ended before pg_dump wrote:\n%v%s", err, stderr.String())
		}
	case <-time.After(time.Minute):
		t.Fatal("pg_dump did not start writing within a minute")
	}
	marker := databaseMarker(src.Database)
	require.Len(t, childrenOf(t, cmd.Process.Pid, "pg_dump", marker), 1)
	require.NoError(t, cmd.Process.Kill())
	require.Error(t, cmd.Wait(), "killed")
	waited = true

	// It goes at once, or in seconds on a loaded machine; only a hang
	// reaches the deadline.
	deadline := time.Now().Add(3 * time.Minute)
	for len(childrenOf(t, 0, "pg_dump", marker)) > 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	assert.Empty(t, childrenOf(t, 0, "pg_dump", marker), "pg_dump died with its parent")
	var left []string
	require.NoError(t, filepath.WalkDir(tmp, func(path string, d fs.DirEntry, err error) error {
		if err != nil || path == tmp {
			return err
		}
		left = append(left, path)
		if data, err := os.ReadFile(path); err == nil {
			assert.NotContains(t, string(data), password, "%s holds the password", path)
		}
		return nil
	}))
	assert.Empty(t, left, "the killed process left nothing in TempDir")
}

// TestKilledDumpChild is TestKilledProcessLeavesNoPassword's child: it
// dumps until it is killed. Run directly, without the parent's
// environment, it does nothing.
func TestKilledDumpChild(t *testing.T) {
	conn := os.Getenv(killChildConn)
	if conn == "" {
		return
	}
	var src pgdump.Conn
	require.NoError(t, json.Unmarshal([]byte(conn), &src))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	w := newGate(ctx)
	go func() {
		<-w.started
		fmt.Println(killChildDumping)
	}()
	err := pgdump.Dump(ctx, pgdump.DumpOptions{Conn: src, Exec: pgdump.ExecOptions{TempDir: os.Getenv(killChildTemp)}}, w)
	t.Fatalf("the dump ended before the kill: %v", err)
}

// startDump runs Dump in a goroutine into a gate, and returns once the
// program has written. The dump is stopped and awaited when the test ends,
// whatever happened.
func startDump(t *testing.T, opts pgdump.DumpOptions) (*gate, chan error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	w := newGate(ctx)
	done := make(chan error, 1)
	finished := make(chan struct{})
	go func() {
		done <- pgdump.Dump(ctx, opts, w)
		close(finished)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-finished:
		case <-time.After(time.Minute):
			t.Error("Dump did not return after its context was cancelled")
		}
	})
	w.cancel = cancel
	select {
	case <-w.started:
	case err := <-done:
		t.Fatalf("Dump ended before writing: %v", err)
	}
	return w, done
}

func TestCancelStopsTheProcessGroup(t *testing.T) {
	t.Parallel()
	src, admin := database(t)
	execSQL(t, admin, fmt.Sprintf(fillTable, 50000))
	src.Password = "unused-but-written" // so that a password file exists
	tmp := t.TempDir()

	w, done := startDump(t, pgdump.DumpOptions{Conn: src, Exec: pgdump.ExecOptions{TempDir: tmp}})
	procs := processes(t, "pg_dump", databaseMarker(src.Database))
	require.Len(t, procs, 1)
	w.cancel()
	err := <-done
	require.ErrorIs(t, err, context.Canceled)
	for pid, pgid := range procs {
		assert.Equal(t, pid, pgid, "pg_dump leads a process group of its own")
		assert.True(t, groupGone(pgid), "no process of the group is left when Dump returns")
	}
	assert.Empty(t, processes(t, "pg_dump", databaseMarker(src.Database)))
	files, _ := filepath.Glob(filepath.Join(tmp, "*"))
	assert.Empty(t, files, "no temporary file is left")
}

// fakeDump writes a pg_dump stand-in that reports version and otherwise
// runs script.
func fakeDump(t *testing.T, version, script string) string {
	t.Helper()
	dir := t.TempDir()
	body := "#!/bin/sh\nif [ \"$1\" = --version ]; then echo 'pg_dump (PostgreSQL) " + version + "'; exit 0; fi\n" + script + "\n"
	source := filepath.Join(dir, "script")
	require.NoError(t, os.WriteFile(source, []byte(body), 0o644))
	// The executable is written by another process: a program this process
	// starts meanwhile (parallel tests) would inherit a descriptor open for
	// writing on it until its exec, and running it would fail with "text
	// file busy".
	path := filepath.Join(dir, "pg_dump")
	out, err := exec.Command("install", "-m", "0755", source, path).CombinedOutput()
	require.NoError(t, err, "%s", out)
	return path
}

func TestStubbornProgramIsKilledAfterWaitDelay(t *testing.T) {
	t.Parallel()
	// Ignores SIGTERM, and so does its child, which it shares its group with.
	bin := fakeDump(t, "15.4", "trap '' TERM\necho started\nsleep 300 &\nwait")
	marker := fmt.Sprintf("stubborn-%d", time.Now().UnixNano())
	start := time.Now()
	w, done := startDump(t, pgdump.DumpOptions{Conn: pgdump.Conn{ApplicationName: marker},
		Exec: pgdump.ExecOptions{Bin: bin, WaitDelay: 200 * time.Millisecond}})
	procs := processes(t, "pg_dump", marker)
	require.Len(t, procs, 1)
	w.cancel()
	require.ErrorIs(t, <-done, context.Canceled)
	// 200 ms and a process start or two, seconds on a loaded machine:
	// far from the 300 s the program would take if nothing killed it.
	assert.Less(t, time.Since(start), time.Minute)
	for _, pgid := range procs {
		assert.True(t, groupGone(pgid), "SIGKILL reached the whole group, the ignoring child included")
	}
}

func TestWriterFailureStopsTheDump(t *testing.T) {
	t.Parallel()
	src, admin := database(t)
	execSQL(t, admin, fmt.Sprintf(fillTable, 50000))
	src.ApplicationName = fmt.Sprintf("failing-%d", time.Now().UnixNano())
	boom := errors.New("disk full")
	err := pgdump.Dump(context.Background(), pgdump.DumpOptions{Conn: src}, failingWriter{boom})
	require.ErrorIs(t, err, boom)
	assert.Empty(t, processes(t, "pg_dump", src.ApplicationName))
}

type failingWriter struct{ err error }

func (w failingWriter) Write([]byte) (int, error) { return 0, w.err }

func TestFind(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	old := fakeDump(t, "9.6.24", "exit 1")
	_, err := pgdump.Find(ctx, "pg_dump", old, pgdump.Version{Major: 15, Minor: 4})
	var verErr *pgdump.VersionError
	require.ErrorAs(t, err, &verErr)
	assert.Equal(t, pgdump.Version{Major: 9, Minor: 6, Patch: 24}, verErr.Program.Version)
	assert.Contains(t, err.Error(), "postgresql-client-15", "the message says what to install")

	p, err := pgdump.Find(ctx, "pg_dump", filepath.Dir(old), pgdump.Version{Major: 9, Minor: 6, Patch: 1})
	require.NoError(t, err, "a directory works as Bin")
	assert.Equal(t, old, p.Path)

	_, err = pgdump.Find(ctx, "pg_dump", filepath.Join(t.TempDir(), "nothing"), pgdump.Version{})
	assert.Error(t, err)

	p, err = pgdump.Find(ctx, "pg_restore", "", pgdump.Version{})
	require.NoError(t, err, "the machine's own pg_restore")
	assert.Equal(t, "pg_restore", p.Name)
	assert.False(t, p.Version.IsZero())
}

func TestSnapshotWithSerializableDeferrableIsRefused(t *testing.T) {
	t.Parallel()
	err := pgdump.Dump(context.Background(), pgdump.DumpOptions{Snapshot: "00000003-00000002-1", SerializableDeferrable: true}, &bytes.Buffer{})
	assert.ErrorIs(t, err, pgdump.ErrSnapshotSerializable)
}

func TestParseDSN(t *testing.T) {
	t.Parallel()
	c, err := pgdump.ParseDSN("postgres://u:s%3Acret@db.example:6543/my%20db?sslmode=require&application_name=app")
	require.NoError(t, err)
	assert.Equal(t, pgdump.Conn{Host: "db.example", Port: 6543, Database: "my db", User: "u", Password: "s:cret",
		SSLMode: "require", ApplicationName: "app"}, c)

	_, err = pgdump.ParseDSN(`host=/tmp port=5433 dbname='it''s' user=bob password='a b\'c' sslmode=disable`)
	require.Error(t, err, "'' is not an escape in libpq")
	c, err = pgdump.ParseDSN(`host=/tmp port=5433 dbname='it\'s' user=bob password='a b\'c' sslmode=disable`)
	require.NoError(t, err)
	assert.Equal(t, pgdump.Conn{Host: "/tmp", Port: 5433, Database: "it's", User: "bob", Password: "a b'c", SSLMode: "disable"}, c)

	c, err = pgdump.ParseDSN("postgres://u@h/db?sslmode=verify-full&sslcrldir=/crl&sslsni=0&ssl_min_protocol_version=TLSv1.3" +
		"&gssencmode=disable&channel_binding=require&krbsrvname=pg&requirepeer=postgres&target_session_attrs=read-write" +
		"&options=-c%20search_path%3Dapp&connect_timeout=7")
	require.NoError(t, err)
	assert.Equal(t, pgdump.Conn{Host: "h", Port: 5432, Database: "db", User: "u", SSLMode: "verify-full", SSLCRLDir: "/crl",
		SSLSNI: "0", SSLMinProtocolVersion: "TLSv1.3", GSSEncMode: "disable", ChannelBinding: "require",
		KerberosServiceName: "pg", RequirePeer: "postgres", TargetSessionAttrs: "read-write",
		Options: "-c search_path=app", ConnectTimeout: "7"}, c, "every setting libpq reads from the environment is kept")

	_, err = pgdump.ParseDSN("postgres://u:topsecret@[::1/db")
	require.ErrorIs(t, err, pgdump.ErrInvalidDSN)
	assert.NotContains(t, err.Error(), "topsecret")
}
