package siphontest

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// EnvDSN names the environment variable that points the tests at an existing
// server instead of starting one.
const EnvDSN = "SIPHON_TEST_DSN"

// EnvServerBin names the environment variable that names a directory of
// PostgreSQL server binaries (initdb and postgres) for siphontest to run,
// instead of those it finds on PATH or under /usr/lib/postgresql/*/bin: the
// default of [WithServerBin].
const EnvServerBin = "SIPHON_TEST_SERVER_BIN"

// ErrNoServer is returned by [Launch] when no way to get a server is
// available: no SIPHON_TEST_DSN, no local server binaries, no Docker engine.
var ErrNoServer = errors.New("siphontest: no PostgreSQL server available: set " + EnvDSN +
	" to a server with wal_level=logical, install the PostgreSQL server binaries" +
	" (apt-get install postgresql), or run a Docker engine")

// Server is a running PostgreSQL server for tests.
type Server struct {
	dsn    string // a superuser DSN to the maintenance database
	source string
	stop   func() error
	// restart is set for a server siphontest runs itself.
	restart  func(context.Context) error
	shared   bool   // the test binary's shared server (Start without WithPrivateServer)
	certFile string // the server's certificate, with WithTLS

	closeOnce sync.Once
	closeErr  error
}

// DSN returns a connection string for the server's maintenance database
// ("postgres"), as a superuser. Tests should use [Server.NewDatabase].
func (s *Server) DSN() string { return s.dsn }

// Source says where the server came from: "env" (SIPHON_TEST_DSN), "local",
// "docker" or "attached" ([Attach]).
func (s *Server) Source() string { return s.source }

// Close stops a server that [Launch] started and removes its files. It is
// safe to call more than once; a server given by SIPHON_TEST_DSN is left
// running.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		if s.stop != nil {
			s.closeErr = s.stop()
		}
	})
	return s.closeErr
}

// Restart stops the server with a fast shutdown, as pg_ctl restart -m fast
// does (sessions are ended, what was committed is kept and walsenders send
// it before they exit), then starts it again with the same data, settings
// and port, and returns once it accepts connections. DSNs stay valid;
// sessions opened before the restart are broken and must reconnect. Close
// still stops the restarted server and removes its files.
//
// Restart is for a server of the calling test alone, from
// [WithPrivateServer] or [Launch]: the shared server of [Start] serves
// every test of the binary, running in parallel, so Restart refuses it, as
// it refuses a server siphontest did not start itself (SIPHON_TEST_DSN,
// Docker, [Attach]).
func (s *Server) Restart(ctx context.Context) error {
	switch {
	case s.shared:
		return errors.New("siphontest: restart: the shared server serves every test of the binary: start a server of your own with WithPrivateServer")
	case s.restart == nil:
		return fmt.Errorf("siphontest: restart: the server comes from %q: siphontest restarts only the servers it starts from local binaries", s.source)
	}
	return s.restart(ctx)
}

// CertFile returns the path of the server's self-signed certificate when it
// runs with [WithTLS], and "" otherwise. Give it as sslrootcert, with
// sslmode verify-ca or verify-full, to have clients check the server.
func (s *Server) CertFile() string { return s.certFile }

var shared struct {
	once   sync.Once
	server *Server
	err    error
}

// Start returns the test binary's shared server, starting it on first use.
// With [WithPrivateServer] it starts a server for this test alone, stopped
// when the test ends. When no server can be had, Start skips the test, or
// fails it when the CI environment variable is set.
func Start(tb testing.TB, opts ...Option) *Server {
	tb.Helper()
	cfg := newConfig(opts)
	if cfg.private {
		ctx, cancel := context.WithTimeout(context.Background(), cfg.startTimeout)
		defer cancel()
		srv, err := Launch(ctx, opts...)
		if err != nil {
			failOrSkip(tb, err)
		}
		tb.Cleanup(func() {
			if err := srv.Close(); err != nil {
				tb.Errorf("siphontest: stop private server: %v", err)
			}
		})
		return srv
	}
	shared.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), cfg.startTimeout)
		defer cancel()
		shared.server, shared.err = Launch(ctx, opts...)
		if shared.err == nil {
			shared.server.shared = true
		}
	})
	if shared.err != nil {
		failOrSkip(tb, shared.err)
	}
	return shared.server
}

func failOrSkip(tb testing.TB, err error) {
	tb.Helper()
	if errors.Is(err, ErrNoServer) && os.Getenv("CI") == "" {
		tb.Skip(err.Error())
	}
	tb.Fatal(err)
}

// Launch starts a server (or connects to the one SIPHON_TEST_DSN names) and
// waits until it accepts connections. The caller must Close it. It returns an
// error wrapping [ErrNoServer] when there is no way to get one.
func Launch(ctx context.Context, opts ...Option) (*Server, error) {
	cfg := newConfig(opts)
	if dsn := os.Getenv(EnvDSN); dsn != "" {
		srv, err := Attach(ctx, dsn)
		if err != nil {
			return nil, fmt.Errorf("siphontest: server from %s: %w", EnvDSN, err)
		}
		srv.source = "env"
		return srv, nil
	}
	bin, err := findServerBinaries(cfg.serverBin)
	if err == nil {
		return launchLocal(ctx, bin, cfg)
	}
	if cfg.serverBin != "" { // binaries asked for by name: never others instead
		return nil, err
	}
	srv, dockerErr := launchDocker(ctx, cfg)
	if dockerErr == nil {
		return srv, nil
	}
	return nil, fmt.Errorf("%w (local binaries: %v; docker: %v)", ErrNoServer, err, dockerErr)
}

// Attach returns a Server for an existing PostgreSQL that dsn reaches, once
// it answers and runs with wal_level=logical. Close leaves that server
// running. [Server.CreateDatabase] needs a role allowed to create databases.
func Attach(ctx context.Context, dsn string) (*Server, error) {
	if err := waitReady(ctx, dsn, "logical", nil); err != nil {
		return nil, err
	}
	return &Server{dsn: dsn, source: "attached"}, nil
}

// waitReady connects until the server answers with the wal_level wanted
// ("logical", unless a test asked for another with WithSetting), the
// context ends, or exited reports that the server process is gone.
func waitReady(ctx context.Context, dsn, walLevel string, exited func() error) error {
	var last error
	for {
		conn, err := pgx.Connect(ctx, dsn)
		if err == nil {
			var level string
			err = conn.QueryRow(ctx, "SHOW wal_level").Scan(&level)
			conn.Close(context.Background())
			if err == nil && level != walLevel {
				return fmt.Errorf("wal_level is %q: logical replication needs wal_level=logical", level)
			}
			if err == nil {
				return nil
			}
		}
		last = err
		if exited != nil {
			if err := exited(); err != nil {
				return err
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("server not ready: %w (last error: %v)", ctx.Err(), last)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

var databaseSeq atomic.Int64

// NewDatabase creates a fresh, empty database and returns a DSN for it. The
// database is dropped when the test ends, after its sessions are terminated
// and its replication slots dropped; the replication origins siphon kept for
// it go too.
func (s *Server) NewDatabase(tb testing.TB) string {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dsn, drop, err := s.CreateDatabase(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := drop(ctx); err != nil {
			tb.Errorf("siphontest: %v", err)
		}
	})
	return dsn
}

// CreateDatabase creates a fresh, empty database and returns its DSN and a
// function that drops it (terminating its sessions and dropping its
// replication slots first, and siphon's replication origins for it
// after). It is [Server.NewDatabase] for code outside tests.
func (s *Server) CreateDatabase(ctx context.Context) (dsn string, drop func(context.Context) error, err error) {
	name := fmt.Sprintf("siphontest_%d_%d_%d", os.Getpid(), time.Now().UnixNano()%1_000_000, databaseSeq.Add(1))
	conn, err := pgx.Connect(ctx, s.dsn)
	if err != nil {
		return "", nil, fmt.Errorf("siphontest: create database: %w", err)
	}
	defer conn.Close(context.Background())
	num, err := versionNum(ctx, conn)
	if err != nil {
		return "", nil, err
	}
	create := "CREATE DATABASE " + pgx.Identifier{name}.Sanitize() + " TEMPLATE template0 ENCODING 'UTF8' LC_COLLATE 'C' LC_CTYPE 'C'"
	if num >= 150000 {
		// From 15 on the default copies the template through the WAL:
		// megabytes that every logical slot of the server then reads.
		create += " STRATEGY FILE_COPY"
	}
	if _, err := conn.Exec(ctx, create); err != nil {
		return "", nil, fmt.Errorf("siphontest: create database %s: %w", name, err)
	}
	dsn, err = withDatabase(s.dsn, name)
	if err != nil {
		return "", nil, err
	}
	return dsn, func(ctx context.Context) error { return s.dropDatabase(ctx, name) }, nil
}

// dropDatabase terminates the database's sessions (walsenders included),
// drops its logical slots, then the database itself, and then the
// replication origins siphon applied into it with: origins belong to the
// cluster, not to a database, and each one that has ever been used keeps one
// of the server's few origin states (max_active_replication_origins from
// PostgreSQL 18 on, max_replication_slots before) until it is dropped.
func (s *Server) dropDatabase(ctx context.Context, name string) error {
	conn, err := pgx.Connect(ctx, s.dsn)
	if err != nil {
		return fmt.Errorf("drop database %s: %w", name, err)
	}
	defer conn.Close(context.Background())
	var oid uint32
	// 0, no database's OID, when the test dropped it itself.
	if err := conn.QueryRow(ctx, "SELECT coalesce((SELECT oid FROM pg_database WHERE datname = $1), 0)", name).Scan(&oid); err != nil {
		return fmt.Errorf("drop database %s: %w", name, err)
	}
	for {
		_, err = conn.Exec(ctx, `SELECT pg_catalog.pg_terminate_backend(pid) FROM pg_stat_activity
			WHERE datname = $1 AND pid <> pg_catalog.pg_backend_pid()`, name)
		if err == nil {
			_, err = conn.Exec(ctx, `SELECT pg_catalog.pg_drop_replication_slot(slot_name) FROM pg_replication_slots
				WHERE database = $1 AND NOT active`, name)
		}
		if err == nil {
			_, err = conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
		}
		if err == nil {
			// siphon names an origin "siphon_<database OID>_<source>".
			_, err = conn.Exec(ctx, `SELECT pg_catalog.pg_replication_origin_drop(roname) FROM pg_replication_origin
				WHERE pg_catalog.starts_with(roname, $1)`, fmt.Sprintf("siphon_%d_", oid))
		}
		if err == nil {
			return nil
		}
		// A walsender that was just terminated may still hold its slot for a
		// moment ("is active for PID ..."); try again until the deadline.
		select {
		case <-ctx.Done():
			return fmt.Errorf("drop database %s: %w", name, err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// withDatabase returns dsn pointed at another database. It understands both
// URL and keyword/value connection strings.
func withDatabase(dsn, database string) (string, error) {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		u, err := url.Parse(dsn)
		if err != nil {
			return "", fmt.Errorf("siphontest: parse DSN: invalid URL")
		}
		u.Path = "/" + database
		return u.String(), nil
	}
	return dsn + " dbname='" + database + "'", nil
}
