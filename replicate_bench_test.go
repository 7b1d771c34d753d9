package siphon_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/siphondb/siphon"
	"github.com/siphondb/siphon/canonical"
	"github.com/siphondb/siphon/siphontest"
)

// replicaBench is BenchmarkReplicate's source, with what every run must
// reach and hold.
type replicaBench struct {
	src      *benchSource
	srv      *siphontest.Server
	systemID string
	last     canonical.Position // the end of the workload's last transaction
	digest   string             // of the source's standard table
	subs     int
}

// replicaStat is what one catch-up measured: its wall time, and where
// this machine can see them, the time the walsender, the target's
// backends (siphon's apply session; the subscription's apply worker) and
// this process (siphon's capture and apply) spent on a CPU and waiting,
// runnable, for one.
type replicaStat struct {
	took                      time.Duration
	walsender, target, client schedStat
	known                     bool
}

func (a replicaStat) plus(b replicaStat) replicaStat {
	return replicaStat{took: a.took + b.took, walsender: a.walsender.plus(b.walsender), target: a.target.plus(b.target),
		client: a.client.plus(b.client), known: b.known}
}

// report reports the speed of n changes in total, and the shares of the
// wall time and the CPU time per change of each process.
func (a replicaStat) report(b *testing.B, n float64) {
	b.ReportMetric(n/a.took.Seconds(), "changes/s")
	share := func(d time.Duration) float64 { return 100 * d.Seconds() / a.took.Seconds() }
	perChange := func(d time.Duration) float64 { return 1e6 * d.Seconds() / n }
	if a.known {
		b.ReportMetric(share(a.walsender.cpu), "walsender_cpu_pct")
		b.ReportMetric(share(a.walsender.wait), "walsender_runq_pct")
		b.ReportMetric(perChange(a.walsender.cpu), "walsender_cpu_us/change")
		b.ReportMetric(share(a.target.cpu), "target_cpu_pct")
		b.ReportMetric(share(a.target.wait), "target_runq_pct")
		b.ReportMetric(perChange(a.target.cpu), "target_cpu_us/change")
	}
	if a.client.cpu > 0 {
		b.ReportMetric(share(a.client.cpu), "client_cpu_pct")
		b.ReportMetric(share(a.client.wait), "client_runq_pct")
		b.ReportMetric(perChange(a.client.cpu), "client_cpu_us/change")
	}
	b.ReportMetric(0, "ns/op")
}

// watch starts watching the walsender of slot and the backends of the
// target database but admin's; the function returned stops and returns
// what they spent.
func (r *replicaBench) watch(slot string, targetDSN string, admin *pgx.Conn, client bool) func(took time.Duration) replicaStat {
	walsender := r.src.watchBackend(slot)
	target := watchTarget(targetDSN, admin)
	client0 := selfSched()
	return func(took time.Duration) replicaStat {
		st := replicaStat{took: took}
		if client {
			st.client = selfSched().minus(client0)
		}
		var ok1, ok2 bool
		st.walsender, ok1 = walsender()
		st.target, ok2 = target()
		st.known = ok1 && ok2
		return st
	}
}

// watchTarget starts watching the backends of the target database but
// admin's (see watchBackends).
func watchTarget(targetDSN string, admin *pgx.Conn) func() (schedStat, bool) {
	return watchBackends(targetDSN, `SELECT pid FROM pg_stat_activity WHERE datname = current_database()
		AND pid NOT IN (pg_backend_pid(), $1)`, int32(admin.PgConn().PID()))
}

// subConfig is a configuration of a native subscription.
type subConfig struct {
	binary, streaming bool
}

func (c subConfig) String() string {
	return fmt.Sprintf("binary = %t, streaming = %t", c.binary, c.streaming)
}

// BenchmarkReplicate compares Replicate's catch-up with a native
// subscription's, on copies of one slot in front of the standard stream
// workload (see bench_data_test.go), each into a fresh target database
// holding the empty standard table (made off the timer): from the start
// (the Replicate call; CREATE SUBSCRIPTION ... WITH (copy_data = false,
// create_slot = false, slot_name = '<copy>', enabled = true)) until the
// target's replication origin has reached the end of the workload's last
// transaction, polled every 5 ms on the target in both cases. Each
// target is checked equal to the source afterwards.
//
// "siphon" and "subscription", "subscription_binary" and
// "subscription_binary_streaming" measure each alone (changes/s); "ratio"
// runs Replicate, and the subscription in its text and binary
// configurations, on each iteration in alternating order, and reports the
// median and lowest of Replicate's speed over the faster subscription of
// the iteration (x_subscription, target at least 1.0), and how often the
// binary one was the faster (binary_faster_pct).
func BenchmarkReplicate(b *testing.B) { benchReplicate(b, standardWorkload(b)) }

// BenchmarkReplicateWide is BenchmarkReplicate on the wide shape: a tenth
// of the rows, each with a TOASTed doc that updates leave as it is.
func BenchmarkReplicateWide(b *testing.B) { benchReplicate(b, wideWorkload(b)) }

// BenchmarkReplicateSingleRow is BenchmarkReplicate on the single-row
// shape: a tenth of the changes, a transaction for each.
func BenchmarkReplicateSingleRow(b *testing.B) { benchReplicate(b, singleRowWorkload(b)) }

// benchReplicate runs BenchmarkReplicate's sub-benchmarks on work.
func benchReplicate(b *testing.B, work benchWorkload) {
	r := newReplicaBench(b, work)
	changes := float64(r.src.work.changes())
	each := func(run func(b *testing.B) replicaStat) func(b *testing.B) {
		return func(b *testing.B) {
			var total replicaStat
			for b.Loop() {
				total = total.plus(run(b))
			}
			total.report(b, changes*float64(b.N))
		}
	}
	sub := func(cfg subConfig) func(b *testing.B) replicaStat {
		return func(b *testing.B) replicaStat { return r.subscribe(b, cfg) }
	}
	b.Run("siphon", each(r.replicate))
	b.Run("subscription", each(sub(subConfig{})))
	b.Run("subscription_binary", each(sub(subConfig{binary: true})))
	b.Run("subscription_binary_streaming", each(sub(subConfig{binary: true, streaming: true})))
	b.Run("ratio", func(b *testing.B) {
		fastest := r.fastestSubscription(b)
		sideBySide(b, "x_subscription", true, 0, func() time.Duration { return r.replicate(b).took }, fastest.run)
		fastest.report(b)
	})
}

// fastestSubscription runs a native subscription in its text and binary
// configurations, in alternating order, and keeps the faster's time.
type fastestSubscription struct {
	r                  *replicaBench
	b                  *testing.B
	runs, binaryFaster int
}

func (r *replicaBench) fastestSubscription(b *testing.B) *fastestSubscription {
	return &fastestSubscription{r: r, b: b}
}

// run returns the time of the faster configuration on this iteration.
func (f *fastestSubscription) run() time.Duration {
	configs := []subConfig{{}, {binary: true}}
	if f.runs%2 == 1 {
		configs[0], configs[1] = configs[1], configs[0]
	}
	f.runs++
	var best time.Duration
	var bestCfg subConfig
	for i, cfg := range configs {
		if took := f.r.subscribe(f.b, cfg).took; i == 0 || took < best {
			best, bestCfg = took, cfg
		}
	}
	if bestCfg.binary {
		f.binaryFaster++
	}
	return best
}

// report reports how often the binary configuration was the faster.
func (f *fastestSubscription) report(b *testing.B) {
	b.ReportMetric(100*float64(f.binaryFaster)/float64(f.runs), "binary_faster_pct")
}

// newReplicaBench makes the source: work behind a slot, then reads where
// its last transaction ends by streaming a copy of the slot, and the
// source table's digest; and the server of the targets.
//
// The targets live on a server of their own, as a replica does: on the
// source's, the WAL every iteration's target writes would lengthen the
// backlog that the next iteration's stream finds (its catch-up plans its
// chunks on it, BackupIncremental reads all of it), where a subscription
// stops at the workload's end. PostgreSQL 15's launcher starts
// subscription workers at most once every wal_retrieve_retry_interval (5s
// by default), whatever their subscription: without the setting, every
// subscription but the first would wait for it.
func newReplicaBench(b *testing.B, work benchWorkload) *replicaBench {
	b.Helper()
	src := newBenchSource(b, work)
	r := &replicaBench{src: src, digest: tableDigest(b, src.admin, "bench"),
		srv: siphontest.Start(b, siphontest.WithPrivateServer(), siphontest.WithSetting("wal_retrieve_retry_interval", "1ms"))}
	if err := src.admin.QueryRow(context.Background(), "SELECT system_identifier::text FROM pg_control_system()").Scan(&r.systemID); err != nil {
		b.Fatal(err)
	}
	r.last = src.lastCommit(b)
	return r
}

// lastCommit streams a copy of the slot until the marker and returns the
// Position of the last commit before it.
func (s *benchSource) lastCommit(b *testing.B) canonical.Position {
	b.Helper()
	slot := s.copySlot(b)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	c, err := siphon.Connect(ctx, s.dsn, siphon.WithSlot(slot))
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	var last canonical.Position
	_, err = c.StreamChanges(ctx, 0, func(ch canonical.Change) error {
		switch {
		case ch.Op == canonical.OpCommit:
			last = ch.Position
		case ch.Op == canonical.OpMessage && ch.Message.Prefix == "bench.end":
			cancel()
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	return last
}

// target creates a fresh database holding the workload's empty table, off
// the timer, and returns its DSN, an admin session on it and a function
// that drops it.
func (r *replicaBench) target(b *testing.B) (dsn string, admin *pgx.Conn, drop func()) {
	b.Helper()
	b.StopTimer()
	defer b.StartTimer()
	ctx := context.Background()
	dsn, dropDB, err := r.srv.CreateDatabase(ctx)
	if err != nil {
		b.Fatal(err)
	}
	admin, err = pgx.Connect(ctx, dsn)
	if err != nil {
		b.Fatal(err)
	}
	execSQL(b, admin, r.src.work.ddl())
	return dsn, admin, func() {
		admin.Close(ctx)
		if err := dropDB(ctx); err != nil {
			b.Error(err)
		}
	}
}

// replicate runs Replicate from a fresh copy of the slot into a fresh
// target until the target has applied the workload, and returns the time
// that took.
func (r *replicaBench) replicate(b *testing.B) replicaStat {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	dsn, admin, drop := r.target(b)
	defer drop()
	b.StopTimer()
	// siphon's publication holds the schema capture's table, which a
	// subscription needs on its side too (the workload writes no row to it).
	execSQL(b, admin, `CREATE SCHEMA siphon`, `CREATE TABLE siphon.schema_changes (id bigint PRIMARY KEY, change jsonb NOT NULL)`)
	slot, src, target, closeConns := r.siphonEnds(ctx, b, dsn)
	defer closeConns()
	var oid string
	if err := admin.QueryRow(ctx, "SELECT oid::text FROM pg_database WHERE datname = current_database()").Scan(&oid); err != nil {
		b.Fatal(err)
	}
	origin := fmt.Sprintf("siphon_%s_%s_%s", oid, r.systemID, slot)
	b.StartTimer()

	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	stopWatch := r.watch(slot, dsn, admin, true)
	began := time.Now()
	go func() {
		_, err := src.Replicate(runCtx, target, siphon.ReplicateOptions{})
		done <- err
	}()
	reached := r.awaitOrigin(b, admin, origin, done)
	st := stopWatch(time.Since(began))
	stop()
	if err := <-done; err != nil && reached {
		b.Fatalf("Replicate: %v", err)
	}

	r.checkApplied(ctx, b, admin, target, slot, "Replicate")
	return st
}

// siphonEnds makes a fresh copy of the slot and connects siphon to it and
// to the target dsn (call it off the timer); closeConns closes both Conns.
func (r *replicaBench) siphonEnds(ctx context.Context, b *testing.B, dsn string) (slot string, src, target *siphon.Conn, closeConns func()) {
	b.Helper()
	slot = r.src.copySlot(b)
	src, err := siphon.Connect(ctx, r.src.dsn, siphon.WithSlot(slot))
	if err != nil {
		b.Fatal(err)
	}
	target, err = siphon.Connect(ctx, dsn)
	if err != nil {
		src.Close()
		b.Fatal(err)
	}
	return slot, src, target, func() {
		target.Close()
		src.Close()
	}
}

// checkApplied checks, off the timer, that who brought the target of
// admin to the workload's end and to the source's rows, then forgets the
// target's applied position and drops the copy of the slot.
func (r *replicaBench) checkApplied(ctx context.Context, b *testing.B, admin *pgx.Conn, target *siphon.Conn, slot, who string) {
	b.Helper()
	b.StopTimer()
	defer b.StartTimer()
	if applied, err := target.AppliedPositionFor(ctx, r.systemID, slot); err != nil || applied < r.last {
		b.Fatalf("%s: the target applied up to %v (%v), want %v", who, applied, err, r.last)
	}
	r.checkSame(b, admin, who)
	if err := target.ResetAppliedPosition(ctx, r.systemID, slot); err != nil {
		b.Fatal(err)
	}
	r.dropSlot(b, slot)
}

// subscribe has a native subscription in configuration cfg apply a fresh
// copy of the slot into a fresh target until the target has applied the
// workload, and returns the time that took. The subscription is dropped
// without the slot, which it does not own.
func (r *replicaBench) subscribe(b *testing.B, cfg subConfig) replicaStat {
	b.Helper()
	ctx := context.Background()
	dsn, admin, drop := r.target(b)
	defer drop()
	b.StopTimer()
	// siphon's publication holds the schema capture's table, which a
	// subscription needs on its side too (the workload writes no row to it).
	execSQL(b, admin, `CREATE SCHEMA siphon`, `CREATE TABLE siphon.schema_changes (id bigint PRIMARY KEY, change jsonb NOT NULL)`)
	slot := r.src.copySlot(b)
	r.subs++
	name := fmt.Sprintf("bench_sub_%d", r.subs)
	create := fmt.Sprintf(`CREATE SUBSCRIPTION %s CONNECTION '%s' PUBLICATION siphon
		WITH (copy_data = false, create_slot = false, slot_name = '%s', enabled = true, binary = %t, streaming = %t)`,
		name, r.src.dsn, slot, cfg.binary, cfg.streaming)
	b.StartTimer()

	stopWatch := r.watch(slot, dsn, admin, false)
	began := time.Now()
	execSQL(b, admin, create)
	var oid string
	if err := admin.QueryRow(ctx, "SELECT oid::text FROM pg_subscription WHERE subname = $1", name).Scan(&oid); err != nil {
		b.Fatal(err)
	}
	r.awaitOrigin(b, admin, "pg_"+oid, nil)
	st := stopWatch(time.Since(began))

	b.StopTimer()
	defer b.StartTimer()
	execSQL(b, admin, "ALTER SUBSCRIPTION "+name+" DISABLE", "ALTER SUBSCRIPTION "+name+" SET (slot_name = NONE)",
		"DROP SUBSCRIPTION "+name)
	r.checkSame(b, admin, "the subscription ("+cfg.String()+")")
	r.dropSlot(b, slot)
	return st
}

// awaitOrigin polls the target's replication origin until it reaches the
// end of the workload's last transaction, or until done delivers (the
// replica stopped), and reports whether it did.
func (r *replicaBench) awaitOrigin(b *testing.B, admin *pgx.Conn, origin string, done <-chan error) bool {
	b.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(10 * time.Minute)
	for {
		var lsn *string
		err := admin.QueryRow(ctx, `SELECT s.remote_lsn::text FROM pg_replication_origin_status s
			JOIN pg_replication_origin o ON o.roident = s.local_id WHERE o.roname = $1`, origin).Scan(&lsn)
		if err != nil && err != pgx.ErrNoRows {
			b.Fatal(err)
		}
		if lsn != nil {
			pos, err := canonical.ParsePosition(*lsn)
			if err != nil {
				b.Fatal(err)
			}
			if pos >= r.last {
				return true
			}
		}
		select {
		case err := <-done:
			b.Fatalf("the replica stopped before it reached %v: %v", r.last, err)
		default:
		}
		if time.Now().After(deadline) {
			b.Fatalf("origin %s did not reach %v", origin, r.last)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// checkSame checks the target's standard table against the source's.
func (r *replicaBench) checkSame(b *testing.B, admin *pgx.Conn, who string) {
	b.Helper()
	if got := tableDigest(b, admin, "bench"); got != r.digest {
		b.Fatalf("%s: the target holds %s, the source %s", who, got, r.digest)
	}
}

// dropSlot drops a copy of the source slot once no session uses it.
func (r *replicaBench) dropSlot(b *testing.B, slot string) {
	b.Helper()
	ctx := context.Background()
	for deadline := time.Now().Add(time.Minute); ; {
		var active bool
		if err := r.src.admin.QueryRow(ctx, "SELECT active FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&active); err != nil {
			b.Fatal(err)
		}
		if !active {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("slot %s still in use", slot)
		}
		time.Sleep(5 * time.Millisecond)
	}
	execSQL(b, r.src.admin, "SELECT pg_drop_replication_slot('"+slot+"')")
}

// tableDigest returns a fingerprint of a table's rows and their count.
func tableDigest(tb testing.TB, conn *pgx.Conn, table string) string {
	tb.Helper()
	var d *string
	var n int
	if err := conn.QueryRow(context.Background(),
		"SELECT md5(string_agg(r::text, '|' ORDER BY r::text)), count(*) FROM "+table+" r").Scan(&d, &n); err != nil {
		tb.Fatal(err)
	}
	if d == nil {
		return "empty"
	}
	return fmt.Sprintf("%d rows %s", n, *d)
}
