package natsjs_test

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/siphondb/siphon/natsjs"
)

// The environment of the publisher child, the test binary in child mode
// "publish".
const (
	childDSN    = "NATSJS_CHILD_DSN"
	childNATS   = "NATSJS_CHILD_NATS"
	childSlot   = "NATSJS_CHILD_SLOT"
	childStream = "NATSJS_CHILD_STREAM"
	childPrefix = "NATSJS_CHILD_PREFIX"
	childBatch  = "NATSJS_CHILD_BATCH" // MaxChangesPerMessage
)

func init() { childModes["publish"] = publishChild }

// publishChild runs a Publisher until SIGTERM, as a service would.
func publishChild() error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	nc, err := nats.Connect(os.Getenv(childNATS), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		return err
	}
	defer nc.Close()
	batch, err := strconv.Atoi(os.Getenv(childBatch))
	if err != nil {
		return err
	}
	pub, err := natsjs.NewPublisher(nc, natsjs.Config{Stream: os.Getenv(childStream), Prefix: os.Getenv(childPrefix),
		Slot: os.Getenv(childSlot), MaxPending: 32, AckWait: 2 * time.Second, MaxRetryWait: 500 * time.Millisecond,
		MaxChangesPerMessage: batch})
	if err != nil {
		return err
	}
	held, err := pub.Run(ctx, os.Getenv(childDSN))
	fmt.Println("held", held)
	return err
}

// cluster is a three-node JetStream cluster on loopback ports, in this
// process.
type cluster struct {
	opts    []*server.Options
	servers []*server.Server // nil while stopped
}

// startCluster starts three nodes that route to each other, each storing
// in a directory of its own; they are stopped when the test ends.
func startCluster(t *testing.T) *cluster {
	t.Helper()
	ports := freePorts(t, 6)
	var routes []string
	for i := range 3 {
		routes = append(routes, fmt.Sprintf("nats://127.0.0.1:%d", ports[3+i]))
	}
	c := &cluster{servers: make([]*server.Server, 3)}
	for i := range 3 {
		o := natsOptions(t.TempDir())
		o.ServerName = fmt.Sprintf("n%d", i+1)
		o.Port = ports[i]
		o.Cluster = server.ClusterOpts{Name: "siphon", Host: "127.0.0.1", Port: ports[3+i]}
		o.Routes = server.RoutesFromStr(strings.Join(routes, ","))
		c.opts = append(c.opts, o)
	}
	for i := range 3 {
		c.start(t, i)
	}
	t.Cleanup(func() {
		for i := range 3 {
			c.stop(i)
		}
	})
	return c
}

func (c *cluster) start(t *testing.T, i int) { c.servers[i] = startServer(t, c.opts[i]) }

func (c *cluster) stop(i int) {
	if c.servers[i] != nil {
		stopServer(c.servers[i])
		c.servers[i] = nil
	}
}

// urls returns the nodes' client URLs, comma-separated.
func (c *cluster) urls() string {
	var urls []string
	for _, o := range c.opts {
		urls = append(urls, fmt.Sprintf("nats://127.0.0.1:%d", o.Port))
	}
	return strings.Join(urls, ",")
}

// node returns the index of the node named name.
func (c *cluster) node(t *testing.T, name string) int {
	for i, o := range c.opts {
		if o.ServerName == name {
			return i
		}
	}
	t.Fatalf("no node %q", name)
	return -1
}

// freePorts returns n loopback ports free right now.
func freePorts(t *testing.T, n int) []int {
	t.Helper()
	var ports []int
	var ls []net.Listener
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	for _, l := range ls {
		l.Close()
	}
	return ports
}

var clusterDDL = []string{
	`CREATE TABLE events (k int, i int, PRIMARY KEY (k, i))`,
	`CREATE TABLE counters (id int PRIMARY KEY, n int NOT NULL)`,
	`INSERT INTO counters VALUES (0, 0), (1, 0), (2, 0)`,
}

// clusterWorkload commits transaction after transaction until stopped:
// transaction k inserts its rows into events (k, 1..n), most a few, every
// tenth 400, and counts itself in counters.
type clusterWorkload struct {
	halt, done chan struct{}
	committed  int
	err        error
}

func startClusterWorkload(t *testing.T, dsn string) *clusterWorkload {
	w := &clusterWorkload{halt: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		w.err = w.run(dsn)
	}()
	t.Cleanup(func() { w.stop() })
	return w
}

func (w *clusterWorkload) run(dsn string) error {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	tick := time.NewTicker(4 * time.Millisecond)
	defer tick.Stop()
	for k := 1; ; k++ {
		select {
		case <-w.halt:
			return nil
		case <-tick.C:
		}
		n := 1 + k%4
		if k%10 == 0 {
			n = 400
		}
		if _, err := conn.Exec(ctx, fmt.Sprintf(`BEGIN; INSERT INTO events SELECT %d, g FROM generate_series(1, %d) g;
			UPDATE counters SET n = n + 1 WHERE id = %d; COMMIT`, k, n, k%3)); err != nil {
			return err
		}
		w.committed++
	}
}

func (w *clusterWorkload) stop() error {
	select {
	case <-w.halt:
	default:
		close(w.halt)
	}
	<-w.done
	return w.err
}

// TestClusterSurvivesKillsAndNodeLoss publishes into an R3 stream on a
// three-node cluster from a child process while a workload commits: the
// child is SIGKILLed several times (some kills inside a transaction), and
// the stream's leader node is stopped while a child publishes and started
// again. The children publish a message per change, or messages of up to
// 64 or 7 changes, by turns, so a child often resumes inside a
// transaction that another gathered otherwise. At the end the stream holds
// every change of the source exactly once, in commit order (checked
// against a second slot read directly), and a consumer started afterwards
// replays it all.
func TestClusterSurvivesKillsAndNodeLoss(t *testing.T) {
	t.Parallel()
	kills := 6
	if v := os.Getenv("NATSJS_CLUSTER_KILLS"); v != "" {
		var err error
		kills, err = strconv.Atoi(v)
		require.NoError(t, err)
	}
	began := time.Now()
	slot, direct := testSlot(t), testSlot(t)
	dsn, admin, _ := newSource(t, clusterDDL, slot, direct)
	c := startCluster(t)
	_, js := connectNATS(t, c.urls())
	s := createStream(t, js, "CLUSTER", "k", 3)
	env := []string{childDSN + "=" + dsn, childNATS + "=" + c.urls(), childSlot + "=" + slot,
		childStream + "=CLUSTER", childPrefix + "=k"}

	load := startClusterWorkload(t, dsn)
	landed := map[string]int{}
	var stderr bytes.Buffer
	nodeRestarts := 0
	batches := []int{1, 64, 7}
	for round := range kills {
		child := childCmd("publish", append(env, childBatch+"="+strconv.Itoa(batches[round%len(batches)]))...)
		child.Stderr = &stderr
		require.NoError(t, child.Start())
		// Some progress first, a random amount; on odd rounds the kill
		// waits for the stream to end inside a transaction.
		target := lastSeq(t, s) + 50 + rand.Uint64N(400)
		waitFor(t, "the child publishes", func() bool {
			return lastSeq(t, s) >= target && (round%2 == 0 || !endsWithMarker(t, s))
		})
		if round == kills/2 {
			nodeRestarts++
			leader := c.node(t, streamLeader(t, s))
			c.stop(leader)
			target := lastSeq(t, s) + 200
			waitFor(t, "the child publishes to the two nodes left", func() bool { return lastSeq(t, s) >= target })
			c.start(t, leader)
			target = lastSeq(t, s) + 200
			waitFor(t, "the child publishes with the node back", func() bool { return lastSeq(t, s) >= target })
		}
		require.NoError(t, child.Process.Kill())
		_ = child.Wait()
		awaitSlotReleased(t, admin, slot)
		// Counted once what the child had sent is settled, more or less.
		if endsWithMarker(t, s) {
			landed["between transactions"]++
		} else {
			landed["inside a transaction"]++
		}
	}
	require.NoError(t, load.stop())
	require.NotZero(t, landed["inside a transaction"], "some kills leave a transaction half published: %v", landed)
	execSQL(t, admin, `INSERT INTO counters VALUES (-1, 0)`) // the last transaction

	last := childCmd("publish", append(env, childBatch+"=64")...)
	var out bytes.Buffer
	last.Stdout, last.Stderr = &out, &stderr
	require.NoError(t, last.Start())
	changes := slotChanges(t, dsn, direct, insertOf("counters", "-1"))
	end := changes[len(changes)-1].Position
	awaitHeld(t, s, "k", end)
	require.NoError(t, last.Process.Signal(syscall.SIGTERM))
	require.NoError(t, last.Wait(), "the last child stops cleanly on SIGTERM\nstderr: %s", stderr.String())
	assert.Equal(t, fmt.Sprintf("held %v\n", end), out.String())

	waitFor(t, "every replica is current", func() bool { return replicasCurrent(t, s) })
	checkMessages(t, storedMessages(t, s), expectMessages("k", changes), sourceSystemID(t, admin), slot)
	replayed, _ := consumeUntil(t, s, natsjs.ConsumeConfig{Prefix: "k"}, end)
	assert.Equal(t, throughStream(changes, nil), replayed, "a consumer started afterwards replays it all")
	t.Logf("%d kills (%v), %d stream leader stopped and restarted, %d transactions committed, %d messages, %d restarts after a failure, %v",
		kills, landed, nodeRestarts, load.committed+1, lastSeq(t, s), strings.Count(stderr.String(), "starting over"), time.Since(began).Round(time.Millisecond))
}

// lastSeq returns the stream's last sequence.
func lastSeq(t *testing.T, s jetstream.Stream) uint64 {
	info, err := s.Info(context.Background())
	if err != nil {
		return 0 // no leader for a moment
	}
	return info.State.LastSeq
}

// endsWithMarker reports whether the stream's last message is a commit
// marker (the stream ends between transactions).
func endsWithMarker(t *testing.T, s jetstream.Stream) bool {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	m, err := s.GetLastMsgForSubject(ctx, "k.>")
	return err == nil && m.Subject == natsjs.CommitSubject("k")
}

// streamLeader returns the name of the node leading the stream.
func streamLeader(t *testing.T, s jetstream.Stream) string {
	t.Helper()
	var leader string
	waitFor(t, "the stream has a leader", func() bool {
		info, err := s.Info(context.Background())
		if err == nil && info.Cluster != nil {
			leader = info.Cluster.Leader
		}
		return leader != ""
	})
	return leader
}

// replicasCurrent reports whether the stream has a leader and two current
// replicas.
func replicasCurrent(t *testing.T, s jetstream.Stream) bool {
	info, err := s.Info(context.Background())
	if err != nil || info.Cluster == nil || info.Cluster.Leader == "" || len(info.Cluster.Replicas) != 2 {
		return false
	}
	for _, r := range info.Cluster.Replicas {
		if !r.Current || r.Offline {
			return false
		}
	}
	return true
}

// awaitSlotReleased waits until no session streams from slot (a killed
// child's walsender has exited).
func awaitSlotReleased(t *testing.T, admin *pgx.Conn, slot string) {
	t.Helper()
	waitFor(t, "the killed child's walsender exits", func() bool {
		var active bool
		err := admin.QueryRow(context.Background(), "SELECT active FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&active)
		return err == nil && !active
	})
}
