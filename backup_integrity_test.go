package siphon_test

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/siphondb/siphon"
)

// changeDigit changes one digit of the first value of a tick's row in an
// incremental: "v7.3" becomes "v7.8", with the JSON still valid.
func changeDigit(t *testing.T, incremental []byte) []byte {
	t.Helper()
	at := bytes.Index(incremental, []byte(`"new":["`))
	require.Positive(t, at, "the incremental holds an update")
	end := at + bytes.IndexByte(incremental[at+8:], '"') + 8
	changed := bytes.Clone(incremental)
	for i := end - 1; i > at; i-- {
		if c := changed[i]; c >= '0' && c <= '9' {
			changed[i] = '0' + (c-'0'+5)%10
			return changed
		}
	}
	t.Fatalf("no digit in %q", incremental[at:end])
	return nil
}

// TestIncrementalsAreCheckedLinks checks the links BackupIncrementalAfter
// writes: each names the one before it, Verify and VerifyChain prove their
// content (a changed digit is a problem that names the line) and their
// order (a swapped or repeated link, a link of another slot), RestoreChain
// refuses a damaged chain before touching the target, and a link without
// checksums is flagged unless the Conn accepts them.
func TestIncrementalsAreCheckedLinks(t *testing.T) {
	t.Parallel()
	skipUnlessDumpClients(t)
	ctx := context.Background()
	f := newChainFixture(t)
	base, inc1, inc2 := f.base, f.incrementals[0], f.incrementals[1]
	chain, err := f.c.VerifyChain(ctx, bytes.NewReader(base), bytes.NewReader(inc1), bytes.NewReader(inc2))
	require.NoError(t, err)
	require.True(t, chain.OK, "%v", chain.Problems)
	for i, link := range chain.Links {
		assert.True(t, link.Checked, "link %d is checked", i+1)
		assert.NotEmpty(t, link.Link, "link %d has an identity", i+1)
		if i > 0 {
			assert.Equal(t, chain.Links[i-1].Link, link.Previous, "link %d names the one before it", i+1)
		}
	}

	damaged := changeDigit(t, inc2)
	rep, err := f.c.Verify(ctx, bytes.NewReader(damaged))
	require.NoError(t, err)
	assert.False(t, rep.OK)
	assert.Contains(t, strings.Join(rep.Problems, "; "), "checksum mismatch")
	chain, err = f.c.VerifyChain(ctx, bytes.NewReader(base), bytes.NewReader(inc1), bytes.NewReader(damaged))
	require.NoError(t, err)
	assert.False(t, chain.OK)
	assert.Contains(t, strings.Join(chain.Problems, "; "), "link 3: JSONL body, canonical: line")

	_, target, dst := restoreTarget(t)
	_, err = target.RestoreChain(ctx, siphon.RestoreChainOptions{}, bytes.NewReader(base), bytes.NewReader(inc1), bytes.NewReader(damaged))
	var chainErr *siphon.ChainError
	require.ErrorAs(t, err, &chainErr)
	assert.Equal(t, 3, chainErr.Link)
	assert.Empty(t, userTables(t, dst), "nothing was restored")

	for name, links := range map[string][][]byte{
		"swapped":  {base, inc2, inc1},
		"repeated": {base, inc1, inc1, inc2},
		"skipped":  {base, inc2},
	} {
		chain, err := f.c.VerifyChain(ctx, readers(links...)...)
		require.NoError(t, err, name)
		assert.False(t, chain.OK, name)
	}
	otherSlot, _ := backupConn(t, f.dsn)
	var foreign bytes.Buffer
	_, err = otherSlot.BackupIncremental(ctx, 0, &foreign)
	require.NoError(t, err)
	chain, err = f.c.VerifyChain(ctx, bytes.NewReader(base), bytes.NewReader(foreign.Bytes()))
	require.NoError(t, err)
	assert.Contains(t, strings.Join(chain.Problems, "; "), "they are different change streams")

	unchecked := []byte(strings.Join(uncheck(strings.SplitAfter(string(inc1), "\n")), ""))
	rep, err = f.c.Verify(ctx, bytes.NewReader(unchecked))
	require.NoError(t, err)
	assert.False(t, rep.Checked)
	assert.Contains(t, strings.Join(rep.Problems, "; "), "carries no checksums")
	assert.Contains(t, strings.Join(rep.Problems, "; "), "ApplyOptions.Unchecked", "the problem says how to apply it anyway")
}

// TestRestoreRecordsTheBase restores a base with a plain Restore, then
// consumes incrementals by hand: a skipped link, and a link of another
// slot, are refused with an *ApplyGapError and change nothing; the links in
// order then give exactly the source. A RestoreChain target time before
// the base is refused.
func TestRestoreRecordsTheBase(t *testing.T) {
	t.Parallel()
	skipUnlessDumpClients(t)
	ctx := context.Background()
	f := newChainFixture(t)
	dsn, target, dst := restoreTarget(t)
	require.NoError(t, target.Restore(ctx, siphon.RestoreOptions{}, bytes.NewReader(f.base)))
	systemID := systemIdentifier(t, f.src)
	forgetAppliedPosition(t, dsn, systemID, f.slot)
	rep, err := f.c.Verify(ctx, bytes.NewReader(f.base))
	require.NoError(t, err)
	applied, err := target.AppliedPositionFor(ctx, systemID, f.slot)
	require.NoError(t, err)
	assert.Equal(t, rep.Start, applied, "Restore records the base's Position")

	var gap *siphon.ApplyGapError
	err = target.ConsumeCanonical(ctx, bytes.NewReader(f.incrementals[1]))
	require.ErrorAs(t, err, &gap, "the second incremental, the first skipped")
	assert.Equal(t, rep.Start, gap.Applied)
	assert.Equal(t, f.after[0].digest, digest(t, dst, "tbl"), "nothing of it was applied")

	otherSlot, _ := backupConn(t, f.dsn)
	var foreign bytes.Buffer
	_, err = otherSlot.BackupIncremental(ctx, 0, &foreign)
	require.NoError(t, err)
	err = target.ConsumeCanonical(ctx, bytes.NewReader(foreign.Bytes()))
	require.ErrorAs(t, err, &gap, "an incremental of another slot")
	assert.Contains(t, gap.Holds, systemID+"_"+f.slot)

	for _, inc := range f.incrementals {
		require.NoError(t, target.ConsumeCanonical(ctx, bytes.NewReader(inc)))
	}
	assert.Equal(t, f.after[len(f.after)-1].digest, digest(t, dst, "tbl"))
	assert.Equal(t, []int{1, 2, 3, 4, 5, 6}, ticksOf(t, dst))

	_, fresh, freshConn := restoreTarget(t)
	links := readers(append([][]byte{f.base}, f.incrementals...)...)
	_, err = fresh.RestoreChain(ctx, siphon.RestoreChainOptions{TargetTime: f.after[0].at.Add(-time.Minute)}, links...)
	require.ErrorIs(t, err, siphon.ErrTargetBeforeBase, "a target time before the base was taken")
	assert.Empty(t, userTables(t, freshConn), "nothing was restored")
}

// TestUncheckedStreamsNeedTheOption consumes a change stream written by
// hand, without checksums: it is refused with ErrUnchecked and nothing is
// applied, unless the Conn accepts such streams, which then applies it.
func TestUncheckedStreamsNeedTheOption(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn, admin := newDatabase(t)
	execSQL(t, admin, "CREATE TABLE t (id int PRIMARY KEY, v text)")
	stream := strings.Join(uncheck(badInputStream(t)), "")
	strict, err := siphon.Connect(ctx, dsn)
	require.NoError(t, err)
	defer strict.Close()
	require.ErrorIs(t, strict.ConsumeCanonical(ctx, strings.NewReader(stream)), siphon.ErrUnchecked)
	assert.Zero(t, count(t, admin, "SELECT count(*) FROM t"))

	require.NoError(t, strict.ConsumeCanonicalWith(ctx, siphon.ApplyOptions{Unchecked: true}, strings.NewReader(stream)),
		"accepted for this call")
	assert.Equal(t, 2, count(t, admin, "SELECT count(*) FROM t"))
	require.NoError(t, strict.ResetAppliedPosition(ctx, "7000000000000000001", "bad_input"))
	require.ErrorIs(t, strict.ConsumeCanonical(ctx, strings.NewReader(stream)), siphon.ErrUnchecked, "and for that call only")
}
