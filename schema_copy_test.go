package siphon_test

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/siphondb/siphon"
	"github.com/siphondb/siphon/pgdump"
)

// copyShop is the shop's schema (realShop: an enum, a domain, identity
// and generated columns, foreign keys, a partitioned table, triggers, a
// keyless table) and more of what a real schema holds: a standalone
// sequence used by a default, a second schema with an odd name, a view, a
// table without any key that siphon does not capture, a comment, an index,
// and a grant to another role.
func copyShop(reader string) []string {
	return append(append([]string{}, realShop...),
		`CREATE SEQUENCE invoice_no START 1000`,
		`CREATE SCHEMA "Ledger"`,
		`CREATE TABLE "Ledger"."Entries" (
			id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
			invoice int NOT NULL DEFAULT nextval('invoice_no'),
			customer_id int REFERENCES customers ON DELETE SET NULL,
			amount amount NOT NULL)`,
		`CREATE INDEX entries_customer ON "Ledger"."Entries" (customer_id)`,
		`COMMENT ON TABLE "Ledger"."Entries" IS 'what customers owe'`,
		`CREATE VIEW customer_orders AS SELECT c.email, count(o.id) AS orders FROM customers c LEFT JOIN orders o ON o.customer_id = c.id GROUP BY c.email`,
		`CREATE TABLE scribbles (body text)`,
		`GRANT USAGE ON SCHEMA "Ledger" TO `+reader,
		`GRANT SELECT ON "Ledger"."Entries", customer_orders TO `+reader)
}

// copyShopSource makes a source database with copyShop's schema, granting
// to a role of its own, and the first round of the shop's workload.
func copyShopSource(t *testing.T) (string, *pgx.Conn, string) {
	t.Helper()
	dsn, src := newDatabase(t)
	reader := readerRole(t, src)
	execSQL(t, src, copyShop(reader)...)
	realShopRound(t, src, 1)
	return dsn, src, reader
}

// readerRole makes a role for the schema to grant to, dropped when the
// test ends, once every database given to forgetRole forgot it (roles
// belong to the cluster: a target on the same server has the source's).
func readerRole(t *testing.T, admin *pgx.Conn) string {
	t.Helper()
	role := fmt.Sprintf("shop_reader_%d_%d", os.Getpid(), roleSeq.Add(1))
	execSQL(t, admin, "CREATE ROLE "+role)
	t.Cleanup(func() {
		_, err := admin.Exec(context.Background(), "DROP OWNED BY "+role)
		assert.NoError(t, err)
		_, err = admin.Exec(context.Background(), "DROP ROLE "+role)
		assert.NoError(t, err)
	})
	return role
}

// forgetRole drops what db grants role when the test ends.
func forgetRole(t *testing.T, db *pgx.Conn, role string) {
	t.Helper()
	t.Cleanup(func() {
		_, err := db.Exec(context.Background(), "DROP OWNED BY "+role)
		assert.NoError(t, err)
	})
}

// fullSchemaDump is schemaDump with owners and grants.
func fullSchemaDump(t *testing.T, dsn string) string {
	t.Helper()
	return captureOwners.ReplaceAllString(pgDumpSchema(t, dsn, "--no-subscriptions"), "")
}

// captureOwners matches the owners of the capture's event triggers in a
// dump with owners.
var captureOwners = regexp.MustCompile(`ALTER EVENT TRIGGER siphon_capture_\w+ OWNER TO \w+;\n`)

// TestCopySchemaMakesTheTargetsSchemaTheSources copies a rich schema from
// a source where siphon is attached (the schema capture installed, its
// publication made) into an empty database: pg_dump --schema-only of
// both, owners and grants included, is the same, and the target holds
// nothing of siphon's. A target that holds tables is refused, unchanged,
// unless told so (NonEmptyTarget): then the copy is all or nothing, and
// takes its place beside the target's own tables. Objects of a role that
// is not a superuser are not given to the target's role: refused, unless
// their owners are kept (KeepOwners).
func TestCopySchemaMakesTheTargetsSchemaTheSources(t *testing.T) {
	t.Parallel()
	skipUnlessDumpClients(t)
	ctx := context.Background()
	srcDSN, src, reader := copyShopSource(t)
	c, _, _ := captureConnAt(t, srcDSN)
	require.Equal(t, 1, siphonLeftovers(t, src)["schema siphon"], "siphon is attached to the source")

	dstDSN, dst := newDatabase(t)
	forgetRole(t, dst, reader)
	target := connect(t, dstDSN)
	require.NoError(t, c.CopySchema(ctx, target, siphon.CopySchemaOptions{}))
	assert.Equal(t, fullSchemaDump(t, srcDSN), fullSchemaDump(t, dstDSN), "the target's schema is the source's")
	assert.Equal(t, noLeftovers, siphonLeftovers(t, dst), "nothing of siphon's, no publication")
	assert.Zero(t, count(t, dst, "SELECT count(*) FROM customers"), "no rows")

	// Not again into a target that holds tables: refused before anything.
	before := fullSchemaDump(t, dstDSN)
	err := c.CopySchema(ctx, target, siphon.CopySchemaOptions{})
	require.ErrorIs(t, err, siphon.ErrTargetNotEmpty)
	assert.Contains(t, err.Error(), "set CopySchemaOptions.NonEmptyTarget")
	// Told the target is not empty, it tries, in one transaction: the
	// source's objects are there already, so nothing is created.
	err = c.CopySchema(ctx, target, siphon.CopySchemaOptions{NonEmptyTarget: true})
	var exitErr *pgdump.ExitError
	require.ErrorAs(t, err, &exitErr)
	assert.Equal(t, before, fullSchemaDump(t, dstDSN), "a refused copy changes nothing")

	// A target with tables of its own takes the source's beside them.
	ownDSN, own := newDatabase(t)
	forgetRole(t, own, reader)
	execSQL(t, own, `CREATE SCHEMA mine`, `CREATE TABLE mine.notes (k int PRIMARY KEY)`, `INSERT INTO mine.notes VALUES (1)`)
	require.NoError(t, c.CopySchema(ctx, connect(t, ownDSN), siphon.CopySchemaOptions{NonEmptyTarget: true}))
	assert.Equal(t, 1, count(t, own, "SELECT count(*) FROM mine.notes"))
	assert.Subset(t, userTables(t, own), userTables(t, src))

	// Objects a role that is not a superuser owns on the source would run
	// with the target role's rights if it owned them: refused, unless
	// their owners are kept.
	execSQL(t, src, "ALTER VIEW customer_orders OWNER TO "+reader, "ALTER TABLE scribbles OWNER TO "+reader)
	keptDSN, kept := newDatabase(t)
	forgetRole(t, kept, reader)
	keptTarget := connect(t, keptDSN)
	err = c.CopySchema(ctx, keptTarget, siphon.CopySchemaOptions{})
	var owners *siphon.OwnershipError
	require.ErrorAs(t, err, &owners)
	assert.Equal(t, map[string][]string{reader: {"table public.scribbles", "view public.customer_orders"}}, owners.Owners)
	assert.Contains(t, err.Error(), "keep their owners with CopySchemaOptions.KeepOwners")
	untouched(t, kept)
	require.NoError(t, c.CopySchema(ctx, keptTarget, siphon.CopySchemaOptions{KeepOwners: true}))
	assert.Equal(t, fullSchemaDump(t, srcDSN), fullSchemaDump(t, keptDSN), "owners kept")

	_, err = c.Replicate(ctx, target, siphon.ReplicateOptions{CopySchema: &siphon.CopySchemaOptions{}})
	var optErr *siphon.OptionError
	require.ErrorAs(t, err, &optErr, "CopySchema needs Snapshot")
	assert.Equal(t, "ReplicateOptions.CopySchema", optErr.Option)
}

// TestReplicateCopiesTheSchemaIntoAnEmptyTarget migrates the shop with
// one call into an empty database: Replicate with Snapshot and CopySchema
// creates the schema as of the snapshot, loads the rows and streams, the
// workload and a deploy of migrations going on meanwhile. The target ends
// with the source's schema (pg_dump --schema-only), rows and sequences,
// and nothing of siphon's but its bookkeeping.
func TestReplicateCopiesTheSchemaIntoAnEmptyTarget(t *testing.T) {
	t.Parallel()
	skipUnlessDumpClients(t)
	ctx := context.Background()
	srcDSN, src, reader := copyShopSource(t)
	systemID := systemIdentifier(t, src)
	c, slot, _ := captureConnAt(t, srcDSN)

	dstDSN, dst := newDatabase(t)
	forgetRole(t, dst, reader)
	target := connect(t, dstDSN)
	forgetAppliedPosition(t, dstDSN, systemID, slot)
	run := startReplicate(t, c, target, siphon.ReplicateOptions{Snapshot: true, CopySchema: &siphon.CopySchemaOptions{}})
	realShopRound(t, src, 2)
	waitApplied(t, target, systemID, slot, 1, run)
	for _, deploy := range shopDeploys {
		execSQL(t, src, deploy...)
	}
	waitApplied(t, target, systemID, slot, sourceMark(t, src), run)
	_, err := run.stop()
	require.NoError(t, err)

	assertSameSchema(t, srcDSN, dstDSN, "Replicate with CopySchema")
	assert.Equal(t, fullSchemaDump(t, srcDSN), fullSchemaDump(t, dstDSN), "owners and grants too")
	assertSameAsSource(t, src, dst, "Replicate with CopySchema")
	assertSequencesCaughtUp(t, src, dst, "Replicate with CopySchema")
	left := siphonLeftovers(t, dst)
	delete(left, "schema siphon") // the bookkeeping of a role without origins would live there
	assert.Equal(t, map[string]int{"event triggers": 0, "publications": 0, "subscriptions": 0}, left)
	require.NoError(t, c.Detach(ctx))
}

// TestInitialSchemaIsCopiedOnceAndChecked: Replicate's initial snapshot
// copies the schema through its first snapshot; when it must take
// another (a table changed under the first), the target's schema is not
// copied again but checked against the source's at the new snapshot: the
// same goes on, a schema changed in between is an error, not a target
// that silently lacks the change.
func TestInitialSchemaIsCopiedOnceAndChecked(t *testing.T) {
	t.Parallel()
	skipUnlessDumpClients(t)
	ctx := context.Background()
	srcDSN, src := newDatabase(t)
	execSQL(t, src, realShop...)
	c, _ := backupConn(t, srcDSN)
	dstDSN, _ := newDatabase(t)
	prepare := c.InitialSchemaForTest(connect(t, dstDSN))
	attempt := func() error {
		snap, err := c.TakeSnapshot(ctx)
		require.NoError(t, err)
		defer snap.Close(ctx)
		return prepare(ctx, snap)
	}

	require.NoError(t, attempt())
	copied := fullSchemaDump(t, dstDSN)
	assert.Equal(t, fullSchemaDump(t, srcDSN), copied)
	require.NoError(t, attempt(), "the same schema: the target's stands")
	assert.Equal(t, copied, fullSchemaDump(t, dstDSN))

	execSQL(t, src, `CREATE INDEX customers_updated ON customers (updated_at)`)
	err := attempt()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "the source's schema changed between two attempts at the initial snapshot")
	assert.Equal(t, copied, fullSchemaDump(t, dstDSN), "the target is left as it was")
	require.NoError(t, c.Detach(ctx))
}
