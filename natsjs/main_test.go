package natsjs_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/siphondb/siphon"
	"github.com/siphondb/siphon/canonical"
	"github.com/siphondb/siphon/natsjs"
	"github.com/siphondb/siphon/siphontest"
)

// childModeEnv names the environment variable that makes the test binary
// run one of childModes instead of the tests.
const childModeEnv = "NATSJS_TEST_CHILD"

// childModes are the programs the test binary runs as a child process of a
// test (a process to SIGKILL), by the value of childModeEnv.
var childModes = map[string]func() error{}

func TestMain(m *testing.M) {
	if mode := os.Getenv(childModeEnv); mode != "" {
		run, ok := childModes[mode]
		if !ok {
			fmt.Fprintf(os.Stderr, "no child mode %q\n", mode)
			os.Exit(2)
		}
		if err := run(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	siphontest.Main(m, siphontest.CheckLeaks())
}

// childCmd returns the test binary set up to run the child mode named
// mode, with env added to this process's environment.
func childCmd(mode string, env ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), childModeEnv+"="+mode), env...)
	return cmd
}

// natsOptions returns the options of an in-process JetStream server on a
// free loopback port, storing in dir.
func natsOptions(dir string) *server.Options {
	return &server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: dir,
		NoLog: true, NoSigs: true, JetStreamMaxMemory: 64 << 20, JetStreamMaxStore: 1 << 30}
}

// startServer starts a NATS server with opts and waits until it takes
// connections.
func startServer(tb testing.TB, opts *server.Options) *server.Server {
	tb.Helper()
	s, err := server.NewServer(opts)
	require.NoError(tb, err)
	s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		s.Shutdown()
		tb.Fatalf("NATS server %s not ready within 10s", opts.ServerName)
	}
	return s
}

// stopServer shuts s down and waits until it has.
func stopServer(s *server.Server) {
	s.Shutdown()
	s.WaitForShutdown()
}

// startNATS starts a single-node JetStream server (file storage in a
// temporary directory), stopped when the test ends.
func startNATS(tb testing.TB) *server.Server {
	tb.Helper()
	s := startServer(tb, natsOptions(tb.TempDir()))
	tb.Cleanup(func() { stopServer(s) })
	return s
}

// connectNATS connects to urls (comma-separated), closed when the test
// ends.
func connectNATS(tb testing.TB, urls string) (*nats.Conn, jetstream.JetStream) {
	tb.Helper()
	nc, err := nats.Connect(urls, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	require.NoError(tb, err)
	tb.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(tb, err)
	return nc, js
}

// createStream creates a stream for prefix, fit for a Publisher, with
// replicas copies, retrying while a cluster elects its leaders.
func createStream(tb testing.TB, js jetstream.JetStream, name, prefix string, replicas int) jetstream.Stream {
	tb.Helper()
	cfg := natsjs.StreamConfig(name, prefix)
	cfg.Replicas = replicas
	var s jetstream.Stream
	waitFor(tb, "the stream is created", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		var err error
		s, err = js.CreateStream(ctx, cfg)
		return err == nil
	})
	return s
}

// waitDeadline bounds every wait of the tests for something the code
// guarantees will happen: work of milliseconds that a loaded machine or the
// race detector may stretch to seconds, never to minutes. Only a hang
// reaches it.
const waitDeadline = 3 * time.Minute

// waitFor polls cond until it holds, failing the test, saying what it
// waited for, after waitDeadline.
func waitFor(tb testing.TB, what string, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(waitDeadline)
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("%s: not within %v", what, waitDeadline)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

var slotSeq atomic.Int64

// testSlot returns a slot name unique to the test binary.
func testSlot(t testing.TB) string {
	name := regexp.MustCompile(`[^a-z0-9]+`).ReplaceAllString(strings.ToLower(t.Name()), "_")
	if len(name) > 40 {
		name = name[len(name)-40:]
	}
	return fmt.Sprintf("js_%s_%d", strings.Trim(name, "_"), slotSeq.Add(1))
}

// newSource returns a fresh database with the given tables and an admin
// session on it, installs the schema capture, and creates each slot
// (publication first) before any
// change, so each slot's stream holds every change made next. It returns
// the slots' start.
func newSource(t testing.TB, ddl []string, slots ...string) (string, *pgx.Conn, canonical.Position) {
	t.Helper()
	ctx := context.Background()
	dsn := siphontest.Start(t).NewDatabase(t)
	admin, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	t.Cleanup(func() { admin.Close(context.Background()) })
	for _, s := range ddl {
		_, err := admin.Exec(ctx, s)
		require.NoError(t, err, s)
	}
	var start canonical.Position
	for _, slot := range slots {
		c, err := siphon.Connect(ctx, dsn, siphon.WithSlot(slot))
		require.NoError(t, err)
		if start == 0 {
			require.NoError(t, c.InstallSchemaCapture(ctx), "schema changes are published too")
		}
		pos, err := c.CurrentPosition(ctx)
		c.Close()
		require.NoError(t, err)
		start = max(start, pos)
	}
	return dsn, admin, start
}

// execSQL runs statements on conn, failing the test on error.
func execSQL(tb testing.TB, conn *pgx.Conn, statements ...string) {
	tb.Helper()
	for _, s := range statements {
		_, err := conn.Exec(context.Background(), s)
		require.NoError(tb, err, s)
	}
}

// running is a Publisher.Run in the background.
type running struct {
	cancel context.CancelFunc
	done   chan struct{}
	held   canonical.Position
	err    error
}

// runPublisher runs pub on dsn in the background until stopped (at the
// latest when the test ends).
func runPublisher(t testing.TB, pub *natsjs.Publisher, dsn string, opts ...siphon.Option) *running {
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		r.held, r.err = pub.Run(ctx, dsn, opts...)
	}()
	t.Cleanup(func() { r.stop() })
	return r
}

// stop cancels the run and returns what Run returned.
func (r *running) stop() (canonical.Position, error) {
	r.cancel()
	<-r.done
	return r.held, r.err
}

// heldEnd returns the end Position of the last transaction s holds (its
// last commit marker's), zero when there is none.
func heldEnd(tb testing.TB, s jetstream.Stream, prefix string) canonical.Position {
	tb.Helper()
	m, err := s.GetLastMsgForSubject(context.Background(), natsjs.CommitSubject(prefix))
	if err != nil {
		return 0
	}
	end, err := canonical.ParsePosition(m.Header.Get(natsjs.HeaderEnd))
	require.NoError(tb, err)
	return end
}

// awaitHeld waits until s holds the transaction ending at end.
//
// A publisher with a long backlog (a slow machine, the race detector) may
// take longer than any fixed bound: it fails only once the stream has
// not moved on for a minute.
func awaitHeld(tb testing.TB, s jetstream.Stream, prefix string, end canonical.Position) {
	tb.Helper()
	held, moved := heldEnd(tb, s, prefix), time.Now()
	for held < end {
		if time.Since(moved) > time.Minute {
			tb.Fatalf("the stream holds the transaction ending at %v: not yet, and it has stood at %v for a minute", end, held)
		}
		time.Sleep(20 * time.Millisecond)
		if now := heldEnd(tb, s, prefix); now > held {
			held, moved = now, time.Now()
		}
	}
}

// storedMessages returns every message s holds, in stream order.
func storedMessages(tb testing.TB, s jetstream.Stream) []*jetstream.RawStreamMsg {
	tb.Helper()
	ctx := context.Background()
	info, err := s.Info(ctx)
	require.NoError(tb, err)
	var msgs []*jetstream.RawStreamMsg
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := s.GetMsg(ctx, seq)
		require.NoError(tb, err, "message %d", seq)
		msgs = append(msgs, m)
	}
	return msgs
}

// slotChanges streams slot on dsn directly, from where it stands, until
// the commit of the first transaction holding a change last reports, and
// returns every change.
func slotChanges(tb testing.TB, dsn, slot string, last func(canonical.Change) bool) []canonical.Change {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitDeadline)
	defer cancel()
	c, err := siphon.Connect(ctx, dsn, siphon.WithSlot(slot))
	require.NoError(tb, err)
	defer c.Close()
	var got []canonical.Change
	found := false
	_, err = c.StreamChanges(ctx, 0, func(ch canonical.Change) error {
		got = append(got, ch)
		found = found || last(ch)
		if ch.Op == canonical.OpCommit && found {
			cancel()
		}
		return nil
	})
	require.NoError(tb, err)
	require.True(tb, found, "the slot's stream reaches the last transaction")
	return got
}

// warnings is a log handler that counts warnings, so a test can wait for
// a Publisher to have met a failure.
type warnings struct{ n *atomic.Int64 }

func newWarnings() warnings { return warnings{n: new(atomic.Int64)} }

func (w warnings) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }

func (w warnings) Handle(context.Context, slog.Record) error {
	w.n.Add(1)
	return nil
}

func (w warnings) WithAttrs([]slog.Attr) slog.Handler { return w }

func (w warnings) WithGroup(string) slog.Handler { return w }
