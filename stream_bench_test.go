package siphon_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/siphondb/siphon"
	"github.com/siphondb/siphon/canonical"
	"github.com/siphondb/siphon/siphontest"
)

// benchSource is a database with a pgoutput slot ("bench_src") in front of
// a workload on the standard table, which ends with the marker message.
type benchSource struct {
	dsn    string
	admin  *pgx.Conn
	work   benchWorkload
	marker canonical.Position
	seq    int
	// fastest counts the calls of recvlogicalFastest.
	fastest int
}

// newBenchSource creates the standard table in a fresh database, then the
// slot, then runs the workload.
func newBenchSource(b *testing.B, work benchWorkload) *benchSource {
	b.Helper()
	ctx := context.Background()
	dsn := siphontest.Start(b).NewDatabase(b)
	admin, err := pgx.Connect(ctx, dsn)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { admin.Close(ctx) })
	execSQL(b, admin, work.ddl())
	c, err := siphon.Connect(ctx, dsn, siphon.WithSlot("bench_src"))
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	if _, err := c.CurrentPosition(ctx); err != nil {
		b.Fatal(err)
	}
	marker := work.run(b, admin)
	return &benchSource{dsn: dsn, admin: admin, work: work, marker: marker}
}

// copySlot makes a copy of the source slot (same restart and confirmed
// positions, same plugin), dropped when the benchmark ends.
func (s *benchSource) copySlot(b *testing.B) string {
	b.Helper()
	s.seq++
	name := fmt.Sprintf("bench_copy_%d", s.seq)
	execSQL(b, s.admin, "SELECT pg_copy_logical_replication_slot('bench_src', '"+name+"')")
	b.Cleanup(func() { s.admin.Exec(context.Background(), "SELECT pg_drop_replication_slot($1)", name) })
	return name
}

// streamRun is what one run of a tool on a copy of the slot measured: its
// wall time, and where this machine can see them the time the server
// backend decoding the slot (a walsender, or the session running the SQL
// function) and the client spent on a CPU and waiting, runnable, for one.
type streamRun struct {
	took           time.Duration
	server, client schedStat
	serverKnown    bool
	pipe           bool // pg_recvlogical wrote to a pipe
}

// siphon streams a copy of the slot to a no-op emit (values are decoded
// all the same) until the marker, and checks every change arrived.
func (s *benchSource) siphon(b *testing.B, slot string) streamRun {
	return s.siphonTuned(b, slot, nil)
}

// siphonTuned is siphon with tune applied to the Conn first (nil: as
// connected). The server side it measures is every session of siphon's
// (the walsender, the catch-up's and the pool's).
func (s *benchSource) siphonTuned(b *testing.B, slot string, tune func(*siphon.Conn)) streamRun {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	c, err := siphon.Connect(ctx, s.dsn, siphon.WithSlot(slot))
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	if tune != nil {
		tune(c)
	}
	var got benchWorkload
	var watch func() (schedStat, bool)
	if tune == nil {
		watch = s.watchBackend(slot)
	} else {
		watch = watchBackends(s.dsn, "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND application_name = 'siphon'")
	}
	client0 := selfSched()
	began := time.Now()
	_, err = c.StreamChanges(ctx, 0, func(ch canonical.Change) error {
		switch ch.Op {
		case canonical.OpInsert:
			got.inserts++
		case canonical.OpUpdate:
			got.updates++
		case canonical.OpDelete:
			got.deletes++
		case canonical.OpMessage:
			if ch.Message.Prefix == "bench.end" {
				cancel()
			}
		}
		return nil
	})
	run := streamRun{took: time.Since(began), client: selfSched().minus(client0)}
	run.server, run.serverKnown = watch()
	if err != nil {
		b.Fatal(err)
	}
	if got.inserts != s.work.inserts || got.updates != s.work.updates || got.deletes != s.work.deletes {
		b.Fatalf("streamed %d inserts, %d updates, %d deletes; want %d, %d, %d",
			got.inserts, got.updates, got.deletes, s.work.inserts, s.work.updates, s.work.deletes)
	}
	return run
}

// recvConfig is a configuration of pg_recvlogical: pgoutput's binary
// mode, and where the output goes.
type recvConfig struct {
	binary bool
	// pipe writes the output to stdout (-f -), a pipe this process drains
	// into io.Discard; else to /dev/null without fsync (-f /dev/null -F 0).
	pipe bool
}

// recvlogical runs pg_recvlogical (pgoutput) on a copy of the slot until
// the marker.
func (s *benchSource) recvlogical(b *testing.B, slot string, cfg recvConfig) streamRun {
	b.Helper()
	args := []string{"-d", s.dsn, "--slot", slot, "--start", "--no-loop",
		"-o", "proto_version=1", "-o", "publication_names=siphon", "-o", "messages=true",
		"--endpos", s.marker.String()}
	if cfg.pipe {
		args = append(args, "-f", "-")
	} else {
		args = append(args, "-f", "/dev/null", "-F", "0")
	}
	if cfg.binary {
		args = append(args, "-o", "binary=true")
	}
	cmd := exec.Command(clientProgram(b, "pg_recvlogical"), args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	var out io.ReadCloser
	if cfg.pipe {
		var err error
		if out, err = cmd.StdoutPipe(); err != nil {
			b.Fatal(err)
		}
	}
	watch := s.watchBackend(slot)
	began := time.Now()
	err := cmd.Start()
	if err == nil && out != nil {
		_, err = io.Copy(io.Discard, out)
	}
	if err == nil {
		err = cmd.Wait()
	}
	run := streamRun{took: time.Since(began), pipe: cfg.pipe}
	run.server, run.serverKnown = watch()
	if err != nil {
		b.Fatalf("pg_recvlogical: %v: %s", err, stderr.String())
	}
	run.client.cpu = cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
	return run
}

// recvlogicalFastest runs pg_recvlogical in both of its output
// configurations (text values), each on its own copy of the slot, in
// alternating order from call to call, and returns the faster run: the
// reference of x_pg_recvlogical.
func (s *benchSource) recvlogicalFastest(b *testing.B, copySlot func(*testing.B) string) streamRun {
	b.Helper()
	configs := []recvConfig{{pipe: true}, {pipe: false}}
	s.fastest++
	if s.fastest%2 == 0 {
		configs[0], configs[1] = configs[1], configs[0]
	}
	var best streamRun
	for i, cfg := range configs {
		b.StopTimer()
		slot := copySlot(b)
		b.StartTimer()
		if r := s.recvlogical(b, slot, cfg); i == 0 || r.took < best.took {
			best = r
		}
	}
	return best
}

// serverDecode has the server decode a copy of the slot by itself, with no
// client in the way: SELECT count(*) over pg_logical_slot_peek_binary_changes
// (pgoutput, the same options pg_recvlogical is given).
func (s *benchSource) serverDecode(b *testing.B, slot string) streamRun {
	b.Helper()
	var n int
	pid := int(s.admin.PgConn().PID())
	sched0, known := procSched(pid)
	began := time.Now()
	err := s.admin.QueryRow(context.Background(), `SELECT count(*) FROM pg_logical_slot_peek_binary_changes($1, NULL, NULL,
		'proto_version', '1', 'publication_names', 'siphon', 'messages', 'true')`, slot).Scan(&n)
	run := streamRun{took: time.Since(began)}
	sched1, ok := procSched(pid)
	run.server, run.serverKnown = sched1.minus(sched0), known && ok
	if err != nil {
		b.Fatal(err)
	}
	if n < s.work.changes() {
		b.Fatalf("server decoded %d messages, want at least %d", n, s.work.changes())
	}
	return run
}

// watchBackend samples the scheduler statistics of the backends that
// decode slot's changes (its active_pid, and the sessions that catch a
// stream up through the SQL interface by reading temporary copies of a
// slot: one benchmark runs at a time) from the time each appears until
// the returned function is called, which returns the sum of the last
// samples: the backends' times since they started. ok is false when no
// backend was seen, as with a server on another machine.
func (s *benchSource) watchBackend(slot string) func() (sched schedStat, ok bool) {
	return watchBackends(s.dsn, `SELECT active_pid FROM pg_replication_slots
		WHERE (slot_name = $1 OR starts_with(slot_name, 'siphon_catchup_')) AND active_pid IS NOT NULL`, slot)
}

// watchBackends samples, every 20 ms, the scheduler statistics of the
// backends whose pids query returns (run on the database dsn names, every
// 100 ms) until the returned function is called, which returns the sum of
// each one's last sample less its first: their times since the watch
// started. A backend the first query finds (a session a Conn kept from an
// earlier call) counts from then; one that appears later, from its start.
// It returns once the first query ran. ok is false when none was seen. A
// backend that ends between two samples loses what it spent after the
// first; sampling more often cost this process, whose CPU the benchmarks
// report too, about 2 us per change.
func watchBackends(dsn, query string, args ...any) func() (sched schedStat, ok bool) {
	ctx, cancel := context.WithCancel(context.Background())
	done, ready := make(chan struct{}), make(chan struct{})
	first, last := map[int]schedStat{}, map[int]schedStat{}
	go func() {
		defer close(done)
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			close(ready)
			return
		}
		defer conn.Close(context.Background())
		var asked time.Time
		for {
			if time.Since(asked) > 100*time.Millisecond {
				starting := asked.IsZero()
				asked = time.Now()
				if rows, err := conn.Query(ctx, query, args...); err == nil {
					for rows.Next() {
						var pid int32
						if rows.Scan(&pid) != nil {
							continue
						}
						if _, known := last[int(pid)]; !known {
							last[int(pid)] = schedStat{}
							if st, ok := procSched(int(pid)); ok && starting {
								first[int(pid)] = st
							}
						}
					}
					rows.Close()
				}
				if starting {
					close(ready)
				}
			}
			for pid := range last {
				if st, ok := procSched(pid); ok {
					last[pid] = st
				}
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	<-ready
	return func() (schedStat, bool) {
		cancel()
		<-done
		var sum schedStat
		for pid, st := range last {
			sum = sum.plus(st.minus(first[pid]))
		}
		return sum, len(last) > 0
	}
}

// schedStat is the time a process or thread spent on a CPU, and runnable
// but waiting for one (on a busy machine), from /proc/<pid>/schedstat.
type schedStat struct{ cpu, wait time.Duration }

func (a schedStat) minus(b schedStat) schedStat { return schedStat{a.cpu - b.cpu, a.wait - b.wait} }
func (a schedStat) plus(b schedStat) schedStat  { return schedStat{a.cpu + b.cpu, a.wait + b.wait} }

// readSchedStat reads one schedstat file: nanoseconds on a CPU,
// nanoseconds waiting on a run queue, time slices.
func readSchedStat(path string) (schedStat, bool) {
	data, err := os.ReadFile(path)
	if err != nil {
		return schedStat{}, false
	}
	var cpu, wait int64
	if _, err := fmt.Sscan(string(data), &cpu, &wait); err != nil {
		return schedStat{}, false
	}
	return schedStat{time.Duration(cpu), time.Duration(wait)}, true
}

// procSched reads a single-threaded process's schedstat (a backend's).
func procSched(pid int) (schedStat, bool) {
	return readSchedStat("/proc/" + strconv.Itoa(pid) + "/schedstat")
}

// selfSched sums the schedstat of every thread of this process.
func selfSched() schedStat {
	var sum schedStat
	tasks, _ := filepath.Glob("/proc/self/task/*/schedstat")
	for _, t := range tasks {
		if st, ok := readSchedStat(t); ok {
			sum.cpu += st.cpu
			sum.wait += st.wait
		}
	}
	return sum
}

// BenchmarkStreamChanges compares StreamChanges (no-op emit, every value
// decoded into canonical text) with pg_recvlogical (pgoutput) on copies of
// the same slot over the same WAL, in one run: the standard stream
// workload (SIPHON_BENCH_ROWS inserts, a quarter as many updates, a tenth
// as many deletes, SIPHON_BENCH_TX_ROWS changes per transaction). See
// benchStream for what it reports.
func BenchmarkStreamChanges(b *testing.B) { benchStream(b, standardWorkload(b)) }

// BenchmarkStreamChangesBulk is BenchmarkStreamChanges on the bulk shape
// of the same changes: one transaction of SIPHON_BENCH_ROWS inserts, one
// of a quarter as many updates, one of a tenth as many deletes.
func BenchmarkStreamChangesBulk(b *testing.B) { benchStream(b, bulkWorkload(b)) }

// benchStream runs the stream benchmarks on work. Each tool's
// sub-benchmark reports changes/s, and where this machine can see the
// processes, the time the decoding backend (the walsender, or the session
// of server_decode) and the client spent on a CPU, as a share of the wall
// time (server_cpu_pct, client_cpu_pct) and per change
// (server_cpu_us/change, client_cpu_us/change), and the share of the wall
// time they were runnable but waited for a core (server_runq_pct,
// client_runq_pct; siphon only, for the client). A backend whose CPU and
// run-queue shares add up to about 100% was never idle: it is the
// bottleneck, and a client well below that was waiting for it.
//
// pg_recvlogical runs in two output configurations: to a pipe this
// process drains (pg_recvlogical_pipe: -f -) and to /dev/null without
// fsync (pg_recvlogical: -f /dev/null -F 0). "ratio" runs siphon and both
// of them on each iteration, each on its own copy of the slot, and reports
// the median and lowest of siphon's speed over the faster pg_recvlogical
// of the iteration (x_pg_recvlogical, target at least 1.0), and how often
// the pipe was the faster (pipe_faster_pct). The pg_recvlogical_binary
// variant and "binary_gain" ask pgoutput for binary values, to measure what
// binary mode would save on the server. "server_decode" has the server
// decode a copy of the slot by itself (count(*) over
// pg_logical_slot_peek_binary_changes), and "server_decode_ratio" reports
// siphon's speed over that: how much of the server's own decode rate
// reaches the callback.
func benchStream(b *testing.B, work benchWorkload) {
	src := newBenchSource(b, work)
	changes := float64(src.work.changes())
	// each runs one tool per iteration on a fresh copy of the slot and
	// reports its changes/s and CPU shares.
	each := func(run func(b *testing.B, slot string) streamRun) func(b *testing.B) {
		return func(b *testing.B) {
			var total streamRun
			for b.Loop() {
				b.StopTimer()
				slot := src.copySlot(b)
				b.StartTimer()
				r := run(b, slot)
				total.took += r.took
				total.server = total.server.plus(r.server)
				total.client = total.client.plus(r.client)
				total.serverKnown = r.serverKnown
			}
			n := changes * float64(b.N)
			b.ReportMetric(n/total.took.Seconds(), "changes/s")
			share := func(d time.Duration) float64 { return 100 * d.Seconds() / total.took.Seconds() }
			if total.serverKnown {
				b.ReportMetric(share(total.server.cpu), "server_cpu_pct")
				b.ReportMetric(share(total.server.wait), "server_runq_pct")
				b.ReportMetric(1e6*total.server.cpu.Seconds()/n, "server_cpu_us/change")
			}
			if total.client.cpu > 0 {
				b.ReportMetric(share(total.client.cpu), "client_cpu_pct")
				b.ReportMetric(1e6*total.client.cpu.Seconds()/n, "client_cpu_us/change")
			}
			if total.client.wait > 0 {
				b.ReportMetric(share(total.client.wait), "client_runq_pct")
			}
			b.ReportMetric(0, "ns/op")
		}
	}
	siphonRun := func(b *testing.B, slot string) streamRun { return src.siphon(b, slot) }
	recv := func(cfg recvConfig) func(b *testing.B, slot string) streamRun {
		return func(b *testing.B, slot string) streamRun { return src.recvlogical(b, slot, cfg) }
	}
	b.Run("siphon", each(siphonRun))
	b.Run("pg_recvlogical_pipe", each(recv(recvConfig{pipe: true})))
	b.Run("pg_recvlogical", each(recv(recvConfig{})))
	b.Run("pg_recvlogical_binary", each(recv(recvConfig{binary: true})))
	b.Run("server_decode", each(src.serverDecode))
	// All on each iteration, in alternating order: the median of the
	// per-iteration ratios holds on a noisy machine.
	b.Run("ratio", func(b *testing.B) {
		pipeFaster, runs := 0, 0
		fastest := func() time.Duration {
			r := src.recvlogicalFastest(b, src.copySlot)
			runs++
			if r.pipe {
				pipeFaster++
			}
			return r.took
		}
		ours := func() time.Duration {
			b.StopTimer()
			slot := src.copySlot(b)
			b.StartTimer()
			return src.siphon(b, slot).took
		}
		sideBySide(b, "x_pg_recvlogical", true, 0, ours, fastest)
		b.ReportMetric(100*float64(pipeFaster)/float64(runs), "pipe_faster_pct")
	})
	b.Run("server_decode_ratio", func(b *testing.B) {
		pairedRatio(b, "x_server_decode", src.serverDecode, siphonRun, src.copySlot)
	})
	// What binary mode would save the walsender: pg_recvlogical in text
	// mode over pg_recvlogical in binary mode.
	b.Run("binary_gain", func(b *testing.B) {
		pairedRatio(b, "x_text", recv(recvConfig{}), recv(recvConfig{binary: true}), src.copySlot)
	})
}

// pairedRatio runs reference and contender side by side, each on a fresh
// copy of the slot (made off the timer), and reports the median and the
// lowest of the contender's speed over the reference's as unit: above 1,
// the contender is faster.
func pairedRatio(b *testing.B, unit string, reference, contender func(b *testing.B, slot string) streamRun, copySlot func(*testing.B) string) {
	onCopy := func(run func(b *testing.B, slot string) streamRun) func() time.Duration {
		return func() time.Duration {
			b.StopTimer()
			slot := copySlot(b)
			b.StartTimer()
			return run(b, slot).took
		}
	}
	sideBySide(b, unit, true, 0, onCopy(contender), onCopy(reference))
}

// BenchmarkStreamHugeTransactionRSS streams one transaction of
// SIPHON_BENCH_HUGE_ROWS rows of the standard table (default 200000; the
// target is 2000000 in 64 MiB) in a child process that reports its own
// peak RSS (VmHWM), so the figure is the stream's alone.
func BenchmarkStreamHugeTransactionRSS(b *testing.B) {
	src := newBenchSource(b, hugeTransaction(b))
	rows := src.work.inserts
	for b.Loop() {
		b.StopTimer()
		slot := src.copySlot(b)
		b.StartTimer()
		cmd := childCmd("huge-transaction-rss", "SIPHON_RSS_CHILD_DSN="+src.dsn, "SIPHON_RSS_CHILD_SLOT="+slot,
			"SIPHON_RSS_CHILD_ROWS="+strconv.Itoa(rows))
		out, err := cmd.CombinedOutput()
		if err != nil {
			b.Fatalf("child: %v\n%s", err, out)
		}
		var hwm, took int64
		sc := bufio.NewScanner(bytes.NewReader(out))
		for sc.Scan() {
			if v, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "rss-child: "); ok {
				fmt.Sscanf(v, "vmhwm_kib=%d took_ms=%d", &hwm, &took)
			}
		}
		if hwm == 0 {
			b.Fatalf("child reported no peak RSS:\n%s", out)
		}
		b.ReportMetric(float64(hwm)/1024, "peak_RSS_MiB")
		b.ReportMetric(float64(rows)/(float64(took)/1000), "rows/s")
		b.ReportMetric(0, "ns/op")
	}
}

func init() { childModes["huge-transaction-rss"] = rssChild }

// rssChild is BenchmarkStreamHugeTransactionRSS's child process: it streams the huge transaction
// and prints its own peak RSS.
func rssChild() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	c, err := siphon.Connect(ctx, os.Getenv("SIPHON_RSS_CHILD_DSN"), siphon.WithSlot(os.Getenv("SIPHON_RSS_CHILD_SLOT")))
	if err != nil {
		return err
	}
	defer c.Close()
	want, _ := strconv.Atoi(os.Getenv("SIPHON_RSS_CHILD_ROWS"))
	inserts := 0
	began := time.Now()
	_, err = c.StreamChanges(ctx, 0, func(ch canonical.Change) error {
		switch ch.Op {
		case canonical.OpInsert:
			inserts++
		case canonical.OpMessage:
			if ch.Message.Prefix == "bench.end" {
				cancel()
			}
		}
		return nil
	})
	took := time.Since(began)
	if err != nil {
		return err
	}
	if inserts != want {
		return fmt.Errorf("streamed %d inserts, want %d", inserts, want)
	}
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return err
	}
	for line := range strings.SplitSeq(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kib, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
			fmt.Printf("rss-child: vmhwm_kib=%d took_ms=%d\n", kib, took.Milliseconds())
		}
	}
	return nil
}
