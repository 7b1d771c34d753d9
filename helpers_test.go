package siphon_test

// Helpers the tests of many files share: databases, connections, slots,
// statements and what tables hold. A helper only one file uses stays there.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/siphondb/siphon"
	"github.com/siphondb/siphon/canonical"
	"github.com/siphondb/siphon/siphontest"
)

// waitDeadline bounds every wait of the tests for something the code
// guarantees will happen (a session ends, a slot is released, a
// transaction is applied): work of milliseconds that a loaded machine or
// the race detector may stretch to seconds, never to minutes. Only a hang
// reaches it.
const waitDeadline = 3 * time.Minute

// stallDeadline bounds long work that shows its progress (a child process
// applying a workload, a consumer's many runs), where waitDeadline from
// the start would bound how fast the machine is: it is reached only when
// its bound passes with no progress, so only a hang reaches it, however
// slowly a loaded machine works.
type stallDeadline struct {
	bound time.Duration
	last  atomic.Int64 // UnixNano of the last progress
}

// newStallDeadline returns a stallDeadline of bound, counting from now.
func newStallDeadline(bound time.Duration) *stallDeadline {
	s := &stallDeadline{bound: bound}
	s.progressed()
	return s
}

// progressed records progress.
func (s *stallDeadline) progressed() { s.last.Store(time.Now().UnixNano()) }

// stalled reports whether the bound has passed since the last progress.
func (s *stallDeadline) stalled() bool {
	return time.Since(time.Unix(0, s.last.Load())) > s.bound
}

// context returns a context cancelled once s has stalled, with the
// cause saying so.
func (s *stallDeadline) context(parent context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(parent)
	go func() {
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				if s.stalled() {
					cancel(fmt.Errorf("no progress for %v", s.bound))
					return
				}
			}
		}
	}()
	return ctx, func() { cancel(context.Canceled) }
}

// writer returns w, which counts each write as progress.
func (s *stallDeadline) writer(w io.Writer) io.Writer { return progressWriter{w, s} }

type progressWriter struct {
	w io.Writer
	s *stallDeadline
}

func (p progressWriter) Write(b []byte) (int, error) {
	p.s.progressed()
	return p.w.Write(b)
}

// waitUntil polls cond, with a short backoff, until it holds or
// waitDeadline has passed, and reports whether it held. It runs cond on
// the caller's goroutine.
func waitUntil(cond func() bool) bool {
	deadline := time.Now().Add(waitDeadline)
	for pause := time.Millisecond; !cond(); pause = min(2*pause, 50*time.Millisecond) {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(pause)
	}
	return true
}

// waitFor waits until cond holds (see waitUntil), and fails the test,
// saying what it waited for, if it still does not after waitDeadline.
func waitFor(tb testing.TB, what string, cond func() bool) {
	tb.Helper()
	if !waitUntil(cond) {
		tb.Fatalf("%s: not within %v", what, waitDeadline)
	}
}

// newDatabase returns a fresh database's DSN and an admin session on it,
// closed when the test ends. When the test and its own cleanups are done,
// and before the database is dropped, it checks that siphon left nothing
// running there (see checkNothingLeftRunning).
func newDatabase(t *testing.T) (string, *pgx.Conn) {
	t.Helper()
	dsn := siphontest.Start(t).NewDatabase(t)
	t.Cleanup(func() { checkNothingLeftRunning(t, dsn) })
	return dsn, connectOrFail(t, dsn)
}

// twinDatabases makes two fresh databases, a source and a target, each
// with the schema ddl.
func twinDatabases(t *testing.T, ddl ...string) (srcDSN string, src *pgx.Conn, tgtDSN string, tgt *pgx.Conn) {
	t.Helper()
	srcDSN, src = newDatabase(t)
	tgtDSN, tgt = newDatabase(t)
	for _, conn := range []*pgx.Conn{src, tgt} {
		execSQL(t, conn, ddl...)
	}
	return srcDSN, src, tgtDSN, tgt
}

// connectOrFail opens a session on dsn, closed when the test ends.
func connectOrFail(t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), dsn)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// execSQL runs statements on conn, failing the test or benchmark on error.
func execSQL(tb testing.TB, conn *pgx.Conn, statements ...string) {
	tb.Helper()
	for _, s := range statements {
		_, err := conn.Exec(context.Background(), s)
		require.NoError(tb, err, "%s%s", s, explainSQLError(conn, err))
	}
}

// explainSQLError returns what the server said of err beyond its message
// (its detail: for a deadlock, which process waited for which lock) and,
// for the processes and relations a deadlock names, what they are now,
// for the failure's message; "" for no server error.
func explainSQLError(conn *pgx.Conn, err error) string {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Detail == "" {
		return ""
	}
	out := "\n" + pgErr.Detail
	if pgErr.Code != pgerrcode.DeadlockDetected {
		return out
	}
	// A session of its own: conn's transaction may be aborted.
	ctx := context.Background()
	conn, err = pgx.ConnectConfig(ctx, conn.Config().Copy())
	if err != nil {
		return out
	}
	defer conn.Close(ctx)
	for _, m := range regexp.MustCompile(`relation (\d+) of database`).FindAllStringSubmatch(pgErr.Detail, -1) {
		var name string
		if conn.QueryRow(ctx, "SELECT $1::oid::regclass::text", m[1]).Scan(&name) == nil {
			out += fmt.Sprintf("\nrelation %s is %s", m[1], name)
		}
	}
	seen := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?i)process (\d+)`).FindAllStringSubmatch(pgErr.Detail, -1) {
		if seen[m[1]] {
			continue
		}
		seen[m[1]] = true
		var app, state, query string
		if conn.QueryRow(ctx, `SELECT application_name, coalesce(state, ''), query FROM pg_stat_activity WHERE pid = $1::int`, m[1]).Scan(&app, &state, &query) == nil {
			out += fmt.Sprintf("\nprocess %s (%s, %s) now runs: %s", m[1], app, state, query)
		}
	}
	return out
}

// waitLocked waits until a session (who, for the failure's message) waits
// for a lock on table, in conn's database.
func waitLocked(t *testing.T, conn *pgx.Conn, who, table string) {
	t.Helper()
	waitFor(t, who+" waits for the lock on "+table, func() bool {
		var waits bool
		require.NoError(t, conn.QueryRow(context.Background(), `SELECT EXISTS (SELECT FROM pg_locks l
			JOIN pg_database d ON d.oid = l.database AND d.datname = current_database()
			WHERE l.locktype = 'relation' AND NOT l.granted AND l.relation = $1::regclass)`, table).Scan(&waits))
		return waits
	})
}

// connect opens a siphon.Conn closed when the test ends (tests that check
// for leaks close it earlier; Close is safe twice).
func connect(t *testing.T, dsn string, opts ...siphon.Option) *siphon.Conn {
	t.Helper()
	c, err := siphon.Connect(context.Background(), dsn, opts...)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c
}

var streamSlotSeq atomic.Int64

// streamSlot returns a slot name unique to the test.
func streamSlot(t *testing.T) string {
	name := regexp.MustCompile(`[^a-z0-9]+`).ReplaceAllString(strings.ToLower(t.Name()), "_")
	if len(name) > 40 {
		name = name[len(name)-40:]
	}
	return fmt.Sprintf("stream_%s_%d", strings.Trim(name, "_"), streamSlotSeq.Add(1))
}

// streamConn connects with a slot unique to the test (and opts), closed when
// the test ends, and returns the slot's name too.
func streamConn(t *testing.T, dsn string, opts ...siphon.Option) (*siphon.Conn, string) {
	t.Helper()
	slot := streamSlot(t)
	opts = append([]siphon.Option{siphon.WithSlot(slot)}, opts...)
	c, err := siphon.Connect(context.Background(), dsn, opts...)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c, slot
}

// streamConnAt is streamConn that also makes sure the publication and the
// slot exist (CurrentPosition), and returns the Position to stream from.
func streamConnAt(t *testing.T, dsn string, opts ...siphon.Option) (*siphon.Conn, string, canonical.Position) {
	t.Helper()
	c, slot := streamConn(t, dsn, opts...)
	start, err := c.CurrentPosition(context.Background())
	require.NoError(t, err)
	return c, slot, start
}

// captureConnAt is streamConnAt on a source where the Conn (a
// superuser's) installed the schema capture for its publication first.
func captureConnAt(t *testing.T, dsn string, opts ...siphon.Option) (*siphon.Conn, string, canonical.Position) {
	t.Helper()
	c, slot := streamConn(t, dsn, opts...)
	require.NoError(t, c.InstallSchemaCapture(context.Background()))
	start, err := c.CurrentPosition(context.Background())
	require.NoError(t, err)
	return c, slot, start
}

// siphonSession opens a session with siphon's fixed session settings, so
// that values print the way canonical values do.
func siphonSession(t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	config, err := pgx.ParseConfig(dsn)
	require.NoError(t, err)
	for k, v := range map[string]string{
		"DateStyle": "ISO, MDY", "TimeZone": "UTC", "IntervalStyle": "postgres",
		"extra_float_digits": "3", "bytea_output": "hex", "lc_monetary": "C",
	} {
		config.RuntimeParams[k] = v
	}
	conn, err := pgx.ConnectConfig(context.Background(), config)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

const markerPrefix = "test.marker"

// emitMarker writes a non-transactional logical message that tells
// streamUntil where to stop.
func emitMarker(t *testing.T, conn *pgx.Conn, marker string) {
	t.Helper()
	execSQL(t, conn, fmt.Sprintf("SELECT pg_logical_emit_message(false, '%s', '%s')", markerPrefix, marker))
}

// writeHeartbeat writes, through conn, a message as siphon's heartbeats
// are (siphon.heartbeat: the slot, the last transaction handled, the
// position it vouches for), with slot, last and at given as SQL
// expressions over from (a FROM clause, or nothing), and returns the
// message's end.
func writeHeartbeat(t *testing.T, conn *pgx.Conn, slot, last, at string, from ...string) canonical.Position {
	t.Helper()
	var end string
	require.NoError(t, conn.QueryRow(context.Background(), `SELECT pg_logical_emit_message(false, 'siphon.heartbeat',
		json_build_object('slot', (`+slot+`)::text, 'last', (`+last+`)::text, 'at', (`+at+`)::text)::text)::text `+
		strings.Join(from, " ")).Scan(&end))
	pos, err := canonical.ParsePosition(end)
	require.NoError(t, err)
	return pos
}

// streamUntil streams from from until the marker message, and returns the
// changes before it (markers left out) and the Position StreamChanges
// returned.
func streamUntil(t *testing.T, c *siphon.Conn, from canonical.Position, marker string) ([]canonical.Change, canonical.Position) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitDeadline)
	defer cancel()
	var got []canonical.Change
	seen := false
	pos, err := c.StreamChanges(ctx, from, func(ch canonical.Change) error {
		if ch.Op == canonical.OpMessage && ch.Message.Prefix == markerPrefix {
			if string(ch.Message.Content) == marker {
				seen = true
				cancel()
			}
			return nil
		}
		got = append(got, ch)
		return nil
	})
	require.NoError(t, err)
	require.True(t, seen, "marker %q not reached in time", marker)
	return got, pos
}

// digest returns an order-independent fingerprint of a table's rows.
func digest(t *testing.T, conn *pgx.Conn, table string) string {
	t.Helper()
	var d *string
	var n int
	require.NoError(t, conn.QueryRow(context.Background(),
		"SELECT md5(string_agg(r::text, '|' ORDER BY r::text)), count(*) FROM "+table+" r").Scan(&d, &n))
	if d == nil {
		return "empty"
	}
	return fmt.Sprintf("%d rows %s", n, *d)
}

// rawRows returns a query's rows as the text the type output functions
// print (NULL as nil), under siphon's session settings: canonical values.
func rawRows(t *testing.T, conn *pgx.Conn, query string) [][]*string {
	t.Helper()
	rows, err := conn.Query(context.Background(), query, pgx.QueryExecModeSimpleProtocol)
	require.NoError(t, err)
	defer rows.Close()
	var out [][]*string
	for rows.Next() {
		var row []*string
		for _, raw := range rows.RawValues() {
			if raw == nil {
				row = append(row, nil)
			} else {
				s := string(raw)
				row = append(row, &s)
			}
		}
		out = append(out, row)
	}
	require.NoError(t, rows.Err())
	return out
}

// forgetAppliedPosition resets, when the test ends, the position applied
// on dsn from systemID's slot: replication origins are cluster-wide, so one
// left behind outlives the test's database.
func forgetAppliedPosition(t *testing.T, dsn, systemID, slot string) {
	t.Helper()
	t.Cleanup(func() {
		c, err := siphon.Connect(context.Background(), dsn)
		if assert.NoError(t, err) {
			assert.NoError(t, c.ResetAppliedPosition(context.Background(), systemID, slot))
			c.Close()
		}
	})
}

func dbOID(t *testing.T, conn *pgx.Conn) string {
	t.Helper()
	var oid string
	require.NoError(t, conn.QueryRow(context.Background(), "SELECT oid::text FROM pg_database WHERE datname = current_database()").Scan(&oid))
	return oid
}

// count returns the result of a count(*) query.
func count(t *testing.T, conn *pgx.Conn, query string) int {
	t.Helper()
	var n int
	require.NoError(t, conn.QueryRow(context.Background(), query).Scan(&n))
	return n
}

// systemIdentifier reads the server's system identifier.
func systemIdentifier(t *testing.T, conn *pgx.Conn) string {
	t.Helper()
	var id string
	require.NoError(t, conn.QueryRow(context.Background(), "SELECT system_identifier::text FROM pg_control_system()").Scan(&id))
	return id
}

// originProgress reads the target's replication origin (zero when it does
// not exist yet).
func originProgress(t *testing.T, tgtConn *pgx.Conn, origin string) canonical.Position {
	t.Helper()
	var progress *string
	err := tgtConn.QueryRow(context.Background(), `SELECT pg_replication_origin_progress($1, false)::text
		WHERE pg_replication_origin_oid($1) IS NOT NULL`, origin).Scan(&progress)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0
	}
	require.NoError(t, err)
	if progress == nil {
		return 0
	}
	pos, err := canonical.ParsePosition(*progress)
	require.NoError(t, err)
	return pos
}

// userTables lists the tables and materialized views of a database, as
// regclass text, siphon's own left out.
func userTables(t *testing.T, conn *pgx.Conn) []string {
	t.Helper()
	rows, err := conn.Query(context.Background(), `SELECT c.oid::regclass::text FROM pg_class c
		JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE c.relkind IN ('r', 'p', 'm') AND n.nspname NOT IN ('pg_catalog', 'information_schema', 'siphon')
		  AND n.nspname NOT LIKE 'pg\_toast%' ORDER BY 1`)
	require.NoError(t, err)
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return names
}

// envInt returns the positive integer the environment variable name holds,
// or def when it is unset; another value fails the benchmark. Every
// benchmark sizes its data set through it.
func envInt(tb testing.TB, name string, def int) int {
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	require.NoError(tb, err, name)
	require.Positive(tb, n, name)
	return n
}

// loginRole makes a login role with attributes (such as "REPLICATION"),
// named prefix and numbered by roleSeq (roles belong to the cluster), and
// returns it and a DSN of dsn's database for it. When the test ends, what
// admin's database holds of it goes (DROP OWNED), then the role.
func loginRole(t *testing.T, dsn string, admin *pgx.Conn, prefix, attributes string) (role, roleDSN string) {
	t.Helper()
	role = fmt.Sprintf("%s_%d_%d", prefix, os.Getpid(), roleSeq.Add(1))
	execSQL(t, admin, "CREATE ROLE "+role+" LOGIN "+attributes+" PASSWORD 'role-pw-1234'")
	t.Cleanup(func() {
		_, err := admin.Exec(context.Background(), "DROP OWNED BY "+role)
		assert.NoError(t, err)
		_, err = admin.Exec(context.Background(), "DROP ROLE "+role)
		assert.NoError(t, err)
	})
	return role, strings.Replace(dsn, "postgres@", role+":role-pw-1234@", 1)
}

// lockedBuffer is a bytes.Buffer that goroutines may write at once.
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

// shortDatabaseTimeouts gives every new session of conn's database timeouts
// of 500 ms (ALTER DATABASE ... SET): statement_timeout, lock_timeout,
// idle_in_transaction_session_timeout, and transaction_timeout from
// PostgreSQL 17 on. What siphon keeps open longer must turn them off.
func shortDatabaseTimeouts(t *testing.T, conn *pgx.Conn) {
	t.Helper()
	var db string
	require.NoError(t, conn.QueryRow(context.Background(), "SELECT current_database()").Scan(&db))
	timeouts := []string{"statement_timeout", "lock_timeout", "idle_in_transaction_session_timeout"}
	if serverRelease(t) >= 17 {
		timeouts = append(timeouts, "transaction_timeout")
	}
	for _, name := range timeouts {
		execSQL(t, conn, fmt.Sprintf("ALTER DATABASE %s SET %s = '500ms'", pgx.Identifier{db}.Sanitize(), name))
	}
}
