package siphon_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/siphondb/siphon"
)

// TestAppliedSourcesAreListedResetAndSwept: a target that holds two
// slots of a source and a one-off backup of it lists the three with what
// a user needs to name them (AppliedSources); AppliedPosition's refusal
// says so; once a slot is dropped on the source, SweepOrphanOriginsWith
// forgets it and nothing else; ResetAppliedPosition takes a listed entry
// as it is, the backup's (whose empty slot name is hashed) included. With
// replication origins (a superuser) and with the bookkeeping table (a
// role that may not use origins, whose entries say when they were
// applied).
func TestAppliedSourcesAreListedResetAndSwept(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		plain bool
	}{{"origins", false}, {"bookkeeping", true}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			srcDSN, src := newDatabase(t)
			execSQL(t, src, `CREATE TABLE t (k int PRIMARY KEY)`)
			a, slotA, posA := streamConnAt(t, srcDSN)
			b, slotB, posB := streamConnAt(t, srcDSN)
			systemID := systemIdentifier(t, src)
			got, err := a.SystemID(ctx)
			require.NoError(t, err)
			assert.Equal(t, systemID, got, "a source Conn says its system identifier")

			dstDSN, dst := newDatabase(t)
			targetDSN := dstDSN
			if tc.plain {
				targetDSN = plainRole(t, dstDSN, dst)
			}
			target := connect(t, targetDSN)
			for _, slot := range []string{slotA, slotB, ""} {
				forgetAppliedPosition(t, targetDSN, systemID, slot)
			}
			require.NoError(t, target.MarkAppliedPosition(ctx, systemID, slotA, posA))
			require.NoError(t, target.MarkAppliedPosition(ctx, systemID, slotB, posB))
			require.NoError(t, target.MarkAppliedPosition(ctx, systemID, "", posA), "a one-off backup no slot continues")

			_, err = target.AppliedPosition(ctx)
			require.ErrorIs(t, err, siphon.ErrAmbiguousSource)
			assert.Contains(t, err.Error(), fmt.Sprintf("system id %s slot %q up to %v", systemID, slotA, posA))
			assert.Contains(t, err.Error(), fmt.Sprintf("system id %s slot %q up to %v", systemID, slotB, posB))
			assert.Contains(t, err.Error(), "ask for one with AppliedPositionFor(ctx, systemID, slot) (AppliedSources lists them; a source Conn's SystemID gives its own)")

			list, err := target.AppliedSources(ctx)
			require.NoError(t, err)
			require.Len(t, list, 3)
			bySlot := map[string]siphon.AppliedSource{}
			for _, src := range list {
				assert.Equal(t, systemID, src.SystemID)
				assert.Equal(t, tc.plain, !src.Updated.IsZero(), "the bookkeeping table says when; an origin cannot")
				bySlot[src.Slot] = src
			}
			assert.Equal(t, posA, bySlot[slotA].Position)
			assert.Equal(t, posB, bySlot[slotB].Position)
			delete(bySlot, slotA)
			delete(bySlot, slotB)
			require.Len(t, bySlot, 1)
			var backup siphon.AppliedSource
			for _, src := range bySlot {
				backup = src
			}
			assert.Regexp(t, `^h[0-9a-f]{16}$`, backup.Slot, "the empty slot name, hashed")
			assert.Equal(t, posA, backup.Position)

			// Slot B is dropped on the source: the sweep forgets what the
			// target holds of it, and keeps slot A's and the backup's.
			require.NoError(t, b.DropSlot(ctx, slotB))
			sweeper := target
			if tc.plain { // the sweep also drops origins of dropped databases: a superuser's job
				sweeper = connect(t, dstDSN)
			}
			n, err := sweeper.SweepOrphanOriginsWith(ctx, siphon.SweepOptions{Source: a})
			require.NoError(t, err)
			assert.GreaterOrEqual(t, n, 1)
			left, err := target.AppliedSources(ctx)
			require.NoError(t, err)
			assert.ElementsMatch(t, []siphon.AppliedSource{entryFor(t, list, slotA), backup}, left)
			_, err = sweeper.SweepOrphanOriginsWith(ctx, siphon.SweepOptions{Source: a})
			require.NoError(t, err)
			again, err := target.AppliedSources(ctx)
			require.NoError(t, err)
			assert.Equal(t, left, again, "nothing more to sweep: A's slot lives, the backup had none")

			require.NoError(t, target.ResetAppliedPosition(ctx, backup.SystemID, backup.Slot), "a listed entry, as it is")
			pos, err := target.AppliedPosition(ctx)
			require.NoError(t, err, "one source left")
			assert.Equal(t, posA, pos)
			require.NoError(t, a.Detach(ctx))
		})
	}
}

// entryFor returns the entry of list for slot.
func entryFor(t *testing.T, list []siphon.AppliedSource, slot string) siphon.AppliedSource {
	t.Helper()
	for _, src := range list {
		if src.Slot == slot {
			return src
		}
	}
	t.Fatalf("no entry for slot %q in %v", slot, list)
	return siphon.AppliedSource{}
}
