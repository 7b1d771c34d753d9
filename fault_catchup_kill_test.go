package siphon_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestKillDuringCatchUpAppliesEachTransactionOnce is
// TestKillAtRandomPointsAppliesEachTransactionOnce with a backlog: the
// source holds thousands of transactions before the first child starts,
// far more than the children apply, and each child catches up through the
// SQL interface (two workers, copies of the slot, chunks of 256 KiB of
// WAL) while the source keeps committing, so the kills land inside the
// catch-up: mid-chunk, between chunks, while the slot is advanced. A last
// child catches up the rest and goes on through the walsender: the target
// must hold exactly the source's data, every transaction applied once,
// and no copy of the slot or session may be left.
func TestKillDuringCatchUpAppliesEachTransactionOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rounds := envInt(t, "SIPHON_CATCHUP_KILL_ROUNDS", 12)
	srcDSN, srcConn, tgtDSN, tgtConn, slot, systemID := faultDatabases(t)

	// The backlog, in batches of transactions sent as one query each.
	gen := &faultTransactions{}
	rng := rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))
	for range 30 {
		var batch strings.Builder
		for range 100 {
			sql, _ := gen.next(rng)
			batch.WriteString(sql + ";\n")
		}
		execSQL(t, srcConn, batch.String())
	}
	load := startWorkload(t, srcDSN, 5*time.Millisecond, false, gen.next)

	env := []string{faultChildSource + "=" + srcDSN, faultChildTarget + "=" + tgtDSN,
		faultChildSlot + "=" + slot, faultChildSystem + "=" + systemID, faultChildCatchUp + "=1"}
	began := time.Now()
	origin := fmt.Sprintf("siphon_%s_%s_%s", dbOID(t, tgtConn), systemID, slot)
	tally := killTally{landed: map[string]int{}}
	inCatchUp := 0
	for i := range rounds {
		out := runKilledChild(t, env, killMark(i), rand.N(400*time.Millisecond))
		if strings.Contains(out, markCatchUp+"\n") && !strings.Contains(out, markWalsender+"\n") {
			inCatchUp++
		}
		awaitReleased(t, srcConn, tgtConn, slot)
		tally.record(t, i+1, out, srcConn, tgtConn, slot, origin)
	}
	require.NoError(t, load.stop())
	var endLSN string
	require.NoError(t, srcConn.QueryRow(ctx, `
		WITH r AS (INSERT INTO fault_accounts VALUES (-1, 0, 'end') RETURNING 1)
		SELECT pg_logical_emit_message(true, $1, 'end')::text FROM r`, faultEndPrefix).Scan(&endLSN))

	end := runLastChild(t, env)
	t.Logf("%d rounds (%d killed in the catch-up, %d moved the slot on, %d past the target), %d + 3000 source transactions, %v: kills %v",
		rounds, inCatchUp, tally.acked, tally.ahead, load.committed, time.Since(began).Round(time.Millisecond), tally.landed)
	assert.Positive(t, inCatchUp, "kills landed in the catch-up")
	assert.Positive(t, tally.acked, "the killed children moved the slot on")

	assertTargetAt(t, tgtDSN, systemID, slot, end, endLSN)
	assertAppliedOnce(t, srcConn, tgtConn)
	assertNoLeaks(t, srcDSN, slot)
}
