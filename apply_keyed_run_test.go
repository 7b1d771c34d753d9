package siphon_test

import (
	"bytes"
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/siphondb/siphon/canonical"
)

// runsDDL is a schema whose updates and deletes come in long runs of
// rows of one table: a bigint key with a TOASTed column kept out of line,
// a composite text and integer key with a name that needs quoting, a
// numeric key (whose equal values may print differently), a partitioned
// table, and a foreign key.
var runsDDL = []string{
	`CREATE TABLE docs (id bigint PRIMARY KEY, rev int NOT NULL, price numeric(12,2), tags text[], body text)`,
	`ALTER TABLE docs ALTER body SET STORAGE EXTERNAL`,
	`CREATE TABLE "Pairs" ("Region" text, "Nr" int, v jsonb, PRIMARY KEY ("Region", "Nr"))`,
	`CREATE TABLE measures (k numeric PRIMARY KEY, n int)`,
	`CREATE TABLE parts (id int, at date, n int, PRIMARY KEY (id, at)) PARTITION BY RANGE (at)`,
	`CREATE TABLE parts_2025 PARTITION OF parts FOR VALUES FROM ('2025-01-01') TO ('2026-01-01')`,
	`CREATE TABLE parts_2026 PARTITION OF parts FOR VALUES FROM ('2026-01-01') TO ('2027-01-01')`,
	`CREATE TABLE notes (id int GENERATED ALWAYS AS IDENTITY PRIMARY KEY, doc bigint REFERENCES docs ON DELETE CASCADE ON UPDATE CASCADE, txt text)`,
	// Large enough for the planner to join a few rows to it by its index,
	// in the order they come.
	`CREATE TABLE counters (id int PRIMARY KEY, n int NOT NULL)`,
	`INSERT INTO counters SELECT g, 0 FROM generate_series(1, 100000) g`,
}

var runsTables = []string{"docs", `"Pairs"`, "measures", "parts", "notes", "counters"}

// TestConsumeCanonicalRunsOfUpdatesAndDeletes applies, from a source's
// incremental backup, statements that update and delete hundreds of rows
// each: runs longer than one statement takes, rows updated twice in a
// transaction and in consecutive ones, keys changed, rows deleted and
// inserted again, TOASTed values left out of some updates, NULLs, a
// partitioned table and cascaded deletes. The target ends equal to the
// source, and applying the backup again changes nothing.
func TestConsumeCanonicalRunsOfUpdatesAndDeletes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srcDSN, source := newDatabase(t)
	execSQL(t, source, runsDDL...)
	src, _ := streamConn(t, srcDSN)
	_, target, c := applyTarget(t, runsDDL...)
	start, err := src.CurrentPosition(ctx)
	require.NoError(t, err)

	execSQL(t, source,
		`INSERT INTO docs SELECT g, 0, g / 10.0, ARRAY['a', g::text], CASE WHEN g % 4 = 0 THEN repeat(md5(g::text), 100) END FROM generate_series(1, 1200) g`,
		`INSERT INTO "Pairs" SELECT 'r' || (g % 3), g, jsonb_build_object('g', g) FROM generate_series(1, 300) g`,
		`INSERT INTO measures SELECT g / 4.0, g FROM generate_series(1, 100) g`,
		`INSERT INTO parts SELECT g, DATE '2025-06-01' + g, g FROM generate_series(1, 200) g`,
		`INSERT INTO notes (doc, txt) SELECT g, 'note ' || g FROM generate_series(1, 1200, 5) g`,
	)
	execSQL(t, source, `BEGIN`,
		`UPDATE docs SET rev = rev + 1 WHERE id <= 700`, // longer than one statement's rows
		`UPDATE docs SET rev = rev + 1, price = price * 2 WHERE id <= 100`,
		`UPDATE docs SET body = 'short ' || id WHERE id % 3 = 0`,
		`UPDATE docs SET tags = NULL, price = NULL WHERE id BETWEEN 300 AND 420`,
		`COMMIT`)
	execSQL(t, source, `BEGIN`,
		`UPDATE "Pairs" SET v = '{"n": 1}' WHERE "Nr" % 2 = 0`,
		`UPDATE "Pairs" SET v = NULL WHERE "Nr" % 3 = 0`,
		`UPDATE measures SET n = n + 1`,
		`UPDATE measures SET n = n * 2 WHERE k < 10`,
		`UPDATE parts SET n = n + 1`,
		`UPDATE parts SET at = at + 200 WHERE id % 5 = 0`, // into the other partition
		`COMMIT`)
	execSQL(t, source, `BEGIN`,
		`DELETE FROM docs WHERE id > 1000`, // cascades to notes
		`INSERT INTO docs SELECT g, 9, 1, '{}', NULL FROM generate_series(1001, 1100) g`,
		`UPDATE docs SET id = id + 5000 WHERE id BETWEEN 200 AND 260`,
		`UPDATE docs SET rev = rev + 1 WHERE id BETWEEN 150 AND 5300`,
		`DELETE FROM "Pairs" WHERE "Nr" < 50`,
		`DELETE FROM measures WHERE k > 20`,
		`DELETE FROM parts WHERE id % 3 = 0`,
		`COMMIT`)
	for i := range 20 { // one unit on the target, the same rows in each
		execSQL(t, source, fmt.Sprintf(`UPDATE docs SET rev = rev + %d WHERE id BETWEEN 1 AND 30`, i))
	}
	for range 10 {
		execSQL(t, source, `UPDATE counters SET n = n + 1 WHERE id <= 5`)
	}

	var backup bytes.Buffer
	end, err := src.BackupIncremental(ctx, start, &backup)
	require.NoError(t, err)
	require.NoError(t, consume(t, c, backup.Bytes()))
	assert.Equal(t, end, appliedPosition(t, c))
	for _, table := range runsTables {
		require.Equal(t, digest(t, source, table), digest(t, target, table), table)
	}
	assert.Equal(t, [][]*string{{ptr("1100")}}, rawRows(t, target, `SELECT count(*) FROM docs`))

	require.NoError(t, consume(t, c, backup.Bytes()))
	for _, table := range runsTables {
		assert.Equal(t, digest(t, source, table), digest(t, target, table), "applied twice: %s", table)
	}
}

// TestConsumeCanonicalFailureInARunOfUpdates makes the target refuse one
// row of a run of updates (a check the source lacks) in the third of four
// transactions that one target transaction applies: the first two are
// kept with their Position, and the error names the statement's table.
func TestConsumeCanonicalFailureInARunOfUpdates(t *testing.T) {
	t.Parallel()
	_, target, c := applyTarget(t, ledgerDDL[0])
	items := tableOf(t, inspect(t, c), itemsName)
	execSQL(t, target, `ALTER TABLE items ADD CONSTRAINT no_bad CHECK (note IS DISTINCT FROM 'bad')`)
	s := newStream(t, canonical.KindIncremental, 0x8000000, "runs", items)
	update := func(tx int, note func(id int) string) []canonical.Change {
		var changes []canonical.Change
		for id := 1; id <= 120; id++ {
			changes = append(changes, upd(itemsName, nil, tv(fmt.Sprint(id)), tv(fmt.Sprint(tx)), tv(note(id))))
		}
		return changes
	}
	var inserts []canonical.Change
	for id := 1; id <= 120; id++ {
		inserts = append(inserts, ins(itemsName, tv(fmt.Sprint(id)), tv("1"), tv("new")))
	}
	s.tx(inserts...)
	second := s.tx(update(2, func(int) string { return "two" })...)
	s.tx(update(3, func(id int) string {
		if id == 77 {
			return "bad"
		}
		return "three"
	})...)
	s.tx(update(4, func(int) string { return "four" })...)

	err := consume(t, c, s.done())
	require.Error(t, err)
	assert.Contains(t, err.Error(), "no_bad")
	assert.Contains(t, err.Error(), "update on public.items")
	assert.Equal(t, second, appliedPosition(t, c))
	assert.Equal(t, [][]*string{{ptr("2"), ptr("two"), ptr("120")}},
		rawRows(t, target, "SELECT tx, note, count(*) FROM items GROUP BY tx, note"))
}
