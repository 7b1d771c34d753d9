package repository_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gocloud.dev/blob"

	"github.com/siphondb/siphon/repository"
	"github.com/siphondb/siphon/siphontest"
)

// makeChain starts a chain on src and adds incrementals links with writes
// between them.
func makeChain(t testing.TB, repo *repository.Repository, src *source, incrementals int) *repository.Chain {
	t.Helper()
	ctx := context.Background()
	chain, err := repo.StartChain(ctx, src.c, repository.StartChainOptions{})
	require.NoError(t, err)
	src.remember(chain)
	for i := range incrementals {
		src.exec(t, `INSERT INTO events (account, note) SELECT 1 + g % 200, 'batch ' || $1::int FROM generate_series(1, 50) g`, i)
		src.exec(t, `UPDATE accounts SET balance = balance + 1 WHERE id % 5 = $1`, i%5)
		chain, err = repo.AddLink(ctx, src.c, chain.ID)
		require.NoError(t, err)
	}
	return chain
}

// tampering is one way to change a repository's objects.
type tampering struct {
	name string
	// do changes the bucket and returns the object the refusal must name.
	do func(t *testing.T, b *blob.Bucket, c, other *repository.Chain) string
}

var tamperings = []tampering{
	{"a flipped byte in an incremental", func(t *testing.T, b *blob.Bucket, c, _ *repository.Chain) string {
		flipByte(t, b, c.Links[1].Object, 0.5)
		return c.Links[1].Object
	}},
	{"a flipped byte in the base backup", func(t *testing.T, b *blob.Bucket, c, _ *repository.Chain) string {
		flipByte(t, b, c.Links[0].Object, 0.7)
		return c.Links[0].Object
	}},
	{"incrementals 2 and 3 swapped", func(t *testing.T, b *blob.Bucket, c, _ *repository.Chain) string {
		l2, l3 := read(t, b, c.Links[1].Object), read(t, b, c.Links[2].Object)
		write(t, b, c.Links[1].Object, l3)
		write(t, b, c.Links[2].Object, l2)
		return c.Links[1].Object
	}},
	{"an incremental replaced by another chain's", func(t *testing.T, b *blob.Bucket, c, other *repository.Chain) string {
		write(t, b, c.Links[1].Object, read(t, b, other.Links[1].Object))
		return c.Links[1].Object
	}},
	{"an incremental cut short", func(t *testing.T, b *blob.Bucket, c, _ *repository.Chain) string {
		data := read(t, b, c.Links[2].Object)
		write(t, b, c.Links[2].Object, data[:len(data)-20])
		return c.Links[2].Object
	}},
	{"an incremental deleted", func(t *testing.T, b *blob.Bucket, c, _ *repository.Chain) string {
		require.NoError(t, b.Delete(context.Background(), c.Links[2].Object))
		return c.Links[2].Object
	}},
}

// TestTamperedObjectsAreRefused changes a chain's objects in the bucket in
// each of the ways above, in an encrypted repository on a directory and
// on an S3 server and in an unencrypted one: each restore is refused with
// an *IntegrityError naming the object, before anything is applied (the
// target stays empty), and the chain restores again once the object is put
// back.
func TestTamperedObjectsAreRefused(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name    string
		backend backend
		keyed   bool
	}{
		{"file encrypted", backends[0], true},
		{"s3 encrypted", backends[1], true},
		{"file unencrypted", backends[0], false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			siphontest.Start(t).SkipUnlessDumpClients(t)
			ctx := context.Background()
			u := tc.backend.url(t)
			var opts []repository.Option
			if tc.keyed {
				opts = append(opts, repository.WithKey(newKey(t)))
			}
			repo := openRepo(t, u, opts...)
			bucket := openBucket(t, u)
			src := newSource(t, streamKey(repo)...)
			other := makeChain(t, repo, src, 1)
			chain := makeChain(t, repo, src, 3)

			for _, tamper := range tamperings {
				saved := map[string][]byte{}
				for _, l := range chain.Links {
					saved[l.Object] = read(t, bucket, l.Object)
				}
				object := tamper.do(t, bucket, chain, other)

				tgt := connectTarget(t, streamKey(repo)...)
				_, err := repo.Restore(ctx, tgt.c, repository.RestoreOptions{Chain: chain.ID})
				var integrity *repository.IntegrityError
				if assert.True(t, errors.As(err, &integrity), "%s: %v", tamper.name, err) {
					assert.Equal(t, object, integrity.Object, tamper.name)
				}
				assert.Empty(t, readState(t, tgt.dsn).Rows, "%s: nothing was restored", tamper.name)

				rep, err := repo.Verify(ctx, chain.ID, repository.VerifyOptions{ReadOnly: true})
				require.NoError(t, err, tamper.name)
				assert.False(t, rep.OK, tamper.name)
				if assert.NotEmpty(t, rep.Problems, tamper.name) {
					assert.Contains(t, rep.Problems[0], object, tamper.name)
				}

				for name, data := range saved {
					write(t, bucket, name, data)
				}
			}
			rep, err := repo.Verify(ctx, chain.ID, repository.VerifyOptions{ReadOnly: true})
			require.NoError(t, err)
			assert.True(t, rep.OK, "put back, the chain verifies: %v", rep.Problems)
		})
	}
}

// TestTamperedManifestIsRefused changes a byte of a chain's manifest: the
// chain is listed with an *IntegrityError naming the manifest, and a
// restore of the newest chain is refused rather than falling back to an
// older one.
func TestTamperedManifestIsRefused(t *testing.T) {
	t.Parallel()
	siphontest.Start(t).SkipUnlessDumpClients(t)
	ctx := context.Background()
	for _, keyed := range []bool{true, false} {
		u := fileBucket(t)
		var opts []repository.Option
		if keyed {
			opts = append(opts, repository.WithKey(newKey(t)))
		}
		repo := openRepo(t, u, opts...)
		bucket := openBucket(t, u)
		src := newSource(t, streamKey(repo)...)
		makeChain(t, repo, src, 0)
		chain := makeChain(t, repo, src, 1)
		objs, err := bucket.List(&blob.ListOptions{Prefix: "chains/" + chain.ID + "/manifest-0002"}).Next(ctx)
		require.NoError(t, err)
		flipByte(t, bucket, objs.Key, 0.6)

		chains, err := repo.Chains(ctx)
		require.NoError(t, err)
		require.Len(t, chains, 2)
		var integrity *repository.IntegrityError
		require.True(t, errors.As(chains[1].Err, &integrity), "keyed %v: %v", keyed, chains[1].Err)
		assert.Equal(t, objs.Key, integrity.Object)

		tgt := connectTarget(t)
		_, err = repo.Restore(ctx, tgt.c, repository.RestoreOptions{})
		require.True(t, errors.As(err, &integrity), "keyed %v: %v", keyed, err)
		assert.Equal(t, objs.Key, integrity.Object)
		assert.Empty(t, readState(t, tgt.dsn).Rows)
	}
}

func read(t *testing.T, b *blob.Bucket, key string) []byte {
	t.Helper()
	data, err := b.ReadAll(context.Background(), key)
	require.NoError(t, err)
	return data
}

func write(t *testing.T, b *blob.Bucket, key string, data []byte) {
	t.Helper()
	require.NoError(t, b.WriteAll(context.Background(), key, data, nil))
}

// flipByte flips one bit of the byte at fraction at of the object.
func flipByte(t *testing.T, b *blob.Bucket, key string, at float64) {
	t.Helper()
	data := read(t, b, key)
	data[int(float64(len(data))*at)] ^= 0x10
	write(t, b, key, data)
}
