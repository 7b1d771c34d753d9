package siphon_test

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/siphondb/siphon"
	"github.com/siphondb/siphon/canonical"
)

func flip(data []byte, at int64) []byte {
	bad := bytes.Clone(data)
	bad[at] ^= 0x01
	return bad
}

// untouched asserts that a database holds nothing but what CREATE DATABASE
// made.
func untouched(t *testing.T, conn *pgx.Conn) {
	t.Helper()
	assert.Empty(t, userTables(t, conn))
	assert.Empty(t, fingerprint(t, conn))
	var schemas int
	require.NoError(t, conn.QueryRow(context.Background(),
		`SELECT count(*) FROM pg_namespace WHERE nspname NOT LIKE 'pg\_%' AND nspname NOT IN ('public', 'information_schema')`).Scan(&schemas))
	assert.Zero(t, schemas)
}

func TestVerifyAndRestoreRefuseBadStreams(t *testing.T) {
	t.Parallel()
	skipUnlessDumpClients(t)
	dsn, src := newDatabase(t)
	execSQL(t, src, `CREATE TYPE mood AS ENUM ('ok')`, `CREATE SCHEMA s`,
		`CREATE TABLE s.t AS SELECT g AS id, md5(g::text) || md5((-g)::text) AS body FROM generate_series(1, 8000) g`)
	c, _ := backupConn(t, dsn)
	data := backup(t, c, siphon.BackupOptions{Compression: "none"})
	er := canonical.NewEnvelopeReader(bytes.NewReader(data))
	_, err := er.Header()
	require.NoError(t, err)
	body := er.BodyOffset()
	const chunk = 4 + 256<<10 + 4 // a whole chunk with its length and CRC
	require.Greater(t, int64(len(data)), body+2*chunk, "the body spans several chunks")
	created := int64(bytes.Index(data, []byte(`"created":"`)) + len(`"created":"`) + 3) // a digit of the year

	cases := []struct {
		name     string
		data     []byte
		sentinel error
		says     string
	}{
		{"byte flipped in the second chunk", flip(data, body+chunk+4+1000), canonical.ErrEnvelopeCorrupt,
			fmt.Sprintf("byte %d: the chunk of 262144 bytes here (body bytes 262144 to 524287) fails its CRC-32C check", body+chunk)},
		{"byte flipped in the header", flip(data, created), canonical.ErrEnvelopeCorrupt, "the header changed since it was written"},
		{"byte flipped in the trailer", flip(data, int64(len(data))-30), canonical.ErrEnvelopeCorrupt, "the trailer line fails its CRC-32C check"},
		{"cut in the body", data[:body+chunk+100], canonical.ErrEnvelopeTruncated,
			fmt.Sprintf("byte %d: the stream ends where the rest of the 262144-byte chunk that starts at byte %d was expected", body+chunk+100, body+chunk)},
		{"cut before the last byte", data[:len(data)-1], canonical.ErrEnvelopeTruncated, "the trailer line was expected"},
		{"garbage", garbage(5000), canonical.ErrNotEnvelope, "byte 0: the stream starts with"},
		{"bare pg_dump archive", append([]byte("PGDMP"), garbage(100)...), canonical.ErrNotEnvelope, "bare pg_dump archive"},
		{"another format version", append([]byte("siphon-envelope/7"), data[len("siphon-envelope/1"):]...),
			canonical.ErrUnsupportedVersion, "envelope format version 7; this siphon reads version 1"},
	}
	dstDSN, dst := newDatabase(t)
	target, _ := backupConn(t, dstDSN)
	tmp := t.TempDir()
	for _, tc := range cases {
		rep, err := c.Verify(context.Background(), bytes.NewReader(tc.data))
		require.NoError(t, err, "%s: a bad stream is a report, not an error", tc.name)
		assert.False(t, rep.OK, tc.name)
		if assert.Len(t, rep.Problems, 1, tc.name) {
			assert.Contains(t, rep.Problems[0], tc.says, tc.name)
		}

		err = target.Restore(context.Background(), siphon.RestoreOptions{TempDir: tmp}, bytes.NewReader(tc.data))
		require.ErrorIs(t, err, tc.sentinel, tc.name)
		var envErr *canonical.EnvelopeError
		assert.ErrorAs(t, err, &envErr, tc.name)
		assert.Contains(t, err.Error(), "nothing was restored", tc.name)
		untouched(t, dst)
		assertEmptyDir(t, tmp)
	}
}

func garbage(n int) []byte {
	r := rand.New(rand.NewPCG(uint64(n), 1))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// childProcesses returns the pids of this test binary's children named
// name whose environment holds marker.
func childProcesses(name, marker string) []int {
	var pids []int
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, path := range stats {
		data, err := os.ReadFile(path)
		open, closing := bytes.IndexByte(data, '('), bytes.LastIndexByte(data, ')')
		if err != nil || open < 0 || closing < open || string(data[open+1:closing]) != name {
			continue
		}
		fields := strings.Fields(string(data[closing+1:]))
		pid, _ := strconv.Atoi(strings.TrimSpace(string(data[:open])))
		environ, _ := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
		if len(fields) > 1 && fields[1] == strconv.Itoa(os.Getpid()) && bytes.Contains(environ, []byte(marker)) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// withParam adds a parameter to a URL DSN.
func withParam(t *testing.T, dsn, key, value string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	require.NoError(t, err)
	q := u.Query()
	q.Set(key, value)
	u.RawQuery = q.Encode()
	return u.String()
}

// blockAfterHeader lets the envelope's header through, then blocks until
// ctx ends, so pg_dump stays blocked on a full pipe.
type blockAfterHeader struct {
	ctx     context.Context
	writes  int
	blocked chan struct{}
	release chan struct{}
}

func (b *blockAfterHeader) Write(p []byte) (int, error) {
	b.writes++
	if b.writes == 2 {
		close(b.blocked)
		select {
		case <-b.ctx.Done():
			return 0, b.ctx.Err()
		case <-b.release:
		}
	}
	return len(p), nil
}

func TestBackupCancelLeavesNothing(t *testing.T) {
	t.Parallel()
	skipUnlessDumpClients(t)
	for _, jobs := range []int{0, 2} {
		t.Run(fmt.Sprintf("jobs=%d", jobs), func(t *testing.T) {
			t.Parallel()
			dsn, src := newDatabase(t)
			execSQL(t, src, `CREATE TABLE big AS SELECT g AS id, md5(g::text) || md5((-g)::text) AS body FROM generate_series(1, 300000) g`,
				`CREATE TABLE big2 AS SELECT * FROM big`)
			marker := fmt.Sprintf("cancel_%d_%d", jobs, time.Now().UnixNano())
			c, slot := backupConn(t, withParam(t, dsn, "application_name", marker))
			tmp := t.TempDir()

			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			w := &blockAfterHeader{ctx: ctx, blocked: make(chan struct{}), release: make(chan struct{})}
			done := make(chan error, 1)
			go func() { done <- c.Backup(ctx, siphon.BackupOptions{Jobs: jobs, TempDir: tmp}, w) }()
			waitFor(t, "pg_dump never started", func() bool { return len(childProcesses("pg_dump", marker)) > 0 })
			cancel()
			select {
			case err := <-done:
				require.ErrorIs(t, err, context.Canceled)
			case <-time.After(waitDeadline):
				t.Fatal("Backup did not return after cancel")
			}
			assert.Empty(t, childProcesses("pg_dump", marker), "no pg_dump process left")
			assertEmptyDir(t, tmp)
			require.NoError(t, c.Close())
			assertNoLeaks(t, dsn, slot)
		})
	}
}

func TestBackupPasswordNeverInArgv(t *testing.T) {
	t.Parallel()
	skipUnlessDumpClients(t)
	dsn, admin := newDatabase(t)
	const password = "Backup-pw-73125"
	role := fmt.Sprintf("backup_role_%d", time.Now().UnixNano())
	execSQL(t, admin, fmt.Sprintf("CREATE ROLE %s LOGIN REPLICATION PASSWORD '%s'", role, password),
		`CREATE TABLE t AS SELECT g AS id, md5(g::text) || md5((-g)::text) AS body FROM generate_series(1, 50000) g`,
		"ALTER TABLE t OWNER TO "+role, "GRANT CREATE ON DATABASE "+pgx.Identifier{admin.Config().Database}.Sanitize()+" TO "+role)
	t.Cleanup(func() {
		admin.Exec(context.Background(), "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1", role)
		admin.Exec(context.Background(), "DROP OWNED BY "+role+"; DROP ROLE "+role)
	})
	u, err := url.Parse(dsn)
	require.NoError(t, err)
	u.User = url.UserPassword(role, password)
	c, _ := backupConn(t, u.String(), siphon.WithTables("t"))
	tmp := t.TempDir()

	w := &blockAfterHeader{ctx: context.Background(), blocked: make(chan struct{}), release: make(chan struct{})}
	var out bytes.Buffer
	done := make(chan error, 1)
	go func() {
		done <- c.Backup(context.Background(), siphon.BackupOptions{TempDir: tmp}, &teeWriter{w, &out})
	}()
	select {
	case <-w.blocked:
	case err := <-done:
		t.Fatalf("Backup ended early: %v", err)
	}
	pids := childProcesses("pg_dump", "PGUSER="+role)
	require.Len(t, pids, 1)
	entries, err := os.ReadDir(tmp)
	require.NoError(t, err)
	assert.Empty(t, entries, "the password file has no name while pg_dump runs: it reads it from an inherited descriptor")
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pids[0]))
	require.NoError(t, err)
	assert.Contains(t, string(cmdline), "--snapshot=")
	assert.NotContains(t, string(cmdline), password)
	environ, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pids[0]))
	require.NoError(t, err)
	assert.NotContains(t, string(environ), password)
	assert.Contains(t, string(environ), "PGUSER="+role)
	close(w.release)
	require.NoError(t, <-done, "pg_dump authenticated with the password file")
	assertEmptyDir(t, tmp)

	rep, err := c.Verify(context.Background(), bytes.NewReader(out.Bytes()))
	require.NoError(t, err)
	assert.True(t, rep.OK, "%v", rep.Problems)
}

// teeWriter writes to a gate, then to a buffer.
type teeWriter struct {
	gate *blockAfterHeader
	out  *bytes.Buffer
}

func (w *teeWriter) Write(p []byte) (int, error) {
	if _, err := w.gate.Write(p); err != nil {
		return 0, err
	}
	return w.out.Write(p)
}

// incremental writes a JSONL incremental (optionally in an envelope) with
// the given source and positions, holding no change.
func incremental(t *testing.T, systemID string, timeline uint32, start, end canonical.Position, previous string) []byte {
	t.Helper()
	var out bytes.Buffer
	var w interface {
		Write([]byte) (int, error)
	} = &out
	var ew *canonical.EnvelopeWriter
	if previous != "-" {
		var err error
		ew, err = canonical.NewEnvelopeWriter(&out, canonical.EnvelopeHeader{Kind: canonical.KindIncremental, Body: canonical.BodyJSONL,
			Engine: canonical.EnginePostgres, SystemID: systemID, Timeline: timeline, Start: start, Previous: previous})
		require.NoError(t, err)
		w = ew
	}
	enc := canonical.NewEncoder(w)
	require.NoError(t, enc.WriteHeader(canonical.Header{Kind: canonical.KindIncremental, Engine: canonical.EnginePostgres,
		SystemID: systemID, Timeline: timeline, Start: start}))
	require.NoError(t, enc.WriteEnd(end))
	require.NoError(t, enc.Flush())
	if ew != nil {
		ew.SetEnd(end)
		require.NoError(t, ew.Close())
	}
	return out.Bytes()
}

func TestVerifyChainChecksContiguity(t *testing.T) {
	t.Parallel()
	skipUnlessDumpClients(t)
	dsn, src := newDatabase(t)
	execSQL(t, src, `CREATE TABLE t AS SELECT 1 AS x`)
	c, _ := backupConn(t, dsn)
	base := backup(t, c, siphon.BackupOptions{})
	rep, err := c.Verify(context.Background(), bytes.NewReader(base))
	require.NoError(t, err)
	require.True(t, rep.OK)
	sys, tl, p := rep.SystemID, rep.Timeline, rep.Start
	verify := func(links ...[]byte) *siphon.ChainReport {
		chain, err := c.VerifyChain(context.Background(), readers(links...)...)
		require.NoError(t, err)
		return chain
	}

	second := incremental(t, sys, tl, p, p+100, rep.Link)
	third := incremental(t, sys, tl, p+100, p+250, "-") // bare JSONL, as BackupIncremental writes
	chain := verify(base, second, third)
	assert.True(t, chain.OK, "%v", chain.Problems)
	assert.Equal(t, p, chain.Start)
	assert.Equal(t, p+250, chain.End)
	require.Len(t, chain.Links, 3)
	assert.False(t, chain.Links[2].Enveloped)

	chain = verify(base, third)
	assert.False(t, chain.OK)
	assert.Equal(t, []string{fmt.Sprintf("link 2: starts at %v, but link 1 ends at %v: a gap, the changes between them are missing", p+100, p)}, chain.Problems)

	chain = verify(base, second, incremental(t, sys, tl, p+50, p+300, "-"))
	assert.Equal(t, []string{fmt.Sprintf("link 3: starts at %v, but link 2 ends at %v: an overlap, the changes between them would be applied twice", p+50, p+100)}, chain.Problems)

	chain = verify(base, incremental(t, "42", tl, p, p+1, "-"))
	assert.Equal(t, []string{fmt.Sprintf("link 2: comes from system %q, link 1 from system %q: they are different clusters", "42", sys)}, chain.Problems)

	chain = verify(base, incremental(t, sys, tl, p, p+1, strings.Repeat("ab", 32)))
	require.Len(t, chain.Problems, 1)
	assert.Contains(t, chain.Problems[0], "link 2: names abab")

	chain = verify(base, base)
	assert.Contains(t, chain.Problems, "link 2: is a dump: only incrementals continue a chain")

	cut := second[:len(second)-5]
	chain = verify(base, cut)
	require.Len(t, chain.Problems, 1)
	assert.Contains(t, chain.Problems[0], fmt.Sprintf("link 2: canonical: envelope, byte %d: the stream ends", len(cut)))
}
