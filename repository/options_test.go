package repository_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gocloud.dev/blob/memblob"

	"github.com/siphondb/siphon"
	"github.com/siphondb/siphon/repository"
	"github.com/siphondb/siphon/siphontest"
)

// TestBadOptionsAreRefusedBeforeAnything checks that every bad option
// and argument is an *OptionError (or ErrNilArgument) saying the fix,
// before anything is opened or written.
func TestBadOptionsAreRefusedBeforeAnything(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for name, opts := range map[string][]repository.Option{
		"WithKey":              {repository.WithKey(make([]byte, 16))},
		"WithKey previous":     {repository.WithKey(make([]byte, 32), []byte("short"))},
		"WithCompressionLevel": {repository.WithCompressionLevel(23)},
		"WithMeterProvider":    {repository.WithMeterProvider(nil)},
		"WithLogger":           {repository.WithLogger(nil)},
		"nil Option":           {nil},
	} {
		_, err := repository.Open(ctx, "no-such-scheme://x", opts...)
		var option *repository.OptionError
		require.True(t, errors.As(err, &option), "%s: %v", name, err)
		assert.NotEmpty(t, option.Fix, name)
	}
	_, err := repository.New(nil)
	assert.ErrorIs(t, err, repository.ErrNilArgument)

	b := memblob.OpenBucket(nil)
	defer b.Close()
	repo, err := repository.New(b)
	require.NoError(t, err)
	_, err = repo.StartChain(ctx, nil, repository.StartChainOptions{})
	assert.ErrorIs(t, err, repository.ErrNilArgument)
	_, err = repo.Restore(ctx, nil, repository.RestoreOptions{})
	assert.ErrorIs(t, err, repository.ErrNilArgument)
	_, err = repo.AddLink(ctx, nil, "")
	assert.ErrorIs(t, err, repository.ErrNilArgument)
	_, err = repo.Chain(ctx, "../../etc")
	assert.ErrorIs(t, err, repository.ErrNoChain)
	chains, err := repo.Chains(ctx)
	require.NoError(t, err)
	assert.Empty(t, chains)
	require.NoError(t, repo.Close())
	_, err = repo.Chains(ctx)
	assert.ErrorIs(t, err, repository.ErrClosed)
	it := b.List(nil)
	_, err = it.Next(ctx)
	assert.Error(t, err, "nothing was written to the bucket")
}

// TestCallOptionsAreRefusedBeforeAnything checks the calls' options on a
// real source: nothing is written to the bucket.
func TestCallOptionsAreRefusedBeforeAnything(t *testing.T) {
	t.Parallel()
	siphontest.Start(t).SkipUnlessDumpClients(t)
	ctx := context.Background()
	b := memblob.OpenBucket(nil)
	defer b.Close()
	repo, err := repository.New(b)
	require.NoError(t, err)
	src := newSource(t)
	var option *repository.OptionError
	_, err = repo.StartChain(ctx, src.c, repository.StartChainOptions{Backup: siphon.BackupOptions{Previous: "x"}})
	assert.True(t, errors.As(err, &option), "%v", err)
	tgt := connectTarget(t)
	_, err = repo.Restore(ctx, tgt.c, repository.RestoreOptions{Restore: siphon.RestoreOptions{Database: "other"}})
	assert.True(t, errors.As(err, &option), "%v", err)
	_, err = repo.Restore(ctx, tgt.c, repository.RestoreOptions{})
	assert.ErrorIs(t, err, repository.ErrNoChain, "an empty repository")
	_, err = repo.AddLink(ctx, src.c, "")
	assert.ErrorIs(t, err, repository.ErrNoChain)
	_, err = b.List(nil).Next(ctx)
	assert.Error(t, err, "nothing was written to the bucket")

	chain, err := repo.StartChain(ctx, src.c, repository.StartChainOptions{})
	require.NoError(t, err)
	src.remember(chain)
	_, err = repo.Restore(ctx, tgt.c, repository.RestoreOptions{Time: chain.Created.Add(-time.Hour)})
	assert.ErrorIs(t, err, repository.ErrNoChain, "no chain was taken before the target")
	assert.Empty(t, readState(t, tgt.dsn).Rows)
}
