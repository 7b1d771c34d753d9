package siphon_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/siphondb/siphon"
	"github.com/siphondb/siphon/canonical"
	"github.com/siphondb/siphon/pgdump"
	"github.com/siphondb/siphon/siphontest"
)

// tlsServer starts a private server that accepts SSL, or skips the test
// when siphontest cannot make one.
func tlsServer(t *testing.T) *siphontest.Server {
	t.Helper()
	srv := siphontest.Start(t, siphontest.WithPrivateServer(), siphontest.WithTLS())
	var ssl string
	require.NoError(t, pgxQueryRow(srv.DSN(), "SHOW ssl", &ssl))
	if ssl != "on" {
		t.Skipf("the %s server does not accept SSL", srv.Source())
	}
	return srv
}

// tlsRoleDSN creates a role with a password (authenticated by
// scram-sha-256, not trusted like the superuser) that owns the databases
// of dsns, and returns each DSN as that role with the settings in params.
func tlsRoleDSN(t *testing.T, srv *siphontest.Server, params url.Values, dsns ...string) []string {
	t.Helper()
	role := fmt.Sprintf("tls_role_%d_%d", os.Getpid(), roleSeq.Add(1))
	password := "Tls-pw-" + role
	admin := connectOrFail(t, srv.DSN())
	execSQL(t, admin, fmt.Sprintf("CREATE ROLE %s LOGIN REPLICATION PASSWORD '%s'", role, password))
	out := make([]string, len(dsns))
	for i, dsn := range dsns {
		u, err := url.Parse(dsn)
		require.NoError(t, err)
		execSQL(t, admin, "ALTER DATABASE "+pgx.Identifier{strings.TrimPrefix(u.Path, "/")}.Sanitize()+" OWNER TO "+role)
		u.User = url.UserPassword(role, password)
		q := u.Query()
		for k, v := range params {
			q[k] = v
		}
		// libpq reads a URL's query as RFC 3986 does: "+" is a plus sign.
		u.RawQuery = strings.ReplaceAll(q.Encode(), "+", "%20")
		out[i] = u.String()
	}
	return out
}

// markedSession is a server session of the test, as pg_stat_activity and
// pg_stat_ssl show it.
type markedSession struct {
	BackendType, Query string
	SSL                bool
}

func (s markedSession) String() string {
	return fmt.Sprintf("%s ssl=%v (%.60s)", s.BackendType, s.SSL, s.Query)
}

// markedSessions lists the sessions whose application name is marker.
func markedSessions(t *testing.T, admin *pgx.Conn, marker string) []markedSession {
	t.Helper()
	rows, err := admin.Query(context.Background(), `SELECT a.backend_type, coalesce(a.query, ''), coalesce(s.ssl, false)
		FROM pg_stat_activity a LEFT JOIN pg_stat_ssl s USING (pid) WHERE a.application_name = $1`, marker)
	require.NoError(t, err)
	sessions, err := pgx.CollectRows(rows, pgx.RowToStructByPos[markedSession])
	require.NoError(t, err)
	return sessions
}

// awaitSession waits until a session of marker matches and returns every
// session of marker at that moment.
func awaitSession(t *testing.T, admin *pgx.Conn, marker string, match func(markedSession) bool) []markedSession {
	t.Helper()
	deadline := time.Now().Add(waitDeadline)
	for {
		sessions := markedSessions(t, admin, marker)
		for _, s := range sessions {
			if match(s) {
				return sessions
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no matching session of %s within %v; sessions: %v", marker, waitDeadline, sessions)
		}
		time.Sleep(time.Millisecond) // polling pg_stat_activity: there is nothing to wait on
	}
}

// assertSSL checks that there are sessions and that each uses SSL or not.
func assertSSL(t *testing.T, sessions []markedSession, ssl bool, what string) {
	t.Helper()
	if assert.NotEmpty(t, sessions, what) {
		for _, s := range sessions {
			assert.Equal(t, ssl, s.SSL, "%s: %v", what, s)
		}
	}
}

// TestDSNSettingsReachEverySession connects with sslmode require,
// verify-full (against the server's certificate) and disable, as a role
// with a password, and checks from the server's side, while each runs,
// that the pool's sessions, the replication session of StreamChanges,
// pg_dump (Backup), pg_restore (Restore) and the sessions of TakeSnapshot
// and CopyTables all use SSL or not as the DSN says, and carry its
// application_name. pg_dump also gets sslmode and sslrootcert in its
// environment, and the password in neither its argv nor its environment.
func TestDSNSettingsReachEverySession(t *testing.T) {
	t.Parallel()
	srv := tlsServer(t)
	for _, mode := range []struct {
		name   string
		params url.Values
		ssl    bool
	}{
		{"require", url.Values{"sslmode": {"require"}}, true},
		{"verify-full", url.Values{"sslmode": {"verify-full"}, "sslrootcert": {srv.CertFile()}}, true},
		{"disable", url.Values{"sslmode": {"disable"}}, false},
	} {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			marker := fmt.Sprintf("tls_%s_%d", strings.ReplaceAll(mode.name, "-", "_"), time.Now().UnixNano())
			mode.params.Set("application_name", marker)
			srcDSN, tgtDSN := srv.NewDatabase(t), srv.NewDatabase(t)
			src := connectOrFail(t, srcDSN)
			execSQL(t, src, `CREATE TABLE t (id int PRIMARY KEY, body text)`,
				`INSERT INTO t SELECT g, md5(g::text) || md5((-g)::text) FROM generate_series(1, 50000) g`)
			dsns := tlsRoleDSN(t, srv, mode.params, srcDSN, tgtDSN)
			execSQL(t, src, "ALTER TABLE t OWNER TO "+dsnUser(t, dsns[0]))
			admin := connectOrFail(t, srv.DSN())

			c, slot := backupConn(t, dsns[0], siphon.WithTables("t"))
			assertSSL(t, markedSessions(t, admin, marker), mode.ssl, "pool sessions")

			t.Run("StreamChanges", func(t *testing.T) {
				from, err := c.CurrentPosition(ctx)
				require.NoError(t, err)
				execSQL(t, src, "INSERT INTO t VALUES (0, 'streamed')")
				var during []markedSession
				runCtx, stop := context.WithCancel(ctx)
				defer stop()
				_, err = c.StreamChanges(runCtx, from, func(ch canonical.Change) error {
					if ch.Op == canonical.OpInsert {
						during = markedSessions(t, admin, marker)
						stop()
					}
					return nil
				})
				require.NoError(t, err)
				var walsenders []markedSession
				for _, s := range during {
					if s.BackendType == "walsender" {
						walsenders = append(walsenders, s)
					}
				}
				assertSSL(t, walsenders, mode.ssl, "the replication session")
			})

			var dump bytes.Buffer
			t.Run("Backup", func(t *testing.T) {
				skipUnlessDumpClients(t)
				w := &blockAfterHeader{ctx: ctx, blocked: make(chan struct{}), release: make(chan struct{})}
				done := make(chan error, 1)
				go func() { done <- c.Backup(ctx, siphon.BackupOptions{}, &teeWriter{w, &dump}) }()
				defer func() {
					close(w.release)
					require.NoError(t, <-done)
				}()
				sessions := awaitSession(t, admin, marker, func(s markedSession) bool {
					return strings.HasPrefix(s.Query, "COPY public.t ") && strings.Contains(s.Query, "TO stdout")
				})
				assertSSL(t, sessions, mode.ssl, "pg_dump's session, and the snapshot's")
				assertDumpEnviron(t, marker, dsns[0], mode.params)
			})

			t.Run("Restore", func(t *testing.T) {
				skipUnlessDumpClients(t)
				// The target holds t, locked: pg_restore --clean waits to drop
				// its constraint, then it.
				tgt := connectOrFail(t, tgtDSN)
				execSQL(t, tgt, "CREATE TABLE t (id int)", "ALTER TABLE t OWNER TO "+dsnUser(t, dsns[1]),
					"BEGIN", "LOCK TABLE t IN ACCESS SHARE MODE")
				target, _ := backupConn(t, dsns[1])
				done := make(chan error, 1)
				go func() {
					done <- target.Restore(ctx, siphon.RestoreOptions{Clean: true}, bytes.NewReader(dump.Bytes()))
				}()
				sessions := awaitSession(t, admin, marker, func(s markedSession) bool {
					return strings.Contains(s.Query, " IF EXISTS ") && strings.Contains(s.Query, " public.t")
				})
				execSQL(t, tgt, "COMMIT")
				require.NoError(t, <-done)
				assertSSL(t, sessions, mode.ssl, "pg_restore's session")
				assert.Equal(t, digest(t, src, "t"), digest(t, tgt, "t"), "restored")
				require.NoError(t, target.Close())
			})

			t.Run("CopyTables", func(t *testing.T) {
				schema, err := c.InspectSchema(ctx)
				require.NoError(t, err)
				snap, err := c.TakeSnapshot(ctx)
				require.NoError(t, err)
				defer snap.Close(ctx)
				var during []markedSession
				rows := 0
				require.NoError(t, snap.CopyTables(ctx, schema, siphon.CopyOptions{}, func(*canonical.Table, canonical.Row) error {
					if rows++; rows == 1 {
						during = markedSessions(t, admin, marker)
					}
					return nil
				}))
				assert.Equal(t, 50001, rows)
				var copying, walsenders int
				for _, s := range during {
					copying += btoi(strings.HasPrefix(s.Query, "COPY "))
					walsenders += btoi(s.BackendType == "walsender")
				}
				assert.Positive(t, copying, "a copying session: %v", during)
				assert.Positive(t, walsenders, "the snapshot's replication session: %v", during)
				assertSSL(t, during, mode.ssl, "the snapshot's and the copy's sessions")
			})

			require.NoError(t, c.Close())
			assertNoLeaks(t, srcDSN, slot)
			waitFor(t, "no session of the test's role left", func() bool { return len(markedSessions(t, admin, marker)) == 0 })
		})
	}
}

// TestDSNOptionsReachPgRestore gives the target's DSN options that make
// every transaction read-only: pg_restore must run with them too, and fail
// to create anything, as psql would.
func TestDSNOptionsReachPgRestore(t *testing.T) {
	t.Parallel()
	skipUnlessDumpClients(t)
	srv := tlsServer(t)
	ctx := context.Background()
	srcDSN, tgtDSN := srv.NewDatabase(t), srv.NewDatabase(t)
	execSQL(t, connectOrFail(t, srcDSN), `CREATE TABLE t (id int PRIMARY KEY)`, `INSERT INTO t VALUES (1)`)
	c, _ := backupConn(t, srcDSN)
	dump := backup(t, c, siphon.BackupOptions{})
	require.NoError(t, c.Close())

	dsns := tlsRoleDSN(t, srv, url.Values{"sslmode": {"require"}, "options": {"-c default_transaction_read_only=on"}}, tgtDSN)
	target, _ := backupConn(t, dsns[0])
	err := target.Restore(ctx, siphon.RestoreOptions{NoOwner: true}, bytes.NewReader(dump))
	var exit *pgdump.ExitError
	require.True(t, errors.As(err, &exit), "pg_restore itself fails: %v", err)
	assert.Contains(t, exit.Stderr, "read-only transaction")
	var tables int
	require.NoError(t, pgxQueryRow(tgtDSN, "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'", &tables))
	assert.Zero(t, tables, "nothing restored")
}

// assertDumpEnviron checks the running pg_dump's argv and environment:
// the DSN's SSL settings are there, its password nowhere.
func assertDumpEnviron(t *testing.T, marker, dsn string, params url.Values) {
	t.Helper()
	pids := childProcesses("pg_dump", marker)
	require.Len(t, pids, 1)
	u, err := url.Parse(dsn)
	require.NoError(t, err)
	password, _ := u.User.Password()
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pids[0]))
	require.NoError(t, err)
	environ, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pids[0]))
	require.NoError(t, err)
	assert.NotContains(t, string(cmdline), password)
	assert.NotContains(t, string(environ), password)
	env := strings.Split(string(environ), "\x00")
	assert.Contains(t, env, "PGSSLMODE="+params.Get("sslmode"))
	if root := params.Get("sslrootcert"); root != "" {
		assert.Contains(t, env, "PGSSLROOTCERT="+root)
	}
}

func dsnUser(t *testing.T, dsn string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	require.NoError(t, err)
	return u.User.Username()
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// pgxQueryRow scans a one-row query's result, in a session of its own.
func pgxQueryRow(dsn, query string, dest ...any) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	return conn.QueryRow(ctx, query).Scan(dest...)
}
