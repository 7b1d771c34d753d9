package main

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/siphondb/siphon/siphontest"
)

func TestMain(m *testing.M) { siphontest.Main(m, siphontest.CheckLeaks()) }

// TestDemo runs `go run ./examples/cdc-jetstream` as a newcomer does.
func TestDemo(t *testing.T) {
	siphontest.Start(t) // skips or fails like the other tests when no server can be had
	var out bytes.Buffer
	require.NoError(t, demo(context.Background(), &out))
	t.Log("\n" + out.String())
	for _, line := range []string{
		"publisher 1 stopped part way",
		fmt.Sprintf("from what the stream holds, and stopped: the stream holds %d transactions", demoTransactions),
		fmt.Sprintf("consumer 1 (every table): %d transactions, all %d orders, each exactly once, in commit order", demoTransactions, demoOrders),
		fmt.Sprintf("consumer 2 (public.orders only): %d transactions, %d of them without an order change", demoTransactions, demoOrders/10),
		fmt.Sprintf("the %d transactions after it", demoTransactions-40),
		"insert public.orders id=1 commit",
	} {
		assert.Contains(t, out.String(), line)
	}
}

// TestPublishAndConsumeOnYourServers runs -publish and -consume as with
// SIPHON_DSN and NATS_URL set: a database of the test server, a nats-server
// in the test.
func TestPublishAndConsumeOnYourServers(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*waitDeadline)
	defer cancel()
	dsn := siphontest.Start(t).NewDatabase(t)
	ns, err := startNATS(t.TempDir())
	require.NoError(t, err)
	defer func() { ns.Shutdown(); ns.WaitForShutdown() }()
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	_, err = conn.Exec(ctx, `CREATE TABLE orders (id int PRIMARY KEY); CREATE TABLE notes (id int PRIMARY KEY)`)
	require.NoError(t, err)

	cfg := config{stream: "YOURS", prefix: "yours", slot: "yours_jetstream", tables: "public.orders"}
	runCtx, stop := context.WithCancel(ctx)
	var pubOut, conOut lockedBuffer
	done := make(chan error, 2)
	go func() { done <- publish(runCtx, dsn, ns.ClientURL(), cfg, &pubOut) }()
	// A new slot is listed before it is consistent, and a transaction that
	// commits before that point is not decoded: its confirmed position is
	// set at that point.
	waitFor(t, "the publisher creates its slot", func() bool {
		var n int
		return conn.QueryRow(ctx, "SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1 AND confirmed_flush_lsn IS NOT NULL",
			cfg.slot).Scan(&n) == nil && n == 1
	})
	for _, sql := range []string{`INSERT INTO notes VALUES (7)`, `INSERT INTO orders VALUES (42)`} {
		_, err = conn.Exec(ctx, sql)
		require.NoError(t, err)
	}
	go func() { done <- consume(runCtx, ns.ClientURL(), cfg, &conOut) }()
	waitFor(t, "the consumer prints the order", func() bool { return strings.Contains(conOut.String(), "insert public.orders id=42 commit") })
	stop()
	require.NoError(t, <-done)
	require.NoError(t, <-done)
	assert.Contains(t, pubOut.String(), "publishing slot yours_jetstream into stream YOURS (yours.>)")
	assert.Contains(t, pubOut.String(), "stopped: the stream holds the transactions up to")
	assert.Regexp(t, `xid \d+: commit .*\nxid \d+: insert public.orders id=42 commit`, conOut.String(),
		"the notes transaction arrives as its begin and commit alone")
}

// waitDeadline bounds the test's waits for what the example guarantees
// will happen: work of milliseconds that a loaded machine or the race
// detector may stretch to seconds, never to minutes.
const waitDeadline = 3 * time.Minute

// waitFor polls cond until it holds, failing the test, saying what it
// waited for, after waitDeadline.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitDeadline)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, waitDeadline)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// lockedBuffer is a bytes.Buffer safe for one writer and one reader.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
