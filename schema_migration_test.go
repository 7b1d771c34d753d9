package siphon_test

import (
	"bytes"
	"context"
	"io"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/siphondb/siphon"
	"github.com/siphondb/siphon/canonical"
	"github.com/siphondb/siphon/pgdump"
)

// shopDeploys are three deploys of migrations on the shop's schema, each
// step interleaved with the application's writes, as migration tools send
// them: one statement at a time, several statements in one query string,
// transaction blocks with DDL and writes mixed, CREATE INDEX
// CONCURRENTLY, and a DO block. Every kind of schema change a real deploy
// makes is there: a column added with a default, a new table with a
// foreign key filled in its own transaction, a rename between writes, a
// type change that rewrites a table, indexes (a partitioned one and a
// concurrent one), an enum value used right after, a table created and
// dropped, a partition attached, a type and a column made inside a DO
// block, a constraint, a default changed, a column dropped and a view.
var shopDeploys = [][]string{{
	`ALTER TABLE orders ADD COLUMN note text NOT NULL DEFAULT 'none'`,
	`INSERT INTO orders (placed_on, customer_id, note)
		SELECT date '2026-03-01' + g, (SELECT min(id) FROM customers), 'gift ' || g FROM generate_series(1, 20) g`,
	`BEGIN;
	 CREATE TABLE shipments (
		id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
		order_id bigint NOT NULL,
		placed_on date NOT NULL,
		carrier text NOT NULL DEFAULT 'post',
		FOREIGN KEY (order_id, placed_on) REFERENCES orders ON DELETE CASCADE);
	 INSERT INTO shipments (order_id, placed_on, carrier) SELECT id, placed_on, 'ups' FROM orders WHERE id % 3 = 0;
	 COMMIT;`,
	`BEGIN;
	 UPDATE customers SET name = name || '!' WHERE id % 5 = 0;
	 ALTER TABLE customers RENAME COLUMN name TO full_name;
	 INSERT INTO customers (email, full_name) VALUES ('renamed@shop.example', 'After Rename');
	 UPDATE customers SET full_name = full_name || '?' WHERE id % 6 = 0;
	 COMMIT;`,
	`CREATE TABLE scratch (id int PRIMARY KEY, v text); INSERT INTO scratch SELECT g, 'x' || g FROM generate_series(1, 10) g`,
}, {
	`ALTER TABLE order_lines ALTER COLUMN qty TYPE bigint`,
	`UPDATE order_lines SET qty = qty * 1000000000 WHERE line_no = 1`,
	`CREATE INDEX CONCURRENTLY customers_full_name_idx ON customers (full_name)`,
	`CREATE UNIQUE INDEX shipments_order_idx ON shipments (order_id, placed_on, id); CREATE INDEX orders_status_idx ON orders (status)`,
	`ALTER TYPE order_status ADD VALUE 'refunded' AFTER 'paid'`,
	`UPDATE orders SET status = 'refunded' WHERE id % 4 = 0`,
	`INSERT INTO shipments (order_id, placed_on) SELECT id, placed_on FROM orders WHERE id % 7 = 0`,
}, {
	`BEGIN;
	 CREATE TABLE orders_2027 (LIKE orders INCLUDING DEFAULTS INCLUDING CONSTRAINTS);
	 ALTER TABLE orders_2027 ADD PRIMARY KEY (id, placed_on);
	 ALTER TABLE orders ATTACH PARTITION orders_2027 FOR VALUES FROM ('2027-01-01') TO ('2028-01-01');
	 COMMIT;`,
	`INSERT INTO orders (placed_on, customer_id, status) SELECT date '2027-02-01' + g, (SELECT max(id) FROM customers), 'refunded' FROM generate_series(1, 15) g`,
	`DO $$ BEGIN
		IF NOT EXISTS (SELECT FROM pg_type WHERE typname = 'carrier_kind') THEN
			CREATE TYPE carrier_kind AS ENUM ('ground', 'air');
		END IF;
		EXECUTE 'ALTER TABLE shipments ADD COLUMN kind carrier_kind';
	 END $$`,
	`UPDATE shipments SET kind = 'air' WHERE id % 2 = 0`,
	`ALTER TABLE products ADD CONSTRAINT price_cap CHECK (price < 1000000); ALTER TABLE products ALTER COLUMN tags SET DEFAULT '{new}'`,
	`INSERT INTO products (sku, price) VALUES ('after-default', 3)`,
	`ALTER TABLE products DROP COLUMN tags`,
	`INSERT INTO products (sku, price) SELECT 'after-drop-' || g, g FROM generate_series(1, 5) g`,
	`CREATE VIEW big_orders AS SELECT id, placed_on, total FROM orders WHERE total > 100`,
	`DROP TABLE scratch`,
	`INSERT INTO customers (email, full_name) SELECT 'late' || g || '@shop.example', 'Late ' || g FROM generate_series(1, 25) g`,
}}

// TestMigrationsAcrossTheChainAndTheReplica runs the shop's three deploys
// while a backup chain (a base and an incremental per deploy) and a live
// replica (Replicate from a snapshot) follow the source. The target restored
// from the chain by hand, the one restored by RestoreChain, and the
// replica each end with the source's exact schema (pg_dump --schema-only
// compared), the source's rows in every table, and sequences at or past
// the source's, with no manual step.
func TestMigrationsAcrossTheChainAndTheReplica(t *testing.T) {
	t.Parallel()
	skipUnlessDumpClients(t)
	ctx := context.Background()
	srcDSN, src := newDatabase(t)
	execSQL(t, src, realShop...)
	realShopRound(t, src, 1)
	systemID := systemIdentifier(t, src)
	// The chain is taken and restored with a key: its schema changes run.
	chainConn, chainSlot := backupConn(t, srcDSN, siphon.WithStreamKey(authKey))
	require.NoError(t, chainConn.InstallSchemaCapture(ctx))
	base := backup(t, chainConn, siphon.BackupOptions{StartChain: true})
	rep, err := chainConn.Verify(ctx, bytes.NewReader(base))
	require.NoError(t, err)

	// The replica: the shop's schema as it was, then Replicate.
	replicaDSN, replica := newDatabase(t)
	execSQL(t, replica, realShop...)
	replicaConn, replicaSlot := backupConn(t, srcDSN)
	require.NoError(t, replicaConn.InstallSchemaCapture(ctx))
	replicaTarget, err := siphon.Connect(ctx, replicaDSN)
	require.NoError(t, err)
	defer replicaTarget.Close()
	forgetAppliedPosition(t, replicaDSN, systemID, replicaSlot)
	run := startReplicate(t, replicaConn, replicaTarget, siphon.ReplicateOptions{Snapshot: true})
	// The snapshot needs the schema it was taken at: the deploys start
	// once it is loaded, and the stream carries them.
	waitApplied(t, replicaTarget, systemID, replicaSlot, 1, run)

	restoredDSN, restored := newDatabase(t)
	restoredTarget, err := siphon.Connect(ctx, restoredDSN, siphon.WithStreamKey(authKey))
	require.NoError(t, err)
	defer restoredTarget.Close()
	require.NoError(t, restoredTarget.Restore(ctx, siphon.RestoreOptions{}, bytes.NewReader(base)))
	forgetAppliedPosition(t, restoredDSN, systemID, chainSlot)

	var links [][]byte
	link := rep.ChainLink()
	ddl := 0
	for _, deploy := range shopDeploys {
		execSQL(t, src, deploy...)
		var inc bytes.Buffer
		link, err = chainConn.BackupIncrementalAfter(ctx, link, &inc)
		require.NoError(t, err)
		ddl += schemaChanges(t, inc.Bytes())
		links = append(links, inc.Bytes())
		require.NoError(t, restoredTarget.ConsumeCanonical(ctx, bytes.NewReader(inc.Bytes())))
	}
	assert.Equal(t, 19, ddl, "the incrementals carry the deploys' schema changes, one each")
	assertSameSchema(t, srcDSN, restoredDSN, "the base and incrementals, consumed by hand")
	assertSameAsSource(t, src, restored, "the base and incrementals, consumed by hand")
	assertSequencesCaughtUp(t, src, restored, "the base and incrementals, consumed by hand")

	chainDSN, chain, reached := restoreChainInto(t, systemID, chainSlot, base, links, siphon.WithStreamKey(authKey))
	assert.Equal(t, link.End, reached)
	assertSameSchema(t, srcDSN, chainDSN, "RestoreChain")
	assertSameAsSource(t, src, chain, "RestoreChain")
	assertSequencesCaughtUp(t, src, chain, "RestoreChain")

	waitApplied(t, replicaTarget, systemID, replicaSlot, sourceMark(t, src), run)
	_, err = run.stop()
	require.NoError(t, err)
	assertSameSchema(t, srcDSN, replicaDSN, "the replica")
	assertSameAsSource(t, src, replica, "the replica")
	assertSequencesCaughtUp(t, src, replica, "the replica")
}

// schemaChanges counts the ddl records of a canonical stream.
func schemaChanges(t *testing.T, stream []byte) int {
	t.Helper()
	d := canonical.NewDecoder(bytes.NewReader(stream))
	n := 0
	for {
		rec, err := d.Next()
		if err == io.EOF {
			return n
		}
		require.NoError(t, err)
		if rec.Type == canonical.RecordChange && rec.Change.Op == canonical.OpDDL {
			n++
		}
	}
}

// assertSameSchema compares the schemas of two databases as pg_dump
// --schema-only prints them, siphon's own objects left out.
func assertSameSchema(t *testing.T, srcDSN, dstDSN, when string) {
	t.Helper()
	want, got := schemaDump(t, srcDSN), schemaDump(t, dstDSN)
	if want != got {
		t.Errorf("%s: the target's schema differs from the source's:\n%s", when, lineDiff(want, got))
	}
}

// dumpNoise matches the lines of a schema dump that say nothing about the
// schema: comments, settings, psql's \restrict guards, blank lines.
var dumpNoise = regexp.MustCompile(`(?m)^(--.*|SET .*|SELECT pg_catalog\.set_config.*|\\(un)?restrict .*|\s*)\n`)

// eventTriggers matches the capture's event triggers in a dump.
var eventTriggers = regexp.MustCompile(`(?s)CREATE EVENT TRIGGER siphon_capture_\w+ ON \w+\s+EXECUTE FUNCTION siphon\.capture_\w+\(\);\n|ALTER EVENT TRIGGER siphon_capture_\w+ ENABLE ALWAYS;\n`)

// schemaDump runs pg_dump --schema-only on dsn and normalises its output.
func schemaDump(t *testing.T, dsn string) string {
	t.Helper()
	return pgDumpSchema(t, dsn, "--no-owner", "--no-privileges")
}

// pgDumpSchema runs pg_dump --schema-only with args on dsn, publications
// and siphon's objects left out, and normalises its output.
func pgDumpSchema(t *testing.T, dsn string, args ...string) string {
	t.Helper()
	ctx := context.Background()
	conn := connectOrFail(t, dsn)
	defer conn.Close(ctx)
	var version string
	require.NoError(t, conn.QueryRow(ctx, "SHOW server_version").Scan(&version))
	server, err := pgdump.ParseVersion(version)
	require.NoError(t, err)
	prog, err := pgdump.Find(ctx, "pg_dump", "", server)
	require.NoError(t, err)
	args = append([]string{"--schema-only", "--no-publications", "--exclude-schema=siphon", "--dbname=" + dsn}, args...)
	out, err := exec.CommandContext(ctx, prog.Path, args...).Output()
	require.NoError(t, err)
	dump := dumpNoise.ReplaceAllString(string(out), "")
	return eventTriggers.ReplaceAllString(dump, "")
}

// lineDiff lists the lines only one of two texts has.
func lineDiff(a, b string) string {
	count := map[string]int{}
	for _, l := range strings.Split(a, "\n") {
		count[l]++
	}
	for _, l := range strings.Split(b, "\n") {
		count[l]--
	}
	var out []string
	for l, n := range count {
		switch {
		case n > 0:
			out = append(out, "- "+l)
		case n < 0:
			out = append(out, "+ "+l)
		}
	}
	if len(out) == 0 {
		return "(the same lines, in another order)"
	}
	return strings.Join(out, "\n")
}

// assertSequencesCaughtUp checks that every sequence of the source would
// give the target a value the source has not used: the target's next
// value is at or past the source's.
func assertSequencesCaughtUp(t *testing.T, src, dst *pgx.Conn, when string) {
	t.Helper()
	next := func(conn *pgx.Conn) map[string]int64 {
		rows, err := conn.Query(context.Background(), `SELECT quote_ident(schemaname) || '.' || quote_ident(sequencename),
			coalesce(last_value + increment_by, start_value) FROM pg_sequences WHERE schemaname <> 'siphon'`)
		require.NoError(t, err)
		out := map[string]int64{}
		for rows.Next() {
			var name string
			var n int64
			require.NoError(t, rows.Scan(&name, &n))
			out[name] = n
		}
		require.NoError(t, rows.Err())
		return out
	}
	want, got := next(src), next(dst)
	require.NotEmpty(t, want)
	for name, n := range want {
		assert.GreaterOrEqual(t, got[name], n, "%s: sequence %s", when, name)
	}
}
