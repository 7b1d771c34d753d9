package repository_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/siphondb/siphon/repository"
	"github.com/siphondb/siphon/siphontest"
)

// TestRestoreByHand does what the package documentation tells a person to
// do with nothing but the bucket and pg_restore: take the base object of
// the newest chain (decrypted with Decrypt in an encrypted repository) and
// pg_restore it: the database is the source at the base.
func TestRestoreByHand(t *testing.T) {
	t.Parallel()
	siphontest.Start(t).SkipUnlessDumpClients(t)
	pgRestore := findPgRestore(t)
	ctx := context.Background()
	for _, keyed := range []bool{false, true} {
		// The repository under a prefix of the bucket; a person sees the
		// objects' whole keys.
		bucketURL := fileBucket(t)
		u := bucketURL + "&prefix=backups/"
		key := newKey(t)
		var opts []repository.Option
		if keyed {
			opts = append(opts, repository.WithKey(key))
		}
		repo := openRepo(t, u, opts...)
		src := newSource(t, streamKey(repo)...)
		atBase := readState(t, src.dsn)
		chain := makeChain(t, repo, src, 1)

		whole := "backups/" + chain.Links[0].Object
		data := read(t, openBucket(t, bucketURL), whole)
		path := filepath.Join(t.TempDir(), "base.dump")
		out, err := os.Create(path)
		require.NoError(t, err)
		if keyed {
			in, err := os.CreateTemp(t.TempDir(), "enc")
			require.NoError(t, err)
			_, err = in.Write(data)
			require.NoError(t, err)
			_, err = in.Seek(0, 0)
			require.NoError(t, err)
			require.NoError(t, repository.Decrypt(out, in, whole, key))
			in.Close()
		} else {
			_, err = out.Write(data)
			require.NoError(t, err)
		}
		require.NoError(t, out.Close())

		dsn := siphontest.Start(t).NewDatabase(t)
		cmd := exec.CommandContext(ctx, pgRestore, "--exit-on-error", "-d", dsn, path)
		outb, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s", outb)
		assert.Equal(t, atBase, readState(t, dsn), "keyed %v: pg_restore of the base object gives the source at the base", keyed)
	}
}

// findPgRestore finds the newest pg_restore.
func findPgRestore(t *testing.T) string {
	t.Helper()
	found, _ := filepath.Glob("/usr/lib/postgresql/*/bin/pg_restore")
	sort.Strings(found)
	if len(found) > 0 {
		return found[len(found)-1]
	}
	path, err := exec.LookPath("pg_restore")
	if err != nil {
		t.Skip("no pg_restore")
	}
	return path
}
