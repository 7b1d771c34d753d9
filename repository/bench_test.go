package repository_test

import (
	"bytes"
	"context"
	"io"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"gocloud.dev/blob"

	"github.com/siphondb/siphon"
	"github.com/siphondb/siphon/repository"
	"github.com/siphondb/siphon/siphontest"
)

// benchLinks are a real base backup's envelope and a real incremental's
// JSONL, taken once per benchmark binary.
var benchLinks struct {
	once      sync.Once
	dump, inc []byte
}

// benchData takes a base backup and an incremental of a table of
// SIPHON_BENCH_ROWS rows (default 100000) inserted, then updated.
func benchData(b *testing.B) (dump, inc []byte) {
	benchLinks.once.Do(func() {
		siphontest.Start(b).SkipUnlessDumpClients(b)
		ctx := context.Background()
		rows := benchRows(b)
		src := newSource(b)
		src.exec(b, `CREATE TABLE bench (id int PRIMARY KEY, name text, amount numeric, at timestamptz DEFAULT now(), tags text[])`)
		src.exec(b, `INSERT INTO bench SELECT g, md5(g::text), g * 1.5, now(), ARRAY['a', md5((g*3)::text)] FROM generate_series(1, $1) g`, rows)
		var d bytes.Buffer
		require.NoError(b, src.c.Backup(ctx, siphon.BackupOptions{StartChain: true}, &d))
		rep, err := src.c.Verify(ctx, bytes.NewReader(d.Bytes()))
		require.NoError(b, err)
		src.exec(b, `UPDATE bench SET amount = amount + 1, name = md5(name)`)
		var i bytes.Buffer
		_, err = src.c.BackupIncrementalAfter(ctx, rep.ChainLink(), &i)
		require.NoError(b, err)
		benchLinks.dump, benchLinks.inc = d.Bytes(), i.Bytes()
	})
	if benchLinks.dump == nil {
		b.Skip("no benchmark data")
	}
	return benchLinks.dump, benchLinks.inc
}

// benchRows is SIPHON_BENCH_ROWS, 100000 by default.
func benchRows(b *testing.B) int {
	rows := 100000
	if v := os.Getenv("SIPHON_BENCH_ROWS"); v != "" {
		var err error
		rows, err = strconv.Atoi(v)
		require.NoError(b, err)
	}
	return rows
}

// BenchmarkRepository measures the repository's upload and download of a
// real base backup and a real incremental, encrypted (and the incremental
// compressed), against writing and reading the same plaintext bytes to and
// from the same bucket directly, interleaved in one run so that the ratio
// holds on a busy machine. It reports each side's MB/s of plaintext and
// repo/direct (the target: 0.9 or more).
//
//	cd repository && go test -run '^$' -bench BenchmarkRepository -benchtime 5x
func BenchmarkRepository(b *testing.B) {
	dump, inc := benchData(b)
	for _, be := range backends {
		for _, link := range []struct {
			name  string
			dump  bool
			plain []byte
		}{{"dump", true, dump}, {"incremental", false, inc}} {
			b.Run(be.name+"/"+link.name, func(b *testing.B) {
				ctx := context.Background()
				u := be.url(b)
				repo := openRepo(b, u, repository.WithKey(newKey(b)))
				bucket := openBucket(b, u)
				var upDirect, upRepo, downDirect, downRepo time.Duration
				var stored int64
				for i := 0; b.Loop(); i++ {
					key := "direct/" + strconv.Itoa(i)
					began := time.Now()
					w, err := bucket.NewWriter(ctx, key, nil)
					require.NoError(b, err)
					_, err = io.Copy(w, bytes.NewReader(link.plain))
					require.NoError(b, err)
					require.NoError(b, w.Close())
					upDirect += time.Since(began)

					began = time.Now()
					bl, err := repository.UploadLink(ctx, repo, link.dump, bytes.NewReader(link.plain))
					require.NoError(b, err)
					upRepo += time.Since(began)
					stored = bl.StoredBytes()

					began = time.Now()
					r, err := bucket.NewReader(ctx, key, nil)
					require.NoError(b, err)
					n, err := io.Copy(io.Discard, r)
					require.NoError(b, err)
					require.NoError(b, r.Close())
					require.EqualValues(b, len(link.plain), n)
					downDirect += time.Since(began)

					began = time.Now()
					lr := bl.Open(ctx)
					n, err = io.Copy(io.Discard, lr)
					require.NoError(b, err)
					require.NoError(b, lr.Close())
					require.EqualValues(b, len(link.plain), n)
					downRepo += time.Since(began)

					require.NoError(b, bucket.Delete(ctx, key))
					require.NoError(b, bucket.Delete(ctx, bl.Object()))
				}
				mb := float64(len(link.plain)) * float64(b.N) / 1e6
				b.ReportMetric(mb/upDirect.Seconds(), "up-direct-MB/s")
				b.ReportMetric(mb/upRepo.Seconds(), "up-repo-MB/s")
				b.ReportMetric(upDirect.Seconds()/upRepo.Seconds(), "up-repo/direct")
				b.ReportMetric(mb/downDirect.Seconds(), "down-direct-MB/s")
				b.ReportMetric(mb/downRepo.Seconds(), "down-repo-MB/s")
				b.ReportMetric(downDirect.Seconds()/downRepo.Seconds(), "down-repo/direct")
				b.ReportMetric(float64(len(link.plain))/float64(stored), "plain/stored")
			})
		}
	}
}

// BenchmarkRepositoryEndToEnd measures what a user waits for: a base
// backup taken into the repository (StartChain) against the same Backup
// written straight to the same bucket, and a restore of that chain with an
// incremental (Restore) against RestoreChain of the same backups read
// straight from the bucket, interleaved in one run, on a table of
// SIPHON_BENCH_ROWS rows and an incremental that updates a quarter of
// them. It reports each side's seconds and repo/direct throughput (the
// target: 0.9 or more).
//
//	cd repository && go test -run '^$' -bench BenchmarkRepositoryEndToEnd -benchtime 3x
func BenchmarkRepositoryEndToEnd(b *testing.B) {
	siphontest.Start(b).SkipUnlessDumpClients(b)
	for _, be := range backends {
		b.Run(be.name, func(b *testing.B) {
			ctx := context.Background()
			u := be.url(b)
			repo := openRepo(b, u, repository.WithKey(newKey(b)))
			bucket := openBucket(b, u)
			src := newSource(b, repo.StreamKey())
			src.exec(b, `CREATE TABLE bench (id int PRIMARY KEY, name text, amount numeric, at timestamptz DEFAULT now(), tags text[])`)
			src.exec(b, `INSERT INTO bench SELECT g, md5(g::text), g * 1.5, now(), ARRAY['a', md5((g*3)::text)] FROM generate_series(1, $1) g`,
				benchRows(b))
			var upDirect, upRepo, downDirect, downRepo time.Duration
			for i := 0; b.Loop(); i++ {
				began := time.Now()
				w, err := bucket.NewWriter(ctx, "direct/base", nil)
				require.NoError(b, err)
				require.NoError(b, src.c.Backup(ctx, siphon.BackupOptions{StartChain: true, BaseSlot: true}, w))
				require.NoError(b, w.Close())
				upDirect += time.Since(began)
				r, err := bucket.NewReader(ctx, "direct/base", nil)
				require.NoError(b, err)
				rep, err := src.c.Verify(ctx, r)
				r.Close()
				require.NoError(b, err)
				require.NoError(b, src.c.DropSlot(ctx, rep.Base.Slot))

				began = time.Now()
				chain, err := repo.StartChain(ctx, src.c, repository.StartChainOptions{})
				require.NoError(b, err)
				upRepo += time.Since(began)
				src.remember(chain)

				src.exec(b, `UPDATE bench SET amount = amount + 1 WHERE id % 4 = $1`, i%4)
				w, err = bucket.NewWriter(ctx, "direct/incr", nil)
				require.NoError(b, err)
				_, err = src.c.BackupIncrementalAfter(ctx, rep.ChainLink(), w)
				require.NoError(b, err)
				require.NoError(b, w.Close())
				_, err = repo.AddLink(ctx, src.c, chain.ID)
				require.NoError(b, err)

				tgt := connectTarget(b, repo.StreamKey())
				began = time.Now()
				base, incr := &reopening{b: bucket, key: "direct/base"}, &reopening{b: bucket, key: "direct/incr"}
				_, err = tgt.c.RestoreChain(ctx, siphon.RestoreChainOptions{}, base, incr)
				base.close()
				incr.close()
				require.NoError(b, err)
				downDirect += time.Since(began)

				tgt = connectTarget(b, repo.StreamKey())
				began = time.Now()
				_, err = repo.Restore(ctx, tgt.c, repository.RestoreOptions{Chain: chain.ID})
				require.NoError(b, err)
				downRepo += time.Since(began)
				require.NoError(b, src.c.DropSlot(ctx, chain.BaseSlot))
			}
			n := float64(b.N)
			b.ReportMetric(upDirect.Seconds()/n, "backup-direct-s")
			b.ReportMetric(upRepo.Seconds()/n, "backup-repo-s")
			b.ReportMetric(upDirect.Seconds()/upRepo.Seconds(), "backup-repo/direct")
			b.ReportMetric(downDirect.Seconds()/n, "restore-direct-s")
			b.ReportMetric(downRepo.Seconds()/n, "restore-repo-s")
			b.ReportMetric(downDirect.Seconds()/downRepo.Seconds(), "restore-repo/direct")
		})
	}
}

// reopening reads a bucket object as an io.ReadSeeker that seeks back to
// its start by opening it again, as the repository's links do.
type reopening struct {
	b interface {
		NewReader(context.Context, string, *blob.ReaderOptions) (*blob.Reader, error)
	}
	key string
	r   *blob.Reader
	pos int64
}

func (o *reopening) Read(p []byte) (int, error) {
	if o.r == nil {
		r, err := o.b.NewReader(context.Background(), o.key, nil)
		if err != nil {
			return 0, err
		}
		o.r = r
	}
	n, err := o.r.Read(p)
	o.pos += int64(n)
	return n, err
}

func (o *reopening) Seek(off int64, whence int) (int64, error) {
	if whence == io.SeekStart && off == 0 {
		o.close()
		o.pos = 0
	}
	return o.pos, nil
}

func (o *reopening) close() {
	if o.r != nil {
		o.r.Close()
		o.r = nil
	}
}
