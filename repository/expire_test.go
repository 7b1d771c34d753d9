package repository_test

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/siphondb/siphon/repository"
	"github.com/siphondb/siphon/siphontest"
)

// TestExpireKeepsWhatThePolicySays takes three chains and expires them by
// count, then by age: each time the chains the policy keeps stay listed
// and restorable, the others' objects are deleted and their base slots
// dropped on the source, and the newest chain is never expired.
func TestExpireKeepsWhatThePolicySays(t *testing.T) {
	t.Parallel()
	siphontest.Start(t).SkipUnlessDumpClients(t)
	ctx := context.Background()
	u := fileBucket(t)
	repo := openRepo(t, u)
	src := newSource(t)
	c1 := makeChain(t, repo, src, 0)
	c2 := makeChain(t, repo, src, 1)
	c3 := makeChain(t, repo, src, 1)

	for _, bad := range []repository.ExpireOptions{{}, {KeepChains: -1}, {KeepFor: -time.Hour}, {KeepChains: 1, OrphansAfter: -1}} {
		_, err := repo.Expire(ctx, src.c, bad)
		var option *repository.OptionError
		assert.True(t, errors.As(err, &option), "%+v: %v", bad, err)
	}
	_, err := repo.Expire(ctx, nil, repository.ExpireOptions{KeepChains: 1})
	assert.ErrorIs(t, err, repository.ErrNilArgument)

	rep, err := repo.Expire(ctx, src.c, repository.ExpireOptions{KeepChains: 1, DryRun: true})
	require.NoError(t, err)
	assert.Equal(t, []string{c1.ID, c2.ID}, rep.Expired)
	assert.Zero(t, rep.DeletedObjects)
	assert.Len(t, listIDs(t, repo), 3, "a dry run removes nothing")

	rep, err = repo.Expire(ctx, src.c, repository.ExpireOptions{KeepFor: time.Hour})
	require.NoError(t, err)
	assert.Empty(t, rep.Expired, "every chain was written within the hour")

	rep, err = repo.Expire(ctx, src.c, repository.ExpireOptions{KeepChains: 2})
	require.NoError(t, err)
	assert.Equal(t, []string{c1.ID}, rep.Expired)
	assert.Equal(t, []string{c2.ID, c3.ID}, rep.Kept)
	assert.Equal(t, []string{c1.BaseSlot}, rep.DroppedSlots)
	assert.Equal(t, []string{c2.ID, c3.ID}, listIDs(t, repo))
	assert.False(t, slotExists(t, src.conn, c1.BaseSlot), "the expired chain's base slot is dropped")
	assert.True(t, slotExists(t, src.conn, c2.BaseSlot))
	assertNoObjects(t, u, c1.ID)

	rep, err = repo.Expire(ctx, src.c, repository.ExpireOptions{KeepFor: time.Nanosecond})
	require.NoError(t, err)
	assert.Equal(t, []string{c2.ID}, rep.Expired)
	assert.Equal(t, []string{c3.ID}, rep.Kept, "the newest chain is never expired")
	assert.False(t, slotExists(t, src.conn, c2.BaseSlot))
	assert.True(t, slotExists(t, src.conn, c3.BaseSlot))
	assertNoObjects(t, u, c2.ID)

	v, err := repo.Verify(ctx, c3.ID, repository.VerifyOptions{})
	require.NoError(t, err)
	assert.True(t, v.OK, "%v", v.Problems)
	_, err = repo.Chain(ctx, c1.ID)
	assert.ErrorIs(t, err, repository.ErrNoChain)
}

func listIDs(t *testing.T, repo *repository.Repository) []string {
	t.Helper()
	chains, err := repo.Chains(context.Background())
	require.NoError(t, err)
	var ids []string
	for _, c := range chains {
		require.NoError(t, c.Err)
		ids = append(ids, c.ID)
	}
	return ids
}

func assertNoObjects(t *testing.T, u, id string) {
	t.Helper()
	it := openBucket(t, u).List(nil)
	for {
		obj, err := it.Next(context.Background())
		if err != nil {
			require.ErrorIs(t, err, io.EOF)
			return
		}
		assert.False(t, strings.Contains(obj.Key, id), "left: %s", obj.Key)
	}
}
