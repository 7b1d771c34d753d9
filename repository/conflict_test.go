package repository_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/siphondb/siphon/repository"
	"github.com/siphondb/siphon/siphontest"
)

// TestTwoWritersOnOneChain makes a second writer add a link to a chain
// while the first is about to write its manifest, on a directory and on
// an S3 server: the first gets a *ConflictError naming the second, its
// link is not added (its object deleted), and the chain holds the second
// writer's link and verifies.
func TestTwoWritersOnOneChain(t *testing.T) {
	t.Parallel()
	for _, be := range backends {
		t.Run(be.name, func(t *testing.T) {
			t.Parallel()
			siphontest.Start(t).SkipUnlessDumpClients(t)
			ctx := context.Background()
			u := be.url(t)
			key := newKey(t)
			first := openRepo(t, u, repository.WithKey(key))
			second := openRepo(t, u, repository.WithKey(key))
			src := newSource(t, first.StreamKey())
			chain := makeChain(t, first, src, 0)
			src.exec(t, `UPDATE accounts SET balance = 1 WHERE id = 1`)

			var won *repository.Chain
			repository.SetBeforeManifest(first, func(id string, gen int) {
				if gen != 2 || won != nil {
					return
				}
				var err error
				won, err = second.AddLink(ctx, src.c, id)
				require.NoError(t, err)
			})
			_, err := first.AddLink(ctx, src.c, chain.ID)
			var conflict *repository.ConflictError
			require.True(t, errors.As(err, &conflict), "%v", err)
			assert.Equal(t, chain.ID, conflict.Chain)
			assert.Equal(t, 2, conflict.Generation)
			assert.Equal(t, repository.Writer(second), conflict.Writer)

			got, err := first.Chain(ctx, chain.ID)
			require.NoError(t, err)
			require.Len(t, got.Links, 2)
			assert.Equal(t, won.Links[1].Object, got.Links[1].Object, "the chain holds the second writer's link")
			rep, err := first.Verify(ctx, chain.ID, repository.VerifyOptions{})
			require.NoError(t, err)
			assert.True(t, rep.OK, "%v", rep.Problems)
			assertOnlyListed(t, u, got)

			// The first writer calls again and continues from the new link.
			got, err = first.AddLink(ctx, src.c, chain.ID)
			require.NoError(t, err)
			assert.Len(t, got.Links, 3)
		})
	}
}
