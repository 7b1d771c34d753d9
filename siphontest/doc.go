// Package siphontest gives tests a throwaway PostgreSQL server with logical
// replication enabled (wal_level=logical, at least 20 replication slots and
// WAL senders), and a fresh database per test.
//
//	func TestMyHandler(t *testing.T) {
//		t.Parallel()
//		dsn := siphontest.Start(t).NewDatabase(t)
//		// connect to dsn, create tables, stream changes ...
//	}
//
// [Start] finds a server, in this order:
//
//  1. SIPHON_TEST_DSN, when set: that server is used as it is (it must run
//     with wal_level=logical and the role must be allowed to create
//     databases and use replication);
//  2. local PostgreSQL server binaries (initdb and postgres: those of the
//     directory SIPHON_TEST_SERVER_BIN or [WithServerBin] names, to test on
//     another release, else those on PATH or under
//     /usr/lib/postgresql/*/bin): a throwaway cluster in a temporary
//     directory on a free loopback port, with fsync off and WAL segments
//     not zero-filled (a test server need not survive a crash). When the test runs
//     as root the server runs as the unprivileged "postgres" user (or
//     "nobody"), since PostgreSQL refuses to run as root. The superuser
//     "postgres" connects without a password; every other role must give
//     its password (scram-sha-256), so tests can check password handling;
//  3. a Docker engine, through the docker command: a postgres:16-alpine
//     container with its port published on 127.0.0.1, removed by a reaper
//     when the test binary exits;
//  4. otherwise the test is skipped with a message saying how to get a
//     server, or fails when the CI environment variable is set.
//
// One server is shared by all the tests of a test binary and started once
// (a second or two for initdb and start-up); [Server.NewDatabase] then
// creates a database in a fraction of a second (from PostgreSQL 15 on with
// STRATEGY FILE_COPY: the default writes the template's pages to the WAL,
// which every logical slot of the shared server would then read) and drops
// it when the test ends, after terminating its sessions and dropping its
// replication slots.
//
// A local server is watched by a small reaper process that stops it and
// removes its directory as soon as the test binary exits, however it exits:
// normally, by a panic, or killed by the go test timeout. No TestMain is
// needed. A TestMain that wants the server stopped before the binary exits
// calls [Main]:
//
//	func TestMain(m *testing.M) { siphontest.Main(m) }
//
// With [CheckLeaks], Main also fails a run whose tests passed but left a
// goroutine running (a stream never cancelled, a connection never closed)
// or a child process behind:
//
//	func TestMain(m *testing.M) { siphontest.Main(m, siphontest.CheckLeaks()) }
//
// A test that needs a server of its own (server-wide settings, physical
// slots) asks for one with [WithPrivateServer]. Such a server can be
// restarted ([Server.Restart], a fast shutdown as pg_ctl restart -m fast)
// to test how code copes with a server going away, and can accept SSL
// ([WithTLS]).
//
// Tests of what a PostgreSQL release brought skip on older servers with
// [Server.SkipUnlessRelease]; tests of pg_dump backups skip with
// [Server.SkipUnlessDumpClients] where this machine's pg_dump is older than
// the server, which it refuses to dump.
//
// # Recorded streams
//
// The other half of testing a handler needs no server: record a live
// stream once into a file committed under testdata, and replay it into the
// handler in every run, deterministically. [canonical.Recorder] records
// what StreamChanges delivers (in front of the handler, as a tee);
// [canonical.Replay] delivers a recording as StreamChanges would (begin,
// changes, commit, Positions; from a Position, to test resume logic).
// [Recording] runs the golden-file workflow: it returns the committed
// recording, and records it again from a live server only when
// SIPHON_RECORD is set:
//
//	stream := siphontest.Recording(t, "testdata/orders.jsonl", func(w io.Writer) error {
//		dsn := siphontest.Start(t).NewDatabase(t)
//		return recordWorkload(ctx, dsn, w)
//	})
//	_, err := canonical.Replay(ctx, bytes.NewReader(stream), 0, handler.Handle)
//
// The recorder and the replayer live in package canonical, not here: they
// need nothing but the codec, and they serve outside tests too (replaying
// an incremental backup into the live handler, recording a production
// stream to reproduce a handler's failure).
//
// [Launch] starts a server outside tests (the examples use it to run on an
// embedded throwaway PostgreSQL); its caller closes it.
package siphontest
