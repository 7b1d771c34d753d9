package siphontest_test

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/siphondb/siphon/siphontest"
)

func TestNewDatabaseIsFreshAndLogical(t *testing.T) {
	t.Parallel()
	srv := siphontest.Start(t)
	ctx := context.Background()

	dsnA, dsnB := srv.NewDatabase(t), srv.NewDatabase(t)
	require.NotEqual(t, dsnA, dsnB)

	conn, err := pgx.Connect(ctx, dsnA)
	require.NoError(t, err)
	defer conn.Close(ctx)
	settings := map[string]string{}
	for _, name := range []string{"wal_level", "max_replication_slots", "max_wal_senders", "server_encoding"} {
		var v string
		require.NoError(t, conn.QueryRow(ctx, "SELECT current_setting($1)", name).Scan(&v))
		settings[name] = v
	}
	assert.Equal(t, "logical", settings["wal_level"])
	assert.GreaterOrEqual(t, atoi(t, settings["max_replication_slots"]), 20)
	assert.GreaterOrEqual(t, atoi(t, settings["max_wal_senders"]), 20)
	assert.Equal(t, "UTF8", settings["server_encoding"])

	var tables int
	require.NoError(t, conn.QueryRow(ctx,
		"SELECT count(*) FROM pg_tables WHERE schemaname NOT IN ('pg_catalog','information_schema')").Scan(&tables))
	assert.Zero(t, tables, "a new database holds no user tables")
}

func TestDatabaseDroppedWithItsSlotsAndSessions(t *testing.T) {
	t.Parallel()
	srv := siphontest.Start(t)
	ctx := context.Background()

	var dbName string
	t.Run("inner", func(t *testing.T) {
		dsn := srv.NewDatabase(t)
		conn, err := pgx.Connect(ctx, dsn)
		require.NoError(t, err)
		// Left open on purpose, with a slot: cleanup must still drop the database.
		require.NoError(t, conn.QueryRow(ctx, "SELECT current_database()").Scan(&dbName))
		_, err = conn.Exec(ctx, "SELECT pg_create_logical_replication_slot('siphontest_leftover_'||pg_backend_pid(), 'pgoutput')")
		require.NoError(t, err)
		// An origin as siphon's apply names one for this database, holding
		// one of the server's origin states: cleanup must drop it.
		_, err = conn.Exec(ctx, `SELECT pg_replication_origin_create(o), pg_replication_origin_advance(o, '0/10')
			FROM (SELECT format('siphon_%s_1_leftover', oid) FROM pg_database WHERE datname = current_database()) AS n(o)`)
		require.NoError(t, err)
	})

	admin, err := pgx.Connect(ctx, srv.DSN())
	require.NoError(t, err)
	defer admin.Close(ctx)
	var dbs, slots int
	require.NoError(t, admin.QueryRow(ctx, "SELECT count(*) FROM pg_database WHERE datname = $1", dbName).Scan(&dbs))
	require.NoError(t, admin.QueryRow(ctx, "SELECT count(*) FROM pg_replication_slots WHERE database = $1", dbName).Scan(&slots))
	assert.Zero(t, dbs, "database dropped at cleanup")
	assert.Zero(t, slots, "its slots dropped at cleanup")
	var origins []string
	rows, err := admin.Query(ctx, "SELECT roname FROM pg_replication_origin WHERE roname LIKE '%leftover'")
	require.NoError(t, err)
	origins, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	assert.Empty(t, origins, "siphon's origins for it dropped at cleanup")
}

// TestServerKeepsManyReplicationOrigins holds more replication origin
// states at once than PostgreSQL 18's default max_active_replication_origins
// (10) allows: a test binary applies into many databases, each with an
// origin of its own.
func TestServerKeepsManyReplicationOrigins(t *testing.T) {
	t.Parallel()
	srv := siphontest.Start(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, srv.NewDatabase(t))
	require.NoError(t, err)
	defer conn.Close(ctx)
	var prefix string
	require.NoError(t, conn.QueryRow(ctx, "SELECT format('siphontest_many_%s_', pg_backend_pid())").Scan(&prefix))
	defer func() {
		_, err := conn.Exec(ctx, "SELECT pg_replication_origin_drop(roname) FROM pg_replication_origin WHERE starts_with(roname, $1)", prefix)
		assert.NoError(t, err)
	}()
	_, err = conn.Exec(ctx, `SELECT pg_replication_origin_create(o), pg_replication_origin_advance(o, '0/10')
		FROM (SELECT $1 || i FROM generate_series(1, 20) AS i) AS n(o)`, prefix)
	require.NoError(t, err, "20 origins with progress, as 20 test databases applied into keep")
}

// TestLaunchedServerGoneWhenProcessKilled kills a process that launched a
// server with SIGKILL and checks that the reaper stops the server and removes
// its directory.
func TestLaunchedServerGoneWhenProcessKilled(t *testing.T) {
	if os.Getenv("SIPHONTEST_CHILD") == "1" {
		srv, err := siphontest.Launch(context.Background())
		if err != nil {
			os.Exit(3)
		}
		conn, err := pgx.Connect(context.Background(), srv.DSN())
		if err != nil {
			os.Exit(4)
		}
		var pid int
		var dir string
		conn.QueryRow(context.Background(), "SELECT pg_backend_pid(), current_setting('data_directory')").Scan(&pid, &dir)
		os.Stdout.WriteString(dir + "\n")
		select {} // wait to be killed
	}
	if os.Getenv(siphontest.EnvDSN) != "" {
		t.Skip("the reaper only watches servers siphontest starts itself")
	}
	t.Parallel()
	siphontest.Start(t) // skips or fails like every other test when no server can be had

	cmd := exec.Command(os.Args[0], "-test.run=^TestLaunchedServerGoneWhenProcessKilled$")
	cmd.Env = append(os.Environ(), "SIPHONTEST_CHILD=1")
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	line, err := bufio.NewReader(out).ReadString('\n')
	require.NoError(t, err, "child did not report its server")
	dataDir := strings.TrimSpace(line)
	require.DirExists(t, dataDir)

	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	_ = cmd.Wait()

	assert.Eventually(t, func() bool {
		_, err := os.Stat(dataDir)
		return os.IsNotExist(err)
	}, 3*time.Minute, 50*time.Millisecond, "server directory removed after the launching process died")
	assert.False(t, postgresRunningIn(dataDir), "no postgres process left for %s", dataDir)
}

func TestLaunchAndClose(t *testing.T) {
	if os.Getenv(siphontest.EnvDSN) != "" {
		t.Skip("Launch connects to the SIPHON_TEST_DSN server instead of starting one")
	}
	t.Parallel()
	siphontest.Start(t)
	// Launching runs initdb and starts a server: seconds when quiet, most of
	// a minute on a loaded machine. Only a hang reaches this bound.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	started := time.Now()
	srv, err := siphontest.Launch(ctx)
	require.NoError(t, err)
	t.Logf("launch to ready: %v (%s)", time.Since(started), srv.Source())
	conn, err := pgx.Connect(ctx, srv.DSN())
	require.NoError(t, err)
	var dir string
	require.NoError(t, conn.QueryRow(ctx, "SELECT current_setting('data_directory')").Scan(&dir))
	conn.Close(ctx)

	require.NoError(t, srv.Close())
	require.NoError(t, srv.Close(), "Close twice is fine")
	assert.NoDirExists(t, dir)
	assert.False(t, postgresRunningIn(dir))
}

// TestRestartKeepsDataAndDSN restarts a launched server twice: what was
// committed survives, the DSN works again, sessions from before are
// broken, and Close still leaves no process and no directory.
func TestRestartKeepsDataAndDSN(t *testing.T) {
	if os.Getenv(siphontest.EnvDSN) != "" {
		t.Skip("Restart needs a server siphontest starts itself")
	}
	t.Parallel()
	siphontest.Start(t)
	// Launching runs initdb and starts a server: seconds when quiet, most of
	// a minute on a loaded machine. Only a hang reaches this bound.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	srv, err := siphontest.Launch(ctx)
	require.NoError(t, err)
	defer srv.Close()
	conn, err := pgx.Connect(ctx, srv.DSN())
	require.NoError(t, err)
	defer conn.Close(ctx)
	var dir string
	require.NoError(t, conn.QueryRow(ctx, "SELECT current_setting('data_directory')").Scan(&dir))
	_, err = conn.Exec(ctx, "CREATE TABLE kept (n int); INSERT INTO kept VALUES (1)")
	require.NoError(t, err)

	for round := 1; round <= 2; round++ {
		var startedBefore time.Time
		require.NoError(t, conn.QueryRow(ctx, "SELECT pg_postmaster_start_time()").Scan(&startedBefore))
		began := time.Now()
		require.NoError(t, srv.Restart(ctx))
		t.Logf("restart %d: %v", round, time.Since(began).Round(time.Millisecond))
		assert.Error(t, conn.Ping(ctx), "a session from before the restart is broken")
		conn.Close(ctx)

		conn, err = pgx.Connect(ctx, srv.DSN())
		require.NoError(t, err, "the DSN works after the restart")
		var startedAfter time.Time
		var rows int
		require.NoError(t, conn.QueryRow(ctx, "SELECT pg_postmaster_start_time(), (SELECT count(*) FROM kept)").Scan(&startedAfter, &rows))
		assert.True(t, startedAfter.After(startedBefore), "a new postmaster")
		assert.Equal(t, round, rows, "committed rows survive the restart")
		_, err = conn.Exec(ctx, "INSERT INTO kept VALUES ($1)", round+1)
		require.NoError(t, err)
	}
	conn.Close(ctx)

	require.NoError(t, srv.Close())
	assert.NoDirExists(t, dir)
	assert.False(t, postgresRunningIn(dir), "no postgres process left for %s", dir)
	assert.Error(t, srv.Restart(ctx), "a closed server cannot be restarted")
}

func TestRestartRefusesServersNotItsOwn(t *testing.T) {
	t.Parallel()
	shared := siphontest.Start(t)
	err := shared.Restart(context.Background())
	require.Error(t, err)
	assert.Contains(t, err.Error(), "WithPrivateServer", "the error says what to do")

	attached, err := siphontest.Attach(context.Background(), shared.DSN())
	require.NoError(t, err)
	defer attached.Close()
	err = attached.Restart(context.Background())
	require.Error(t, err)
	assert.Contains(t, err.Error(), `"attached"`)
	var one int
	require.NoError(t, pgxQuery(shared.DSN(), "SELECT 1", &one), "the server still runs")
}

// TestTLSServerAcceptsBothAndIsVerifiable checks that a WithTLS server
// lets the client choose SSL or not, that its certificate verifies for
// 127.0.0.1, and that its key is private to the server's user.
func TestTLSServerAcceptsBothAndIsVerifiable(t *testing.T) {
	if os.Getenv(siphontest.EnvDSN) != "" {
		t.Skip("WithTLS applies to servers siphontest starts itself")
	}
	t.Parallel()
	srv := siphontest.Start(t, siphontest.WithPrivateServer(), siphontest.WithTLS())
	if srv.Source() != "local" {
		t.Skipf("WithTLS applies to local servers, not %s", srv.Source())
	}
	require.FileExists(t, srv.CertFile())
	for sslmode, want := range map[string]bool{
		"disable": false,
		"require": true,
		"verify-full&sslrootcert=" + srv.CertFile(): true,
	} {
		dsn := strings.Replace(srv.DSN(), "sslmode=disable", "sslmode="+sslmode, 1)
		var ssl bool
		require.NoError(t, pgxQuery(dsn, "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()", &ssl), sslmode)
		assert.Equal(t, want, ssl, "sslmode=%s", sslmode)
	}

	var keyFile string
	require.NoError(t, pgxQuery(srv.DSN(), "SELECT current_setting('ssl_key_file')", &keyFile))
	fi, err := os.Stat(keyFile)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm(), "key readable by its owner only")
	serverDir, err := os.Stat(filepath.Dir(keyFile))
	require.NoError(t, err)
	assert.Equal(t, serverDir.Sys().(*syscall.Stat_t).Uid, fi.Sys().(*syscall.Stat_t).Uid, "key owned by the server's user")
}

// pgxQuery scans a one-value query's result, in a session of its own.
func pgxQuery(dsn, query string, v any) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	return conn.QueryRow(ctx, query).Scan(v)
}

func BenchmarkNewDatabase(b *testing.B) {
	srv := siphontest.Start(b)
	for b.Loop() {
		srv.NewDatabase(b)
	}
}

// postgresRunningIn reports whether a process has dataDir on its command line.
func postgresRunningIn(dataDir string) bool {
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		cmdline, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err == nil && strings.Contains(string(cmdline), dataDir) {
			return true
		}
	}
	return false
}

func atoi(t *testing.T, s string) int {
	t.Helper()
	var n int
	for _, r := range s {
		require.True(t, r >= '0' && r <= '9', "not a number: %q", s)
		n = n*10 + int(r-'0')
	}
	return n
}
