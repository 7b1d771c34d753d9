package siphon

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"

	"github.com/siphondb/siphon/canonical"
	"github.com/siphondb/siphon/internal/pgerr"
	"github.com/siphondb/siphon/internal/sqltext"
)

// The publication selects what the change stream carries. It is created
// before any slot (pgoutput reads publications through the historic
// catalog). It names its tables, never FOR ALL TABLES: a table created
// later joins it only when siphon adds it ([Conn.SyncPublication]), so no
// table the application creates can start publishing updates it has no
// replica identity for. Tables without a usable replica identity are
// handled as [WithKeylessTables] says; with KeylessInsertsOnly a second
// publication, named with insertsSuffix, publishes only their inserts and
// truncates.

// userTable is a table the publication may hold: a table or partitioned
// table (not a partition: its parent carries it), with whether updates
// and deletes of every one of its leaves can name their rows.
type userTable struct {
	name   canonical.TableName
	usable bool
}

// userTablesQuery lists the tables of $1 (schemas) and $2 (names), or
// every user table when both are empty (not partitions, unless named: a
// partitioned table carries its own), with whether every leaf has a
// usable replica identity.
const userTablesQuery = `
SELECT n.nspname, c.relname, ` + usableIdentity + `
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE ` + isUserTable + `
  AND CASE WHEN pg_catalog.cardinality($1::text[]) = 0 THEN NOT c.relispartition
           ELSE (n.nspname, c.relname) IN (SELECT * FROM unnest($1::text[], $2::text[])) END
ORDER BY 1, 2`

// readUserTables reads the tables the publication may hold: those named
// by WithTables, or every user table.
func (c *Conn) readUserTables(ctx context.Context, q querier) ([]userTable, error) {
	schemas, names := nameArrays(c.tables)
	rows, err := q.Query(ctx, userTablesQuery, schemas, names)
	if err != nil {
		return nil, fmt.Errorf("list tables: %w", err)
	}
	tables, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (userTable, error) {
		var t userTable
		return t, r.Scan(&t.name.Schema, &t.name.Name, &t.usable)
	})
	if err != nil {
		return nil, fmt.Errorf("list tables: %w", err)
	}
	return tables, nil
}

// publicationPlan is which tables go where.
type publicationPlan struct {
	main    []canonical.TableName // publishing every kind of change
	inserts []canonical.TableName // KeylessInsertsOnly tables
	full    []canonical.TableName // KeylessFull tables, to set REPLICA IDENTITY FULL on
	skipped []canonical.TableName // KeylessSkip tables
}

// plan sorts tables by the keyless policy.
func (c *Conn) plan(tables []userTable) (publicationPlan, error) {
	var p publicationPlan
	var keyless []canonical.TableName
	for _, t := range tables {
		if t.usable {
			p.main = append(p.main, t.name)
		} else {
			keyless = append(keyless, t.name)
		}
	}
	if len(keyless) == 0 {
		return p, nil
	}
	if len(c.tables) > 0 && !c.opts.keylessChosen {
		return p, &ReplicaIdentityError{Tables: keyless}
	}
	switch c.opts.keyless {
	case KeylessInsertsOnly:
		p.inserts = keyless
	case KeylessFull:
		p.full, p.main = keyless, append(p.main, keyless...)
	default:
		p.skipped = keyless
	}
	return p, nil
}

// lockForPublication takes, up front, the locks that a transaction which
// creates or changes publications takes on user tables (lockTables):
// SHARE UPDATE EXCLUSIVE on the tables CREATE or ALTER PUBLICATION names,
// and ACCESS EXCLUSIVE on those, partitions included, that are given
// REPLICA IDENTITY FULL. A publication statement locks its tables one
// after another in its list's order, waiting for each while it holds the
// ones before: a user's TRUNCATE ... CASCADE, which locks a table before
// the tables that reference it, would deadlock with it.
func lockForPublication(ctx context.Context, tx pgx.Tx, named, full []canonical.TableName) error {
	locks := make([]tableLock, 0, len(named)+len(full))
	for _, t := range named {
		locks = append(locks, tableLock{table: t, mode: shareUpdateExclusive, only: true})
	}
	for _, t := range full {
		locks = append(locks, tableLock{table: t, mode: accessExclusive})
	}
	return lockTables(ctx, tx, locks)
}

// ensurePublication creates the publication when it is missing (see the
// top of this file), and otherwise checks that it matches the options and
// the tables (see checkPublication). It returns what it created, for
// undoPublication, or nil.
func (c *Conn) ensurePublication(ctx context.Context) (*madePublication, error) {
	found, err := c.checkPublication(ctx)
	if err != nil || found {
		return nil, err
	}
	made := &madePublication{}
	err = pgx.BeginFunc(ctx, c.pool, func(tx pgx.Tx) error { return c.createPublication(ctx, tx, made) })
	if err == nil {
		if _, err = c.ensureCapture(ctx); err != nil { // before any slot: no schema change after it is missed
			return nil, c.undoPublication(ctx, made, err)
		}
		return made, nil
	}
	if pgerr.Is(err, pgerrcode.DuplicateObject, pgerrcode.UniqueViolation) { // created meanwhile
		_, err := c.checkPublication(ctx)
		return nil, err
	}
	var identity *ReplicaIdentityError
	if errors.As(err, &identity) {
		return nil, err
	}
	return nil, errorf("siphon: create publication %q: %w", c.opts.publication, c.explainPublicationFailure(ctx, err))
}

// madePublication is a publication a call created, with the change-stream
// slots of the database when it did: a slot made since may read it.
type madePublication struct {
	slots      []string
	identities []replicaIdentity // what KeylessFull changed
}

// madeBySiphon is the comment on every publication siphon creates: the
// Detach after which no slot of the database is left drops them all (see
// dropMadePublications), those of Conns detached earlier, which kept
// theirs while another slot might read them, included. Only a
// publication's owner may comment on it, so no role can have a Detach
// drop another role's publication by marking it.
const madeBySiphon = "created by siphon: the Detach that leaves its database without slots drops it"

// markMade comments madeBySiphon on the publications a call created.
// A schema capture of an earlier version, which took a COMMENT on a
// publication for a schema change that targets would run (and fail on,
// having no such publication), leaves them unmarked: a Detach then drops
// them as before, the Conn's own only.
func (c *Conn) markMade(ctx context.Context, tx pgx.Tx, names []string) error {
	capture, err := c.readCapture(ctx, tx)
	if err != nil {
		return err
	}
	if capture.installed && !capture.current {
		return nil
	}
	for _, name := range names {
		if _, err := tx.Exec(ctx, "COMMENT ON PUBLICATION "+sqltext.Ident(name)+" IS "+sqltext.Literal(madeBySiphon)); err != nil {
			return err
		}
	}
	return nil
}

// dropMadePublications drops every publication siphon created in the
// database (see madeBySiphon) but the Conn's own, which detachPublication
// handles, once no slot of it may read one. They were other Conns', so
// one the role may not drop is no failure of this Detach: it stays, and a
// warning says who may drop it.
func (c *Conn) dropMadePublications(ctx context.Context, q querier, d *DetachIncompleteError) error {
	rows, err := q.Query(ctx, `SELECT pubname::pg_catalog.text, pg_catalog.pg_get_userbyid(pubowner)::pg_catalog.text FROM pg_catalog.pg_publication
		WHERE pg_catalog.obj_description(oid, 'pg_publication') = $1 AND pubname NOT IN ($2, $3) ORDER BY 1`,
		madeBySiphon, c.opts.publication, c.opts.publication+insertsSuffix)
	if err != nil {
		return fmt.Errorf("list the publications siphon created: %w", err)
	}
	type publication struct{ name, owner string }
	made, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (publication, error) {
		var p publication
		return p, row.Scan(&p.name, &p.owner)
	})
	if err != nil {
		return fmt.Errorf("list the publications siphon created: %w", err)
	}
	if len(made) == 0 {
		return nil
	}
	// Its owner may hold a lock on it: a Detach, which holds the
	// slot-management lock, waits for none.
	if _, err := q.Exec(ctx, "SET lock_timeout = '5s'"); err != nil {
		return err
	}
	defer q.Exec(context.WithoutCancel(ctx), "RESET lock_timeout")
	for _, p := range made {
		_, err := q.Exec(ctx, "DROP PUBLICATION IF EXISTS "+sqltext.Ident(p.name))
		switch {
		case err == nil:
			d.Removed = append(d.Removed, fmt.Sprintf("publication %q (another Conn's; no slot reads it any more)", p.name))
		case pgerr.Is(err, pgerrcode.InsufficientPrivilege, pgerrcode.LockNotAvailable):
			c.log.Warn("a publication siphon created for another Conn stays, though no slot reads it any more: only its owner or a superuser may drop it, once no session holds it (Detach as that role, or DROP PUBLICATION)",
				"publication", p.name, "owner", p.owner, "err", err)
		default:
			return fmt.Errorf("drop publication %q, which no slot reads any more: %w", p.name, err)
		}
	}
	return nil
}

// streamSlotsQuery lists the slots of the database that may read a
// publication: its pgoutput slots, temporary ones left out.
const streamSlotsQuery = `SELECT slot_name::text FROM pg_replication_slots
	WHERE slot_type = 'logical' AND plugin = 'pgoutput' AND database = pg_catalog.current_database() AND NOT temporary
	ORDER BY 1`

// streamSlots runs streamSlotsQuery.
func streamSlots(ctx context.Context, q querier) ([]string, error) {
	rows, err := q.Query(ctx, streamSlotsQuery)
	if err != nil {
		return nil, fmt.Errorf("list the slots of the database: %w", err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("list the slots of the database: %w", err)
	}
	return names, nil
}

// undoPublication drops the publication made created, when the call that
// created it failed (cause) before its slot existed, so that a failed
// call leaves nothing behind: a role without REPLICATION that calls
// CurrentPosition creates the publication, then cannot create the slot.
// It runs under the slot-management lock, so that no slot is created
// meanwhile, and keeps the publication when a slot made since it was
// created may read it. It returns cause, saying what it did.
func (c *Conn) undoPublication(ctx context.Context, made *madePublication, cause error) error {
	if made == nil {
		return cause
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.opts.slotRetry.LockTimeout)
	defer cancel()
	kept := func(why string) error {
		return fmt.Errorf("%w (the publication %q this call created stays: %s; drop it with Detach or DROP PUBLICATION)", cause, c.opts.publication, why)
	}
	lock, err := c.lockSlots(ctx, time.Now().Add(c.opts.slotRetry.LockTimeout))
	if err != nil {
		return kept("could not take the slot-management lock to drop it: " + err.Error())
	}
	defer lock.release()
	slots, err := streamSlots(ctx, lock.conn)
	if err != nil {
		return kept(err.Error())
	}
	if since := slices.DeleteFunc(slots, func(s string) bool { return slices.Contains(made.slots, s) }); len(since) > 0 {
		return kept(fmt.Sprintf("slots created since may read it (%s)", strings.Join(since, ", ")))
	}
	if _, err := lock.conn.Exec(ctx, "DROP PUBLICATION IF EXISTS "+sqltext.Ident(c.opts.publication)+", "+
		sqltext.Ident(c.opts.publication+insertsSuffix)); err != nil {
		return kept("dropping it failed: " + err.Error())
	}
	c.log.Info("publication dropped: the call that created it failed", "publication", c.opts.publication)
	if failed := restoreReplicaIdentities(ctx, lock.conn, made.identities); len(failed) > 0 {
		return fmt.Errorf("%w (the publication %q this call created was dropped again, but setting back the replica identities KeylessFull changed failed: %s)",
			cause, c.opts.publication, strings.Join(failed, "; "))
	}
	return fmt.Errorf("%w (the publication %q this call created was dropped again)", cause, c.opts.publication)
}

// explainPublicationFailure returns, for err that is the server's refusal
// to create the publication for lack of a privilege, the *PrivilegeError
// that says which; err otherwise.
func (c *Conn) explainPublicationFailure(ctx context.Context, err error) error {
	if !pgerr.Is(err, pgerrcode.InsufficientPrivilege) {
		return err
	}
	tables, terr := c.readUserTables(ctx, c.pool)
	if terr != nil {
		return err
	}
	lacks, lerr := c.canCreatePublication(ctx, tables)
	if lerr != nil || lacks == nil {
		return err
	}
	lacks.Err = err
	return lacks
}

// createPublication creates the publication (and the inserts-only one)
// for the tables of today, in tx, and records the slots of the database
// in made.
func (c *Conn) createPublication(ctx context.Context, tx pgx.Tx, made *madePublication) error {
	tables, err := c.readUserTables(ctx, tx)
	if err != nil {
		return err
	}
	if made.slots, err = streamSlots(ctx, tx); err != nil {
		return err
	}
	if err := c.checkNamedTablesExist(tables); err != nil {
		return err
	}
	p, err := c.plan(tables)
	if err != nil {
		return err
	}
	if err := lockForPublication(ctx, tx, slices.Concat(p.main, p.inserts), p.full); err != nil {
		return err
	}
	if made.identities, err = setReplicaIdentityFull(ctx, tx, p.full); err != nil {
		return err
	}
	stmt := "CREATE PUBLICATION " + sqltext.Ident(c.opts.publication)
	if len(p.main) > 0 {
		stmt += " FOR TABLE " + tableList(p.main)
	}
	if _, err := tx.Exec(ctx, stmt+" WITH ("+c.viaRootOption()+")"); err != nil {
		return err
	}
	names := []string{c.opts.publication} // what this call created, to mark
	if c.opts.keyless == KeylessInsertsOnly {
		stmt := "CREATE PUBLICATION " + sqltext.Ident(c.opts.publication+insertsSuffix)
		if len(p.inserts) > 0 {
			stmt += " FOR TABLE " + tableList(p.inserts)
		}
		if _, err := tx.Exec(ctx, stmt+" WITH (publish = 'insert, truncate', "+c.viaRootOption()+")"); err != nil {
			return err
		}
		names = append(names, c.opts.publication+insertsSuffix)
	}
	if err := c.markMade(ctx, tx, names); err != nil {
		return err
	}
	c.log.Info("publication created", "publication", c.opts.publication, "tables", len(p.main), "inserts_only", tableList(p.inserts))
	if len(p.skipped) > 0 {
		c.log.Warn("tables without a usable replica identity are not captured (see WithKeylessTables)",
			"publication", c.opts.publication, "tables", tableList(p.skipped))
	}
	return nil
}

// checkNamedTablesExist reports a table named by WithTables that is not
// among tables.
func (c *Conn) checkNamedTablesExist(tables []userTable) error {
	for _, name := range c.tables {
		if !slices.ContainsFunc(tables, func(t userTable) bool { return t.name == name }) {
			return &SchemaIncompatibleError{Table: name, Problem: missingTableProblem}
		}
	}
	return nil
}

// missingTableProblem is how a table named by WithTables that does not
// exist is reported, wherever it is found.
const missingTableProblem = "the table named by WithTables does not exist (or is temporary or unlogged): create it, or name another"

// setReplicaIdentityFull sets REPLICA IDENTITY FULL on tables and, for a
// partitioned table, on its leaves that are not FULL already. It returns
// what each had, for restoreReplicaIdentities.
func setReplicaIdentityFull(ctx context.Context, q querier, tables []canonical.TableName) ([]replicaIdentity, error) {
	var changed []replicaIdentity
	for _, t := range tables {
		// An identity index that is gone leaves the table as NOTHING.
		rows, err := q.Query(ctx, `SELECT pg_catalog.format('%I.%I', n.nspname, l.relname),
			       CASE l.relreplident WHEN 'd' THEN 'DEFAULT'
			                           WHEN 'i' THEN coalesce((SELECT 'USING INDEX ' || pg_catalog.quote_ident(x.relname) FROM pg_catalog.pg_index i
			                                          JOIN pg_catalog.pg_class x ON x.oid = i.indexrelid WHERE i.indrelid = l.oid AND i.indisreplident), 'NOTHING')
			                           ELSE 'NOTHING' END
			FROM pg_catalog.pg_class l JOIN pg_catalog.pg_namespace n ON n.oid = l.relnamespace
			WHERE (l.oid = $1::pg_catalog.regclass AND l.relkind = 'r'
			       OR l.oid IN (SELECT relid FROM pg_catalog.pg_partition_tree($1::pg_catalog.regclass) WHERE isleaf))
			  AND l.relreplident <> 'f'`, sqltext.Name(t.Schema, t.Name))
		if err != nil {
			return changed, fmt.Errorf("set REPLICA IDENTITY FULL on %s: %w", t, err)
		}
		rels, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (replicaIdentity, error) {
			var r replicaIdentity
			return r, row.Scan(&r.rel, &r.was)
		})
		if err != nil {
			return changed, fmt.Errorf("set REPLICA IDENTITY FULL on %s: %w", t, err)
		}
		for _, r := range rels {
			if _, err := q.Exec(ctx, "ALTER TABLE "+r.rel+" REPLICA IDENTITY FULL"); err != nil {
				return changed, fmt.Errorf("set REPLICA IDENTITY FULL on %s (KeylessFull; the role must own it): %w", r.rel, err)
			}
			changed = append(changed, r)
		}
	}
	return changed, nil
}

// replicaIdentity is a table's replica identity before KeylessFull made
// it FULL.
type replicaIdentity struct {
	rel string // the table, qualified and quoted
	was string // DEFAULT, NOTHING or USING INDEX name
}

// restoreReplicaIdentities sets back the replica identities a failed
// creation changed (see undoPublication), except on a table that some
// publication publishes now, whose updates and deletes FULL keeps
// working. It returns the statements that failed.
func restoreReplicaIdentities(ctx context.Context, q querier, changed []replicaIdentity) []string {
	var failed []string
	for _, r := range changed {
		var published bool
		err := q.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_catalog.pg_publication WHERE puballtables)
			OR EXISTS (SELECT FROM pg_catalog.pg_publication_rel pr
			           WHERE pr.prrelid = $1::pg_catalog.regclass OR pr.prrelid IN (SELECT relid FROM pg_catalog.pg_partition_ancestors($1::pg_catalog.regclass)))
			OR EXISTS (SELECT FROM pg_catalog.pg_publication_namespace pn JOIN pg_catalog.pg_class c ON c.relnamespace = pn.pnnspid
			           WHERE c.oid = $1::pg_catalog.regclass)`, r.rel).Scan(&published)
		if err == nil && !published {
			_, err = q.Exec(ctx, "ALTER TABLE "+r.rel+" REPLICA IDENTITY "+r.was)
		}
		if err != nil {
			failed = append(failed, fmt.Sprintf("ALTER TABLE %s REPLICA IDENTITY %s: %v", r.rel, r.was, err))
		}
	}
	return failed
}

// viaRootOption is the publications' publish_via_partition_root, as
// WithPartitionRoots says.
func (c *Conn) viaRootOption() string {
	return fmt.Sprintf("publish_via_partition_root = %v", c.opts.partitionRoots)
}

// publicationState is what the publications hold.
type publicationState struct {
	exists, allTables, inserts bool // the main publication; FOR ALL TABLES; the inserts-only one
	capture                    bool // the main one holds the schema capture's table
	flags                      [4]bool
	// allViaRoot: every publication that exists publishes partitions
	// under their roots (publish_via_partition_root); anyViaRoot: one does.
	allViaRoot, anyViaRoot bool
	main, insertsOnly      []canonical.TableName
	// bySchema lists the tables of main it holds because it publishes their
	// schema (FOR TABLES IN SCHEMA), named in it or not: no ALTER
	// PUBLICATION moves one out.
	bySchema []canonical.TableName
}

// readPublications reads the publication and its inserts-only companion.
func (c *Conn) readPublications(ctx context.Context, q querier) (publicationState, error) {
	var s publicationState
	// A publication holds the tables it names and, FOR TABLES IN SCHEMA,
	// every table of those schemas (read from the catalogs, not from the
	// view pg_publication_tables, which opens every table it lists). The
	// catalogs are named with their schema: a search_path the database's
	// owner sets could put a table of the same name first.
	rows, err := q.Query(ctx, `
		WITH held AS (
		  SELECT h.pub, h.oid, pg_catalog.bool_or(NOT h.named) AS by_schema FROM (
		    SELECT r.prpubid AS pub, r.prrelid AS oid, true AS named FROM pg_catalog.pg_publication_rel r
		    UNION ALL SELECT pn.pnpubid, c.oid, false FROM pg_catalog.pg_publication_namespace pn JOIN pg_catalog.pg_class c ON c.relnamespace = pn.pnnspid
		    WHERE c.relkind IN ('r', 'p') AND c.relpersistence = 'p') h
		  GROUP BY h.pub, h.oid)
		SELECT p.pubname = $1, p.puballtables, p.pubinsert, p.pubupdate, p.pubdelete, p.pubtruncate, p.pubviaroot,
		       coalesce(t.schemas, '{}'), coalesce(t.names, '{}'), coalesce(t.by_schema, '{}')
		FROM pg_catalog.pg_publication p CROSS JOIN LATERAL (
		  SELECT pg_catalog.array_agg(n.nspname::pg_catalog.text ORDER BY n.nspname, c.relname) AS schemas,
		         pg_catalog.array_agg(c.relname::pg_catalog.text ORDER BY n.nspname, c.relname) AS names,
		         pg_catalog.array_agg(h.by_schema ORDER BY n.nspname, c.relname) AS by_schema
		  FROM held h JOIN pg_catalog.pg_class c ON c.oid = h.oid JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
		  WHERE h.pub = p.oid) t
		WHERE p.pubname IN ($1, $2)`, c.opts.publication, c.opts.publication+insertsSuffix)
	if err != nil {
		return s, errorf("siphon: look up publication %q: %w", c.opts.publication, err)
	}
	defer rows.Close()
	s.allViaRoot = true
	for rows.Next() {
		var isMain, all, viaRoot bool
		var flags [4]bool
		var schemas, names []string
		var held []bool
		if err := rows.Scan(&isMain, &all, &flags[0], &flags[1], &flags[2], &flags[3], &viaRoot, &schemas, &names, &held); err != nil {
			return s, errorf("siphon: look up publication %q: %w", c.opts.publication, err)
		}
		s.allViaRoot, s.anyViaRoot = s.allViaRoot && viaRoot, s.anyViaRoot || viaRoot
		tables := make([]canonical.TableName, len(names))
		var bySchema []canonical.TableName
		for i := range names {
			tables[i] = canonical.TableName{Schema: schemas[i], Name: names[i]}
			if held[i] {
				bySchema = append(bySchema, tables[i])
			}
		}
		if isMain {
			n := len(tables)
			tables = withoutCaptureTable(tables)
			s.exists, s.allTables, s.flags, s.main, s.capture = true, all, flags, tables, len(tables) < n
			s.bySchema = bySchema
		} else {
			s.inserts, s.insertsOnly = true, tables
		}
	}
	if err := rows.Err(); err != nil {
		return s, errorf("siphon: look up publication %q: %w", c.opts.publication, err)
	}
	return s, nil
}

// publicationNames lists the publications a stream reads, for pgoutput's
// publication_names.
func (c *Conn) publicationNames(ctx context.Context) (string, error) {
	s, err := c.readPublications(ctx, c.pool)
	if err != nil {
		return "", err
	}
	if s.inserts {
		return c.opts.publication + "," + c.opts.publication + insertsSuffix, nil
	}
	return c.opts.publication, nil
}

// publicationView is the publications and the tables they may hold, read
// in one snapshot: read apart, a table created (and published by the
// schema capture) or renamed between the two reads looks created after
// the publication.
type publicationView struct {
	pub    publicationState
	tables []userTable
}

// readPublicationView reads the publications and the tables in one
// REPEATABLE READ transaction. Every catalog
// read in it sees the same snapshot: a table created in a transaction
// that has not committed yet is in neither, and one the schema capture
// published in the transaction that created it is in both.
func (c *Conn) readPublicationView(ctx context.Context) (publicationView, error) {
	var v publicationView
	err := pgx.BeginTxFunc(ctx, c.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		var err error
		if v.pub, err = c.readPublications(ctx, tx); err != nil {
			return err
		}
		if v.tables, err = c.readUserTables(ctx, tx); err != nil {
			return errorf("siphon: check publication %q: %w", c.opts.publication, err)
		}
		return nil
	})
	return v, err
}

// checkPublication reports whether the publication exists, and an error
// when it exists but differs from the options, or the tables drifted from
// it (see checkView).
func (c *Conn) checkPublication(ctx context.Context) (bool, error) {
	v, err := c.readPublicationView(ctx)
	if err != nil || !v.pub.exists {
		return false, err
	}
	return true, c.checkView(v)
}

// checkView returns a *PublicationMismatchError when the publication of v
// differs from the options, or the tables drifted from it: a table siphon
// would publish is missing (created after it), or a published table lost
// its usable replica identity.
func (c *Conn) checkView(v publicationView) error {
	s := v.pub
	mismatch := &PublicationMismatchError{Publication: c.opts.publication}
	switch {
	case s.flags != [4]bool{true, true, true, true}:
		mismatch.Problem = "does not publish every kind of change (insert, update, delete, truncate)"
	case len(c.tables) > 0 && s.allTables:
		mismatch.Problem = "publishes all tables, but WithTables names " + tableList(c.tables)
	case c.opts.keyless == KeylessInsertsOnly && !s.inserts:
		mismatch.Problem = fmt.Sprintf("has no companion %q for the inserts of tables without a usable replica identity, which KeylessInsertsOnly needs", c.opts.publication+insertsSuffix)
	case c.viaRootDiffers(s):
		if c.opts.partitionRoots {
			mismatch.Problem = "publishes the rows of partitioned tables under their partitions' names (publish_via_partition_root is off), but WithPartitionRoots asks for their roots"
			mismatch.Fix = "run SyncPublication, which sets publish_via_partition_root = true: the stream names the roots from then on, so the targets must have them (a snapshot taken since names them too)"
		} else {
			mismatch.Problem = "publishes the rows of partitioned tables under their roots (publish_via_partition_root is on), but the Conn was made without WithPartitionRoots"
			mismatch.Fix = "connect WithPartitionRoots, or run SyncPublication, which sets publish_via_partition_root = false: the stream names the partitions from then on"
		}
		return mismatch
	case s.allTables:
		return nil // made by an older siphon; Preflight reports the risk
	}
	if mismatch.Problem != "" {
		return mismatch
	}
	if err := c.checkNamedTablesExist(v.tables); err != nil {
		return err
	}
	published := append(slices.Clone(s.main), s.insertsOnly...)
	if len(c.tables) > 0 && !sameTables(published, c.tables) {
		mismatch.Problem = "publishes " + tableList(published) + ", but WithTables names " + tableList(c.tables)
		return mismatch
	}
	for _, t := range v.tables {
		switch {
		// A table the publication holds by its schema stays in it: the
		// source refuses its UPDATE and DELETE until it has a usable
		// replica identity again, and nothing it lets through is lost.
		case !t.usable && slices.Contains(s.main, t.name) && !slices.Contains(s.bySchema, t.name) && c.opts.keyless != KeylessFull:
			mismatch.Unsafe = append(mismatch.Unsafe, t.name)
		case !slices.Contains(published, t.name) && (t.usable || c.opts.keyless != KeylessSkip):
			mismatch.Missing = append(mismatch.Missing, t.name)
		}
	}
	if len(mismatch.Missing)+len(mismatch.Unsafe) == 0 {
		return nil
	}
	var problems []string
	if len(mismatch.Missing) > 0 {
		problems = append(problems, "does not hold "+tableList(mismatch.Missing)+", created after it: their changes are not captured")
	}
	if len(mismatch.Unsafe) > 0 {
		problems = append(problems, "publishes the updates of "+tableList(mismatch.Unsafe)+
			", which lost their usable replica identity: the application's UPDATE and DELETE on them fail")
	}
	mismatch.Problem = strings.Join(problems, ", and ")
	mismatch.Fix = "run SyncPublication to bring the publication in line (then copy the rows of the tables it adds: a snapshot of them)"
	return mismatch
}

// viaRootDiffers reports whether the publications of s do not publish
// partitions as WithPartitionRoots says.
func (c *Conn) viaRootDiffers(s publicationState) bool {
	if c.opts.partitionRoots {
		return !s.allViaRoot
	}
	return s.anyViaRoot
}

// syncViaRoot sets publish_via_partition_root on the publications that
// exist as WithPartitionRoots says, in tx.
func (c *Conn) syncViaRoot(ctx context.Context, tx pgx.Tx) error {
	s, err := c.readPublications(ctx, tx)
	if err != nil || !c.viaRootDiffers(s) {
		return err
	}
	pubs := []string{c.opts.publication}
	if s.inserts {
		pubs = append(pubs, c.opts.publication+insertsSuffix)
	}
	for _, pub := range pubs {
		if _, err := tx.Exec(ctx, "ALTER PUBLICATION "+sqltext.Ident(pub)+" SET ("+c.viaRootOption()+")"); err != nil {
			return err
		}
	}
	c.log.Info("publication set to publish partitions as WithPartitionRoots says", "publication", c.opts.publication, "via_root", c.opts.partitionRoots)
	return nil
}

// SyncPublication brings siphon's publication in line with the tables of
// today: it adds the tables created since it was made (when it publishes
// every table), and moves tables that lost their usable replica identity
// as [WithKeylessTables] says (a publication that holds a table by its
// schema keeps it: [Conn.Preflight] reports such a table). It returns the tables it added: their
// changes before now were not captured, so copy their rows (a
// [Snapshot] of them, with [Snapshot.CopyTables]) before applying what
// streams after. It also sets the publications' publish_via_partition_root
// as [WithPartitionRoots] says. A publication of [WithTables] tables keeps
// its tables: SyncPublication sets only publish_via_partition_root there,
// and returns an error when its tables differ from WithTables (adjust them
// with ALTER PUBLICATION).
func (c *Conn) SyncPublication(ctx context.Context) ([]canonical.TableName, error) {
	if len(c.tables) > 0 {
		err := pgx.BeginFunc(ctx, c.pool, func(tx pgx.Tx) error { return c.syncViaRoot(ctx, tx) })
		if err == nil {
			_, err = c.checkPublication(ctx)
		}
		if err != nil {
			return nil, errorf("siphon: sync publication %q: it holds the WithTables tables, which SyncPublication leaves as they are: adjust it with ALTER PUBLICATION: %w", c.opts.publication, err)
		}
		return nil, nil
	}
	var added []canonical.TableName
	_, err := c.ensurePublication(ctx)
	var mismatch *PublicationMismatchError
	if errors.As(err, &mismatch) && mismatch.Fix != "" { // drift: what SyncPublication is for
		err = nil
	}
	if err == nil {
		err = pgx.BeginFunc(ctx, c.pool, func(tx pgx.Tx) error {
			added, err = c.syncPublication(ctx, tx)
			return err
		})
	}
	if err != nil {
		return nil, errorf("siphon: sync publication %q: %w", c.opts.publication, err)
	}
	if len(added) > 0 {
		c.log.Info("tables added to the publication", "publication", c.opts.publication, "tables", tableList(added))
	}
	return added, nil
}

// syncPublication makes the publications hold what plan says of the tables
// of today, in tx, and returns the tables it added.
func (c *Conn) syncPublication(ctx context.Context, tx pgx.Tx) ([]canonical.TableName, error) {
	if err := c.syncViaRoot(ctx, tx); err != nil {
		return nil, err
	}
	s, err := c.readPublications(ctx, tx)
	if err != nil || s.allTables {
		return nil, err
	}
	tables, err := c.readUserTables(ctx, tx)
	if err != nil {
		return nil, err
	}
	p, err := c.plan(tables)
	if err != nil {
		return nil, err
	}
	var added []canonical.TableName
	alter := func(pub, verb string, ts []canonical.TableName) error {
		if len(ts) == 0 {
			return nil
		}
		_, err := tx.Exec(ctx, "ALTER PUBLICATION "+sqltext.Ident(pub)+" "+verb+" TABLE "+tableList(ts))
		return err
	}
	missing := func(want, have []canonical.TableName) []canonical.TableName {
		return slices.DeleteFunc(slices.Clone(want), func(t canonical.TableName) bool { return slices.Contains(have, t) })
	}
	addMain := missing(p.main, s.main)
	// A table the main publication holds by its schema is published whole:
	// the inserts-only companion would add nothing.
	addInserts := slices.DeleteFunc(missing(p.inserts, s.insertsOnly), func(t canonical.TableName) bool { return slices.Contains(s.bySchema, t) })
	unsafe := slices.DeleteFunc(slices.Clone(s.main), func(t canonical.TableName) bool {
		return slices.Contains(p.main, t) || slices.Contains(s.bySchema, t) // one held by its schema cannot leave
	})
	insertsGone := slices.DeleteFunc(slices.Clone(s.insertsOnly), func(t canonical.TableName) bool { return !slices.Contains(p.main, t) })
	if err := lockForPublication(ctx, tx, slices.Concat(unsafe, insertsGone, addMain, addInserts), p.full); err != nil {
		return nil, err
	}
	if _, err := setReplicaIdentityFull(ctx, tx, p.full); err != nil { // kept: the publication stays too
		return nil, err
	}
	for _, step := range []struct {
		pub, verb string
		tables    []canonical.TableName
	}{
		{c.opts.publication, "DROP", unsafe},
		{c.opts.publication + insertsSuffix, "DROP", insertsGone},
		{c.opts.publication, "ADD", addMain},
		{c.opts.publication + insertsSuffix, "ADD", addInserts},
	} {
		if err := alter(step.pub, step.verb, step.tables); err != nil {
			return nil, err
		}
	}
	for _, t := range append(addMain, addInserts...) {
		if !slices.Contains(s.insertsOnly, t) && !slices.Contains(s.main, t) {
			added = append(added, t)
		}
	}
	return added, nil
}

func sameTables(a, b []canonical.TableName) bool {
	set := make(map[canonical.TableName]bool, len(a))
	for _, t := range a {
		set[t] = true
	}
	for _, t := range b {
		if !set[t] {
			return false
		}
	}
	return len(set) == len(b)
}

// canCreatePublication says whether the role could create the publication,
// and, when it could not, the *PrivilegeError that says what it lacks.
func (c *Conn) canCreatePublication(ctx context.Context, tables []userTable) (*PrivilegeError, error) {
	var names []canonical.TableName // what the publication would name (or make REPLICA IDENTITY FULL)
	for _, t := range tables {
		if t.usable || c.opts.keyless == KeylessFull || c.opts.keyless == KeylessInsertsOnly {
			names = append(names, t.name)
		}
	}
	schemas, relnames := nameArrays(names)
	var role, database string
	var create, super bool
	var notOwned []string
	err := c.pool.QueryRow(ctx, `SELECT current_user::text, pg_catalog.current_database()::text, pg_catalog.has_database_privilege(pg_catalog.current_database(), 'CREATE'),
		(SELECT rolsuper FROM pg_roles WHERE rolname = current_user),
		coalesce((SELECT pg_catalog.array_agg(pg_catalog.format('%I.%I', n.nspname, c.relname) ORDER BY 1) FROM pg_class c
		          JOIN pg_namespace n ON n.oid = c.relnamespace
		          WHERE c.relkind IN ('r', 'p') AND NOT pg_catalog.pg_has_role(c.relowner, 'USAGE')
		            AND (n.nspname, c.relname) IN (SELECT * FROM unnest($1::text[], $2::text[]))), '{}')`,
		schemas, relnames).Scan(&role, &database, &create, &super, &notOwned)
	const needed = "creating the publication"
	switch {
	case err != nil:
		return nil, err
	case super:
		return nil, nil
	case !create:
		return &PrivilegeError{Role: role, Privilege: "CREATE on database " + sqltext.Ident(database), Needed: needed,
			Fix: fmt.Sprintf("have a superuser run GRANT CREATE ON DATABASE %s TO %s", sqltext.Ident(database), sqltext.Ident(role))}, nil
	case len(notOwned) > 0:
		alters := make([]string, len(notOwned))
		for i, t := range notOwned {
			alters[i] = fmt.Sprintf("ALTER TABLE %s OWNER TO %s", t, sqltext.Ident(role))
		}
		return &PrivilegeError{Role: role, Needed: needed,
			Privilege: "ownership of " + strings.Join(notOwned, ", ") + " (a publication names only tables its creator owns)",
			Fix:       "have a superuser run " + strings.Join(alters, "; ") + ", or create the publication as a superuser (the role then only reads it)"}, nil
	}
	return nil, nil
}
