package repository_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/siphondb/siphon"
	"github.com/siphondb/siphon/repository"
	"github.com/siphondb/siphon/siphontest"
)

// TestKeyRotation writes a chain with a key, rotates to a new key (the old
// one given as previous) and writes the next chain with it: both chains
// list, verify and restore (schema changes included) with the new key and
// the old one, and a repository given only the new key refuses the old
// chain's objects, naming them.
func TestKeyRotation(t *testing.T) {
	t.Parallel()
	siphontest.Start(t).SkipUnlessDumpClients(t)
	ctx := context.Background()
	u := fileBucket(t)
	oldKey, newKey := newKey(t), newKey(t)

	before := openRepo(t, u, repository.WithKey(oldKey))
	src := newSource(t, before.StreamKey())
	require.NoError(t, src.c.InstallSchemaCapture(ctx))
	first := makeChain(t, before, src, 1)
	src.exec(t, `ALTER TABLE accounts ADD COLUMN flag bool`)
	first, err := before.AddLink(ctx, src.c, first.ID)
	require.NoError(t, err)
	atFirst := readState(t, src.dsn)

	after := openRepo(t, u, repository.WithKey(newKey, oldKey))
	_, err = after.AddLink(ctx, src.c, first.ID)
	var mismatch *repository.MismatchError
	require.True(t, errors.As(err, &mismatch), "a Conn with the old stream key: %v", err)
	assert.Equal(t, "stream key", mismatch.What)

	rotated, err := siphon.Connect(ctx, src.dsn, siphon.WithSlot(src.slot), siphon.WithPublication(src.slot), after.StreamKey(), siphon.WithLogger(quiet))
	require.NoError(t, err)
	defer rotated.Close()
	second, err := after.StartChain(ctx, rotated, repository.StartChainOptions{})
	require.NoError(t, err)
	src.remember(second)
	src.exec(t, `ALTER TABLE accounts ADD COLUMN note text; UPDATE accounts SET note = 'n' WHERE id < 5`)
	second, err = after.AddLink(ctx, rotated, second.ID)
	require.NoError(t, err)
	assert.NotEqual(t, first.KeyID, second.KeyID, "the new chain is written with the new key")

	reports, err := after.VerifyAll(ctx, repository.VerifyOptions{ReadOnly: true})
	require.NoError(t, err)
	require.Len(t, reports, 2)
	for _, r := range reports {
		assert.True(t, r.OK, "%s: %v", r.Chain, r.Problems)
	}
	tgt := connectTarget(t, after.StreamKey())
	_, err = after.Restore(ctx, tgt.c, repository.RestoreOptions{Chain: first.ID})
	require.NoError(t, err)
	assert.Equal(t, atFirst, readState(t, tgt.dsn), "the old chain restores with the rotated keys, its schema change included")
	tgt = connectTarget(t, after.StreamKey())
	_, err = after.Restore(ctx, tgt.c, repository.RestoreOptions{})
	require.NoError(t, err)
	assert.Equal(t, readState(t, src.dsn), readState(t, tgt.dsn))

	onlyNew := openRepo(t, u, repository.WithKey(newKey))
	chains, err := onlyNew.Chains(ctx)
	require.NoError(t, err)
	require.Len(t, chains, 2)
	var integrity *repository.IntegrityError
	require.True(t, errors.As(chains[0].Err, &integrity), "%v", chains[0].Err)
	assert.Contains(t, integrity.Problem, "not one of this repository's keys")
	assert.NoError(t, chains[1].Err)

	plain := openRepo(t, u)
	_, err = plain.Chains(ctx)
	require.NoError(t, err)
	tgt = connectTarget(t)
	_, err = plain.Restore(ctx, tgt.c, repository.RestoreOptions{})
	assert.ErrorIs(t, err, repository.ErrNeedsKey, "a repository opened without the key says it needs one")
}
