package repository_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"
	"github.com/stretchr/testify/require"
	"gocloud.dev/blob"

	"github.com/siphondb/siphon"
	"github.com/siphondb/siphon/canonical"
	"github.com/siphondb/siphon/repository"
	"github.com/siphondb/siphon/siphontest"
)

func TestMain(m *testing.M) {
	if os.Getenv(childMode) != "" {
		os.Exit(runChild())
	}
	siphontest.Main(m, siphontest.CheckLeaks())
}

// backend is a kind of bucket a test runs on.
type backend struct {
	name string
	// url returns the URL of a new, empty bucket, removed when the test
	// ends.
	url func(t testing.TB) string
}

// backends are file:// and a real S3 server (gofakes3, in the test
// process on a loopback port), opened by URL through s3blob.
var backends = []backend{
	{name: "file", url: fileBucket},
	{name: "s3", url: s3Bucket},
}

// fileBucket returns the URL of a new directory bucket.
func fileBucket(t testing.TB) string {
	return "file://" + t.TempDir() + "?no_tmp_dir=true&metadata=skip"
}

// s3Bucket starts an S3 server for the test and returns the URL of a new
// bucket of it.
func s3Bucket(t testing.TB) string {
	mem := s3mem.New()
	require.NoError(t, mem.CreateBucket("backups"))
	srv := httptest.NewServer(gofakes3.New(mem).Server())
	t.Cleanup(srv.Close)
	q := url.Values{}
	q.Set("endpoint", srv.URL)
	q.Set("use_path_style", "true")
	q.Set("disable_https", "true")
	q.Set("region", "us-east-1")
	q.Set("anonymous", "true")
	return "s3://backups?" + q.Encode()
}

// openRepo opens the repository at u for the test, closed at its end.
func openRepo(t testing.TB, u string, opts ...repository.Option) *repository.Repository {
	t.Helper()
	r, err := repository.Open(context.Background(), u, opts...)
	require.NoError(t, err)
	t.Cleanup(func() { r.Close() })
	return r
}

// openBucket opens the bucket at u directly, for tampering.
func openBucket(t testing.TB, u string) *blob.Bucket {
	t.Helper()
	b, err := blob.OpenBucket(context.Background(), u)
	require.NoError(t, err)
	t.Cleanup(func() { b.Close() })
	return b
}

func newKey(t testing.TB) []byte {
	k := make([]byte, 32)
	_, err := rand.Read(k)
	require.NoError(t, err)
	return k
}

// source is a source database with siphon's slot for a test.
type source struct {
	dsn   string
	slot  string
	conn  *pgx.Conn
	c     *siphon.Conn
	mu    sync.Mutex
	bases []string // the base slots of the test's chains
}

var quiet = slog.New(slog.DiscardHandler)

// slotSeq numbers the slots of the tests, which run in parallel.
var slotSeq atomic.Int64

// newSource makes a database with the test's tables, a Conn on it with a
// slot of its own (and opts), and removes the slot, the publication and
// every base slot a chain made on it at the end.
func newSource(t testing.TB, opts ...siphon.Option) *source {
	t.Helper()
	ctx := context.Background()
	dsn := siphontest.Start(t).NewDatabase(t)
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close(context.Background()) })
	_, err = conn.Exec(ctx, `
		CREATE TABLE accounts (id int PRIMARY KEY, owner text NOT NULL, balance numeric(12,2) NOT NULL);
		CREATE TABLE events (id bigserial PRIMARY KEY, account int REFERENCES accounts, note text, at timestamptz DEFAULT now());
		INSERT INTO accounts SELECT g, 'owner ' || g, g * 10 FROM generate_series(1, 200) g;
		INSERT INTO events (account, note) SELECT 1 + g % 200, repeat('n', g % 40) FROM generate_series(1, 500) g`)
	require.NoError(t, err)
	slot := fmt.Sprintf("repo_t%d_%s", slotSeq.Add(1), strings.ToLower(randomWord()))
	c, err := siphon.Connect(ctx, dsn, append([]siphon.Option{siphon.WithSlot(slot), siphon.WithPublication(slot), siphon.WithLogger(quiet)}, opts...)...)
	require.NoError(t, err)
	s := &source{dsn: dsn, slot: slot, conn: conn, c: c}
	t.Cleanup(func() {
		ctx := context.Background()
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, name := range s.bases {
			_ = c.DropSlot(ctx, name)
		}
		_ = c.Detach(ctx)
		c.Close()
	})
	return s
}

// streamKey returns the repository's stream key option, none for a
// repository without a key.
func streamKey(repo *repository.Repository) []siphon.Option {
	if repo.Encrypted() {
		return []siphon.Option{repo.StreamKey()}
	}
	return nil
}

func randomWord() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return fmt.Sprintf("%x", b)
}

// exec runs statements on the source.
func (s *source) exec(t testing.TB, sql string, args ...any) {
	t.Helper()
	_, err := s.conn.Exec(context.Background(), sql, args...)
	require.NoError(t, err)
}

// remember records the base slots of chains, dropped when the test ends.
func (s *source) remember(chains ...*repository.Chain) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range chains {
		if c != nil && c.BaseSlot != "" && !slices.Contains(s.bases, c.BaseSlot) {
			s.bases = append(s.bases, c.BaseSlot)
		}
	}
}

// slotExists reports whether a replication slot exists on the server.
func slotExists(t testing.TB, conn *pgx.Conn, name string) bool {
	t.Helper()
	var n int
	require.NoError(t, conn.QueryRow(context.Background(), `SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1`, name).Scan(&n))
	return n > 0
}

// state is a database's user tables' rows and columns, as text, to
// compare two databases.
type state struct {
	Columns []string
	Rows    map[string][]string
}

// readState reads the state of the public schema of a database.
func readState(t testing.TB, dsn string) state {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT table_name || '.' || column_name || ' ' || data_type || ' ' || is_nullable || ' ' || coalesce(column_default, '')
		FROM information_schema.columns WHERE table_schema = 'public' ORDER BY table_name, ordinal_position`)
	require.NoError(t, err)
	cols, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	rows, err = conn.Query(ctx, `SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY 1`)
	require.NoError(t, err)
	tables, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	st := state{Columns: cols, Rows: map[string][]string{}}
	for _, tbl := range tables {
		rows, err := conn.Query(ctx, fmt.Sprintf(`SELECT t::text FROM public.%s t ORDER BY 1`, pgx.Identifier{tbl}.Sanitize()))
		require.NoError(t, err)
		st.Rows[tbl], err = pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
	}
	return st
}

// serverNow reads the server's clock.
func (s *source) serverNow(t testing.TB) time.Time {
	t.Helper()
	var now time.Time
	require.NoError(t, s.conn.QueryRow(context.Background(), `SELECT clock_timestamp()`).Scan(&now))
	return now
}

// insertPosition reads the server's WAL insert position: every
// transaction committed before ends at or before it.
func (s *source) insertPosition(t testing.TB) canonical.Position {
	t.Helper()
	var lsn string
	require.NoError(t, s.conn.QueryRow(context.Background(), `SELECT pg_current_wal_insert_lsn()::text`).Scan(&lsn))
	pos, err := canonical.ParsePosition(lsn)
	require.NoError(t, err)
	return pos
}
