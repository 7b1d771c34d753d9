package siphon_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/siphondb/siphon"
	"github.com/siphondb/siphon/canonical"
)

// partitionedSource is a source with a range-partitioned table (three
// partitions, a row trigger, a foreign key to customers, referenced by
// another table) and a list-partitioned one with a default partition.
var partitionedSource = []string{
	`CREATE TABLE customers (id int GENERATED ALWAYS AS IDENTITY PRIMARY KEY, name text NOT NULL)`,
	`CREATE TABLE events (id bigint NOT NULL, created date NOT NULL, customer int REFERENCES customers,
		payload text, touched int NOT NULL DEFAULT 0, PRIMARY KEY (id, created)) PARTITION BY RANGE (created)`,
	`CREATE TABLE events_2024 PARTITION OF events FOR VALUES FROM ('2024-01-01') TO ('2025-01-01')`,
	`CREATE TABLE events_2025 PARTITION OF events FOR VALUES FROM ('2025-01-01') TO ('2026-01-01')`,
	`CREATE TABLE events_2026 PARTITION OF events FOR VALUES FROM ('2026-01-01') TO ('2027-01-01')`,
	`CREATE FUNCTION touch() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN NEW.touched := OLD.touched + 1; RETURN NEW; END $$`,
	`CREATE TRIGGER touch BEFORE UPDATE ON events FOR EACH ROW EXECUTE FUNCTION touch()`,
	`CREATE TABLE event_notes (id int GENERATED ALWAYS AS IDENTITY PRIMARY KEY, event bigint, created date, note text,
		FOREIGN KEY (event, created) REFERENCES events ON DELETE CASCADE)`,
	`CREATE TABLE orders (id int NOT NULL, region text NOT NULL, amount numeric(12,2), PRIMARY KEY (id, region)) PARTITION BY LIST (region)`,
	`CREATE TABLE orders_eu PARTITION OF orders FOR VALUES IN ('eu')`,
	`CREATE TABLE orders_us PARTITION OF orders FOR VALUES IN ('us')`,
	`CREATE TABLE orders_other PARTITION OF orders DEFAULT`,
}

// partitionedTarget has the same roots partitioned otherwise: events in
// two partitions with other bounds (and other names), orders not
// partitioned at all.
var partitionedTarget = []string{
	`CREATE TABLE customers (id int GENERATED ALWAYS AS IDENTITY PRIMARY KEY, name text NOT NULL)`,
	`CREATE TABLE events (id bigint NOT NULL, created date NOT NULL, customer int REFERENCES customers,
		payload text, touched int NOT NULL DEFAULT 0, PRIMARY KEY (id, created)) PARTITION BY RANGE (created)`,
	`CREATE TABLE events_before_mid_2025 PARTITION OF events FOR VALUES FROM (MINVALUE) TO ('2025-07-01')`,
	`CREATE TABLE events_after_mid_2025 PARTITION OF events FOR VALUES FROM ('2025-07-01') TO (MAXVALUE)`,
	`CREATE TABLE event_notes (id int GENERATED ALWAYS AS IDENTITY PRIMARY KEY, event bigint, created date, note text,
		FOREIGN KEY (event, created) REFERENCES events ON DELETE CASCADE)`,
	`CREATE TABLE orders (id int NOT NULL, region text NOT NULL, amount numeric(12,2), PRIMARY KEY (id, region))`,
}

// partitionRound writes round k on the source: inserts into every
// partition (the default one too), updates within a partition and across
// partitions of both tables, and deletes; with truncate, TRUNCATE of both
// roots (events with the table that references it) and new rows after.
func partitionRound(t *testing.T, src *pgx.Conn, k int, truncate bool) {
	t.Helper()
	base := k * 1000
	execSQL(t, src,
		fmt.Sprintf(`INSERT INTO customers (name) VALUES ('customer %d')`, k),
		fmt.Sprintf(`INSERT INTO events SELECT %d + g, date '2024-03-01' + (g * 17) %% 1000, (SELECT min(id) FROM customers), 'e' || g
			FROM generate_series(1, 60) g`, base),
		fmt.Sprintf(`INSERT INTO event_notes (event, created, note) SELECT id, created, 'note' FROM events WHERE id BETWEEN %d AND %d`, base+1, base+10),
		fmt.Sprintf(`INSERT INTO orders SELECT %d + g, (ARRAY['eu', 'us', 'apac', 'latam'])[1 + g %% 4], g * 1.25 FROM generate_series(1, 40) g`, base),
		// Within a partition, and across partitions (2024 -> 2026, eu -> us,
		// us -> the default one).
		fmt.Sprintf(`UPDATE events SET payload = 'updated' WHERE id BETWEEN %d AND %d`, base+11, base+20),
		fmt.Sprintf(`UPDATE events SET created = date '2026-06-15' WHERE id BETWEEN %d AND %d AND created < '2025-01-01'`, base+21, base+40),
		fmt.Sprintf(`UPDATE orders SET region = 'us', amount = amount + 1 WHERE id BETWEEN %d AND %d AND region = 'eu'`, base+1, base+20),
		fmt.Sprintf(`UPDATE orders SET region = 'mars' WHERE id BETWEEN %d AND %d AND region = 'us'`, base+21, base+30),
		fmt.Sprintf(`DELETE FROM events WHERE id BETWEEN %d AND %d`, base+1, base+5), // cascades to event_notes
		fmt.Sprintf(`DELETE FROM orders WHERE id BETWEEN %d AND %d`, base+31, base+35))
	if truncate {
		execSQL(t, src, `TRUNCATE events, event_notes`, `TRUNCATE orders`,
			fmt.Sprintf(`INSERT INTO events VALUES (%d, '2025-05-05', NULL, 'after truncate', 0), (%d, '2026-02-02', NULL, 'after truncate', 0)`, base+900, base+901),
			fmt.Sprintf(`INSERT INTO orders VALUES (%d, 'eu', 1), (%d, 'nowhere', 2)`, base+900, base+901))
	}
}

// assertSameRoots checks that dst holds the source's rows in every root.
func assertSameRoots(t *testing.T, src, dst *pgx.Conn, when string) {
	t.Helper()
	for _, table := range []string{"customers", "events", "event_notes", "orders"} {
		assert.Equal(t, digest(t, src, table), digest(t, dst, table), "%s: %s", when, table)
	}
}

// changedTables returns the tables the row changes and truncates of
// changes name, sorted, once each.
func changedTables(changes []canonical.Change) []string {
	var names []string
	for _, ch := range changes {
		switch ch.Op {
		case canonical.OpInsert, canonical.OpUpdate, canonical.OpDelete:
			names = append(names, ch.Table)
		case canonical.OpTruncate:
			for _, tn := range ch.Truncated {
				names = append(names, tn.Name)
			}
		}
	}
	slices.Sort(names)
	return slices.Compact(names)
}

// partitionedPair is a source (partitionedSource, one round written) and a
// target (partitionedTarget), with a source Conn WithPartitionRoots.
type partitionedPair struct {
	srcDSN         string
	src, dst       *pgx.Conn
	c, target      *siphon.Conn
	slot, systemID string
}

func newPartitionedPair(t *testing.T) partitionedPair {
	t.Helper()
	var p partitionedPair
	p.srcDSN, p.src = newDatabase(t)
	execSQL(t, p.src, partitionedSource...)
	partitionRound(t, p.src, 1, false)
	dstDSN, dst := newDatabase(t)
	execSQL(t, dst, partitionedTarget...)
	p.dst = dst
	p.c, p.slot = streamConn(t, p.srcDSN, siphon.WithPartitionRoots())
	p.target = connect(t, dstDSN)
	p.systemID = systemIdentifier(t, p.src)
	forgetAppliedPosition(t, dstDSN, p.systemID, p.slot)
	return p
}

// TestPartitionRoots carries partitioned tables under their roots
// (WithPartitionRoots) into a target whose roots are partitioned
// otherwise (events in two partitions with other bounds, orders not
// partitioned), with inserts into every partition, updates within and
// across partitions, deletes and TRUNCATE of the roots: through Replicate
// with its initial snapshot, and through EmitCanonical and BackupIncremental
// consumed with ConsumeCanonical. The target ends with the source's rows;
// InspectSchema, the snapshot and the incrementals name roots only.
func TestPartitionRoots(t *testing.T) {
	t.Parallel()
	t.Run("replicate", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		p := newPartitionedPair(t)
		src, dst, c, target, slot, systemID := p.src, p.dst, p.c, p.target, p.slot, p.systemID

		schema, err := c.InspectSchema(ctx)
		require.NoError(t, err)
		var names []string
		for _, tb := range schema.Tables {
			names = append(names, tb.Name)
		}
		assert.Equal(t, []string{"customers", "event_notes", "events", "orders"}, names, "roots, not partitions")

		run := startReplicate(t, c, target, siphon.ReplicateOptions{Snapshot: true})
		waitApplied(t, target, systemID, slot, 1, run)
		partitionRound(t, src, 2, false)
		waitApplied(t, target, systemID, slot, sourceMark(t, src), run)
		assertSameRoots(t, src, dst, "after the snapshot and a round")
		partitionRound(t, src, 3, true)
		partitionRound(t, src, 4, false)
		waitApplied(t, target, systemID, slot, sourceMark(t, src), run)
		_, err = run.stop()
		require.NoError(t, err)
		assertSameRoots(t, src, dst, "after TRUNCATE of the roots")
		assert.Positive(t, count(t, dst, `SELECT count(*) FROM events_before_mid_2025`))
		assert.Positive(t, count(t, dst, `SELECT count(*) FROM events_after_mid_2025`), "rows routed through the target's own partitions")
		require.NoError(t, c.Detach(ctx))
		require.NoError(t, c.Close())
		require.NoError(t, target.Close())
		assertNoLeaks(t, p.srcDSN)
	})
	t.Run("snapshot and incrementals", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		p := newPartitionedPair(t)
		src, dst, c, target := p.src, p.dst, p.c, p.target

		var snap bytes.Buffer
		pos, err := c.EmitCanonical(ctx, nil, &snap)
		require.NoError(t, err)
		assert.Equal(t, []string{"customers", "event_notes", "events", "orders"}, streamTables(t, snap.Bytes()), "the snapshot names roots")
		require.NoError(t, target.ConsumeCanonical(ctx, bytes.NewReader(snap.Bytes())))
		assertSameRoots(t, src, dst, "after the snapshot")
		for k, truncate := range []bool{false, true, false} {
			partitionRound(t, src, k+2, truncate)
			var inc bytes.Buffer
			pos, err = c.BackupIncremental(ctx, pos, &inc)
			require.NoError(t, err)
			changed := changedTables(decodeChanges(t, inc.Bytes()))
			assert.Equal(t, []string{"customers", "event_notes", "events", "orders"}, changed, "incremental %d names roots", k+1)
			require.NoError(t, target.ConsumeCanonical(ctx, bytes.NewReader(inc.Bytes())))
			assertSameRoots(t, src, dst, fmt.Sprintf("after incremental %d", k+1))
		}
		require.NoError(t, c.Detach(ctx))
		require.NoError(t, c.Close())
		require.NoError(t, target.Close())
		assertNoLeaks(t, p.srcDSN)
	})
}

// streamTables returns the tables a canonical stream's table records
// name, sorted.
func streamTables(t *testing.T, stream []byte) []string {
	t.Helper()
	d := canonical.NewDecoder(bytes.NewReader(stream))
	var names []string
	for {
		rec, err := d.Next()
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
		if rec.Type == canonical.RecordTable {
			names = append(names, rec.Table.Name)
		}
	}
	slices.Sort(names)
	return slices.Compact(names)
}

// TestPartitionRootsDrift: a publication made without
// publish_via_partition_root names partitions; a Conn WithPartitionRoots
// refuses it with a *PublicationMismatchError, SyncPublication sets it, and
// the stream names the root from then on. A Conn without the option
// refuses a publication that has it. With the schema capture, a partition
// created later (CREATE TABLE ... PARTITION OF) and a table attached
// (ATTACH PARTITION) need no change of the publication: their rows arrive
// under the root, and the next start finds no drift.
func TestPartitionRootsDrift(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn, admin := newDatabase(t)
	execSQL(t, admin, partitionedSource...)
	leaves, slot, start := streamConnAt(t, dsn)
	execSQL(t, admin, `INSERT INTO events VALUES (1, '2025-03-03', NULL, 'leaf', 0)`)
	changes, pos := streamUntilMarker(t, admin, leaves, start, "leaf")
	assert.Equal(t, []string{"events_2025"}, changedTables(changes), "without the option, partitions carry their own names")
	require.NoError(t, leaves.Close())

	roots := connect(t, dsn, siphon.WithSlot(slot), siphon.WithPartitionRoots())
	_, err := roots.BackupIncremental(ctx, pos, io.Discard)
	var drift *siphon.PublicationMismatchError
	require.ErrorAs(t, err, &drift)
	assert.Contains(t, drift.Problem, "publish_via_partition_root is off")
	assert.Contains(t, drift.Fix, "SyncPublication")
	added, err := roots.SyncPublication(ctx)
	require.NoError(t, err)
	assert.Empty(t, added)
	execSQL(t, admin, `INSERT INTO events VALUES (2, '2026-03-03', NULL, 'root', 0)`)
	changes, pos = streamUntilMarker(t, admin, roots, pos, "root")
	assert.Equal(t, []string{"events"}, changedTables(changes), "after SyncPublication the stream names the root")

	back := connect(t, dsn, siphon.WithSlot(slot))
	_, err = back.CurrentPosition(ctx)
	require.ErrorAs(t, err, &drift, "a Conn without the option refuses a publication that has it")
	assert.Contains(t, drift.Fix, "WithPartitionRoots")
	require.NoError(t, back.Close())

	// The schema capture and partitions made later.
	require.NoError(t, roots.InstallSchemaCapture(ctx))
	execSQL(t, admin,
		`CREATE TABLE events_2027 PARTITION OF events FOR VALUES FROM ('2027-01-01') TO ('2028-01-01')`,
		`INSERT INTO events VALUES (3, '2027-04-04', NULL, 'new partition', 0)`,
		`CREATE TABLE events_2028 (LIKE events INCLUDING ALL)`,
		`INSERT INTO events_2028 VALUES (4, '2028-05-05', NULL, 'before attach', 0)`,
		`ALTER TABLE events ATTACH PARTITION events_2028 FOR VALUES FROM ('2028-01-01') TO ('2029-01-01')`,
		`INSERT INTO events VALUES (5, '2028-06-06', NULL, 'attached', 0)`,
		`UPDATE events SET created = '2027-07-07' WHERE id = 4`)
	var inc bytes.Buffer
	_, err = roots.BackupIncremental(ctx, pos, &inc)
	require.NoError(t, err, "no drift after partitions were created and attached")
	var rows []string
	for _, ch := range decodeChanges(t, inc.Bytes()) {
		if ch.Op == canonical.OpInsert || ch.Op == canonical.OpUpdate || ch.Op == canonical.OpDelete {
			rows = append(rows, fmt.Sprintf("%s %s", ch.Op, ch.Table))
		}
	}
	assert.Equal(t, []string{"insert events", "insert events_2028", "insert events", "delete events", "insert events"}, rows,
		"rows of new and attached partitions arrive under the root (the table attached later, before it was attached, under its own name)")
	assert.Equal(t, []string{"public.customers", "public.event_notes", "public.events", "public.orders"},
		publishedTables(t, admin, "siphon"), "the attached table, which the capture had published, now publishes through its root")
	require.NoError(t, roots.Detach(ctx))
	require.NoError(t, roots.Close())
	assert.Empty(t, siphonObjects(t, admin))
	assertNoLeaks(t, dsn)
}

// TestCoversPartitionRoot: a stream that names a partitioned table
// (WithPartitionRoots) finds a change covered by a resumed copy only when
// the copy of every partition delivered under it reflects it.
func TestCoversPartitionRoot(t *testing.T) {
	t.Parallel()
	events := canonical.TableName{Schema: "public", Name: "events"}
	cp := &siphon.CopyCheckpoint{Position: 100, Tables: []siphon.TableCheckpoint{
		{Table: events, Relation: canonical.TableName{Schema: "public", Name: "events_2024"}, Position: 100},
		{Table: events, Relation: canonical.TableName{Schema: "public", Name: "events_2025"}, Position: 200},
	}}
	assert.True(t, cp.Covers(canonical.TableName{Schema: "public", Name: "events_2025"}, 150), "a leaf copied at 200")
	assert.False(t, cp.Covers(events, 150), "the root: the leaf copied at 100 does not reflect 150")
	assert.True(t, cp.Covers(events, 50), "every leaf reflects 50")
	assert.False(t, cp.Covers(canonical.TableName{Schema: "public", Name: "orders"}, 50), "a table the copy does not know")
}
