package siphontest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/siphondb/siphon/pgdump"
)

// VersionNum returns the server's server_version_num setting: 160004 for
// PostgreSQL 16.4, so VersionNum/10000 is its major release.
func (s *Server) VersionNum(ctx context.Context) (int, error) {
	conn, err := pgx.Connect(ctx, s.dsn)
	if err != nil {
		return 0, fmt.Errorf("siphontest: server version: %w", err)
	}
	defer conn.Close(context.Background())
	return versionNum(ctx, conn)
}

// versionNum returns the server_version_num of the server conn is
// connected to.
func versionNum(ctx context.Context, conn *pgx.Conn) (int, error) {
	var num int
	if err := conn.QueryRow(ctx, "SELECT pg_catalog.current_setting('server_version_num')::int").Scan(&num); err != nil {
		return 0, fmt.Errorf("siphontest: server version: %w", err)
	}
	return num, nil
}

// SkipUnlessRelease skips the test when the server is of an older major
// release than major, with a message naming the release the test needs and
// the one the server runs. Use it for tests of features a release
// introduced.
func (s *Server) SkipUnlessRelease(tb testing.TB, major int) {
	tb.Helper()
	server := s.version(tb)
	if server.Major < major {
		tb.Skipf("needs PostgreSQL %d or later; the server runs %s", major, server)
	}
}

// SkipUnlessDumpClients skips the test when the pg_dump or pg_restore that
// siphon would use (see [pgdump.Find]) is of an older major release than
// the server, with a message naming the release needed and the one found:
// pg_dump refuses to dump a newer server. Use it in tests that take,
// restore or verify pg_dump backups, which run on servers of every release
// while this machine may have older client programs only. A program that is
// missing altogether fails the test.
func (s *Server) SkipUnlessDumpClients(tb testing.TB) {
	tb.Helper()
	server := s.version(tb)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, program := range []string{"pg_dump", "pg_restore"} {
		_, err := pgdump.Find(ctx, program, "", server)
		var old *pgdump.VersionError
		switch {
		case errors.As(err, &old):
			tb.Skipf("needs %s %s or later; this machine has %s (%s)",
				program, server.Release(), old.Program.Version, old.Program.Path)
		case err != nil:
			tb.Fatalf("siphontest: %v", err)
		}
	}
}

// version returns the server's version, failing the test when it cannot.
func (s *Server) version(tb testing.TB) pgdump.Version {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	num, err := s.VersionNum(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	return pgdump.VersionFromNum(num)
}
