package siphontest_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"math"
	"math/big"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/siphondb/siphon"
	"github.com/siphondb/siphon/canonical"
	"github.com/siphondb/siphon/siphontest"
)

// TestRecordedStreamReplaysAsDelivered records a live stream through a
// Recorder in front of a handler, and checks that the handler received
// what a replay of the recording delivers, that a snapshot's rows reach the
// same handler as changes, and that the Value conversions read what the
// stream delivers for real columns of their types.
func TestRecordedStreamReplaysAsDelivered(t *testing.T) {
	t.Parallel()
	dsn := siphontest.Start(t).NewDatabase(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	body := make([]byte, 8000) // random, so it is TOASTed out of line and not compressed
	_, _ = rand.Read(body)
	_, err = conn.Exec(ctx, `CREATE TABLE typed (id int8 PRIMARY KEY, small int2, n int4, amount numeric(20,4), ratio float8,
			flag bool, at timestamptz, wall timestamp, day date, body text);
		ALTER TABLE typed REPLICA IDENTITY FULL;
		INSERT INTO typed VALUES (1, 1, 1, 1.5, 1.5, true, '2000-01-01 00:00:00+00', '2000-01-01 00:00:00', '2000-01-01', 'snapshot row')`)
	require.NoError(t, err)

	c, err := siphon.Connect(ctx, dsn, siphon.WithSlot("siphontest_replay"))
	require.NoError(t, err)
	defer c.Close()
	snap, err := c.TakeSnapshot(ctx)
	require.NoError(t, err)
	var fromSnapshot []canonical.Change
	sc := canonical.NewSnapshotChanges(snap.Position(), collect(&fromSnapshot))
	require.NoError(t, snap.CopyTables(ctx, nil, siphon.CopyOptions{}, sc.Row))
	require.NoError(t, sc.Commit())
	require.NoError(t, snap.Close(ctx))

	workload := []string{
		`INSERT INTO typed VALUES
			(9007199254740993, -32768, 2147483646, 12.5, 0.1, true, '2026-11-30 05:00:00.123456+00', '2026-11-30 05:00:00.123456', '2026-11-30', '` + hex.EncodeToString(body) + `'),
			(2, NULL, NULL, 'NaN', 'NaN', false, 'infinity', '-infinity', '0044-03-15 BC', NULL)`,
		`UPDATE typed SET n = n + 1 WHERE id = 9007199254740993`,
		`DELETE FROM typed WHERE id = 1`,
	}
	for _, sql := range workload {
		_, err := conn.Exec(ctx, sql)
		require.NoError(t, err)
	}

	// Stream what the workload committed through a Recorder in front of
	// the handler, until the workload's last commit.
	var recording bytes.Buffer
	rec := canonical.NewRecorder(&recording, snap.Position())
	streamCtx, stop := context.WithCancel(ctx)
	defer stop()
	var live []canonical.Change
	commits := 0
	end, err := c.StreamChanges(streamCtx, snap.Position(), rec.Tee(func(ch canonical.Change) error {
		live = append(live, ch)
		if ch.Op == canonical.OpCommit {
			if commits++; commits == len(workload) {
				stop()
			}
		}
		return nil
	}))
	require.NoError(t, err)
	require.NoError(t, rec.Close())

	require.Equal(t, []canonical.Op{
		canonical.OpBegin, canonical.OpInsert, canonical.OpInsert, canonical.OpCommit,
		canonical.OpBegin, canonical.OpUpdate, canonical.OpCommit,
		canonical.OpBegin, canonical.OpDelete, canonical.OpCommit,
	}, ops(live))
	var replayed []canonical.Change
	replayEnd, err := canonical.Replay(ctx, bytes.NewReader(recording.Bytes()), snap.Position(), collect(&replayed))
	require.NoError(t, err)
	assert.True(t, assert.ObjectsAreEqual(live, replayed), "the replay delivers what the live stream did")
	assert.Equal(t, end, replayEnd, "and ends where it did")

	// The snapshot's rows reached the handler as one transaction at the
	// snapshot's Position, and agree with what the stream says of the row.
	require.Len(t, fromSnapshot, 3)
	assert.Equal(t, []canonical.Op{canonical.OpBegin, canonical.OpInsert, canonical.OpCommit}, ops(fromSnapshot))
	assert.Zero(t, fromSnapshot[1].XID)
	deleted := live[8]
	require.Equal(t, canonical.OpDelete, deleted.Op)
	for _, col := range deleted.Columns {
		snapshotValue, _ := fromSnapshot[1].Value(col.Name)
		oldValue, ok := deleted.OldValue(col.Name)
		require.True(t, ok, col.Name)
		assert.Equal(t, snapshotValue, oldValue, "%s: a snapshot row and the same row from the stream hold equal Values", col.Name)
	}

	checkConversions(t, live[1], live[2], live[5])
}

// checkConversions checks the Value conversions on the workload's two
// inserts and its update, as StreamChanges delivered them.
func checkConversions(t *testing.T, full, specials, update canonical.Change) {
	value := func(ch canonical.Change, col string) canonical.Value {
		v, ok := ch.Value(col)
		require.True(t, ok, col)
		return v
	}
	n, err := value(full, "id").Int64()
	require.NoError(t, err)
	assert.Equal(t, int64(9007199254740993), n, "int8 beyond 2^53")
	n, err = value(full, "small").Int64()
	require.NoError(t, err)
	assert.Equal(t, int64(-32768), n)
	dec, err := value(full, "amount").Decimal()
	require.NoError(t, err)
	assert.Equal(t, "12.5000", dec, "numeric with its scale")
	amount, err := value(full, "amount").Rat()
	require.NoError(t, err)
	assert.Zero(t, amount.Cmp(big.NewRat(25, 2)))
	ratio, err := value(full, "ratio").Float64()
	require.NoError(t, err)
	assert.Equal(t, 0.1, ratio, "float8 exactly")
	flag, err := value(full, "flag").Bool()
	require.NoError(t, err)
	assert.True(t, flag)
	want := time.Date(2026, 11, 30, 5, 0, 0, 123456000, time.UTC)
	for _, col := range []string{"at", "wall"} {
		at, err := value(full, col).Time()
		require.NoError(t, err, col)
		assert.True(t, want.Equal(at), "%s: %v", col, at)
	}
	day, err := value(full, "day").Time()
	require.NoError(t, err)
	assert.Equal(t, time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC), day)

	for _, col := range []string{"amount", "at", "wall"} {
		_, err := value(specials, col).Decimal()
		assert.ErrorIs(t, err, canonical.ErrNotConvertible, col)
	}
	_, err = value(specials, "amount").Rat()
	assert.ErrorIs(t, err, canonical.ErrNotConvertible, "numeric NaN is no number")
	nan, err := value(specials, "ratio").Float64()
	require.NoError(t, err)
	assert.True(t, math.IsNaN(nan), "float8 NaN is a float64 NaN")
	for _, col := range []string{"at", "wall"} {
		_, err := value(specials, col).Time()
		assert.ErrorIs(t, err, canonical.ErrNotConvertible, "%s: infinity is no time", col)
	}
	bc, err := value(specials, "day").Time()
	require.NoError(t, err)
	assert.Equal(t, time.Date(-43, 3, 15, 0, 0, 0, 0, time.UTC), bc, "44 BC is astronomical year -43")
	flag, err = value(specials, "flag").Bool()
	require.NoError(t, err)
	assert.False(t, flag)
	_, err = value(specials, "small").Int64()
	assert.ErrorIs(t, err, canonical.ErrNull)

	require.Equal(t, canonical.OpUpdate, update.Op)
	n, err = value(update, "n").Int64()
	require.NoError(t, err)
	assert.Equal(t, int64(math.MaxInt32), n)
	was, ok := update.OldValue("n")
	require.True(t, ok)
	n, err = was.Int64()
	require.NoError(t, err)
	assert.Equal(t, int64(math.MaxInt32-1), n, "the old value, under REPLICA IDENTITY FULL")
	_, err = value(update, "body").Time()
	assert.ErrorIs(t, err, canonical.ErrUnchanged, "the TOASTed body was not sent with the update")
}

// collect returns a handler that appends what it receives to *got.
func collect(got *[]canonical.Change) func(canonical.Change) error {
	return func(ch canonical.Change) error {
		*got = append(*got, ch)
		return nil
	}
}

func ops(changes []canonical.Change) []canonical.Op {
	out := make([]canonical.Op, len(changes))
	for i, ch := range changes {
		out[i] = ch.Op
	}
	return out
}
