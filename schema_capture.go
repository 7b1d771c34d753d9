package siphon

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"

	"github.com/siphondb/siphon/canonical"
	"github.com/siphondb/siphon/internal/pgerr"
	"github.com/siphondb/siphon/internal/pgoutput"
	"github.com/siphondb/siphon/internal/sqltext"
	"github.com/siphondb/siphon/pgdump"
)

// Schema capture. PostgreSQL's logical decoding carries rows, not schema
// changes, so siphon installs an event trigger in the source database: at
// the end of every DDL command (ddl_command_end, with what sql_drop saw
// dropped) its function describes the command and inserts the description
// into siphon.schema_changes, and deletes it again in the same
// transaction. The table is in every siphon publication of the database,
// so the insert is decoded at its exact place among the transaction's row
// changes, and the stream turns it into an OpDDL change (see
// schema_changes.go). No role can forge one: only the trigger's function,
// owned by the superuser who installed it, may write the table.
//
// The same trigger keeps the publications safe and complete while the
// application migrates: a table created in a transaction is added to every
// publication it looks after that takes every table (no WithTables; as
// WithKeylessTables says for a table without a usable replica identity)
// before its first row, and a published table that loses its usable
// replica identity is moved out as the policy says, so the application's
// UPDATE and DELETE keep working. A publication that holds tables by its
// definition (FOR ALL TABLES, TABLES IN SCHEMA) holds its new tables by
// itself and cannot let one out: the capture names none in it, and reports
// a table it holds that has no usable replica identity. The publications
// it looks after are listed in siphon.capture_publications.
//
// The trigger never makes the application's DDL fail: whatever goes wrong
// in it is caught, recorded as a schema change the apply refuses (so the
// failure is not silent), or at worst raised as a WARNING.

// captureState is what the source has of the capture, read from the
// catalogs alone (any role may read them; schema siphon is not usable by
// other roles).
type captureState struct {
	installed bool // the triggers exist and call siphon's functions
	current   bool // and the function is this version's
	// published: c's publication holds the capture's table, or does not
	// exist yet. The capture looks after a publication that holds it.
	published bool
	// holds: c's publication exists and holds the capture's table.
	holds     bool
	superuser bool
	// installer is the owner of the capture's triggers ("" when none).
	installer string
	// foreign lists what in schema siphon, or of the capture's triggers,
	// belongs to a role other than the installer (or, with no install, to
	// a role other than the one that would install): a capture another
	// role could change is not siphon's.
	foreign []string
}

// captureStateQuery reads captureState: $1-$3 the triggers, $4 the
// version, $5 the publication, $6 the capture table's name. It reads
// pg_publication_rel, not the view pg_publication_tables, which opens
// every published table: one dropped meanwhile failed the query ("could
// not open relation with OID").
const captureStateQuery = `
WITH triggers AS (
  SELECT e.evtname, e.evtowner, e.evtfoid, p.proname, pn.nspname
  FROM pg_catalog.pg_event_trigger e JOIN pg_catalog.pg_proc p ON p.oid = e.evtfoid JOIN pg_catalog.pg_namespace pn ON pn.oid = p.pronamespace
  WHERE e.evtname IN ($1, $2, $3)),
installer AS (
  SELECT coalesce((SELECT t.evtowner FROM triggers t WHERE t.evtname = $2), (SELECT r.oid FROM pg_catalog.pg_roles r WHERE r.rolname = current_user)) AS oid),
owned AS (
  SELECT 'schema siphon' AS what, n.nspowner AS owner FROM pg_catalog.pg_namespace n WHERE n.nspname = 'siphon'
  UNION ALL SELECT 'relation siphon.' || pg_catalog.quote_ident(c.relname), c.relowner
    FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'siphon'
  UNION ALL SELECT 'function ' || p.oid::pg_catalog.regprocedure::pg_catalog.text, p.proowner
    FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'siphon'
  UNION ALL SELECT 'type siphon.' || pg_catalog.quote_ident(t.typname), t.typowner
    FROM pg_catalog.pg_type t JOIN pg_catalog.pg_namespace n ON n.oid = t.typnamespace WHERE n.nspname = 'siphon' AND t.typrelid = 0 AND t.typelem = 0
  UNION ALL SELECT 'event trigger ' || t.evtname, t.evtowner FROM triggers t)
SELECT
  (SELECT pg_catalog.count(*) FROM triggers t WHERE t.nspname = 'siphon') = 3,
  coalesce((SELECT pg_catalog.obj_description(p.oid, 'pg_proc') FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
            WHERE n.nspname = 'siphon' AND p.proname = 'capture_ddl' AND p.pronargs = 3) = $4, false),
  NOT EXISTS (SELECT FROM pg_catalog.pg_publication WHERE pubname = $5),
  EXISTS (SELECT FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'siphon' AND c.relname = $6)
  AND EXISTS (SELECT FROM pg_catalog.pg_publication p WHERE p.pubname = $5 AND (p.puballtables
            OR EXISTS (SELECT FROM pg_catalog.pg_publication_rel r JOIN pg_catalog.pg_class c ON c.oid = r.prrelid
                       JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE r.prpubid = p.oid AND n.nspname = 'siphon' AND c.relname = $6)
            OR EXISTS (SELECT FROM pg_catalog.pg_publication_namespace pn JOIN pg_catalog.pg_namespace n ON n.oid = pn.pnnspid
                       WHERE pn.pnpubid = p.oid AND n.nspname = 'siphon'))),
  (SELECT r.rolsuper FROM pg_catalog.pg_roles r WHERE r.rolname = current_user),
  coalesce((SELECT r.rolname::pg_catalog.text FROM pg_catalog.pg_roles r, triggers t WHERE t.evtname = $2 AND r.oid = t.evtowner), ''),
  coalesce((SELECT pg_catalog.array_agg(o.what || ' (owned by ' || coalesce(pg_catalog.pg_get_userbyid(o.owner)::pg_catalog.text, '?') || ')' ORDER BY o.what)
            FROM owned o, installer i WHERE o.owner IS DISTINCT FROM i.oid), '{}')
    || coalesce((SELECT pg_catalog.array_agg('event trigger ' || t.evtname || ' runs ' || t.nspname || '.' || t.proname || '()')
                 FROM triggers t WHERE t.nspname <> 'siphon'), '{}')`

// readCapture reads the capture's state for c's publication.
func (c *Conn) readCapture(ctx context.Context, q querier) (captureState, error) {
	var s captureState
	err := q.QueryRow(ctx, captureStateQuery, captureCallerTrig, captureEndTrigger, captureDropTrigger, captureVersion,
		c.opts.publication, captureTableName).
		Scan(&s.installed, &s.current, &s.published, &s.holds, &s.superuser, &s.installer, &s.foreign)
	if err != nil {
		return s, fmt.Errorf("read the schema capture: %w", err)
	}
	s.published = s.published || s.holds
	return s, nil
}

// ready reports whether the capture is siphon's, this version's, and
// looks after c's publication.
func (s captureState) ready() bool {
	return s.installed && s.current && s.published && len(s.foreign) == 0
}

// foreignError is the error for a capture another role could change.
func (s captureState) foreignError() error {
	return &SchemaCaptureForeignError{Objects: s.foreign}
}

// InstallSchemaCapture installs the capture of schema changes in the
// source database, or brings it up to this version's, and makes it look
// after c's publication (see the package documentation on schema
// changes). Nothing else installs it: without it, streams carry no schema
// changes and the apply follows only the column changes it can see (see
// [WithoutSchemaCapture]).
//
// It installs, in schema siphon, owned by the role of c: the event
// triggers siphon_capture_caller, siphon_capture_ddl (ddl_command_end)
// and siphon_capture_drop (sql_drop), the functions they run, and the
// table siphon.schema_changes, which it adds to c's publication (now, or
// when the publication is created). It costs about a millisecond per DDL
// statement on the source. It trusts the source's superusers: see
// SECURITY.md for what a schema change of any other role meets on a
// target.
//
// It needs a superuser: any other role gets an error wrapping
// [ErrCaptureNeedsSuperuser]. It refuses, with a
// [*SchemaCaptureForeignError] naming them, to use anything in schema
// siphon that belongs to another role (a database owner could otherwise
// plant a function the trigger would run as a superuser). Another session
// installing at the same time is waited for up to 10 seconds.
//
// A REPLICATION role that is not a superuser streams, backs up and
// detaches with a capture a superuser installed for its publication: the
// superuser calls InstallSchemaCapture on a Conn with the same
// WithPublication, WithTables and WithKeylessTables. Schema changes made
// before the capture was installed are not captured. [Conn.Detach]
// removes it with the last publication it looks after, as a superuser.
func (c *Conn) InstallSchemaCapture(ctx context.Context) error {
	if err := c.installCapture(ctx); err != nil {
		return errorf("siphon: install schema capture: %w", err)
	}
	return nil
}

// installLockTimeout bounds the wait for another installation.
const installLockTimeout = 10 * time.Second

func (c *Conn) installCapture(ctx context.Context) error {
	return pgx.BeginFunc(ctx, c.pool, func(tx pgx.Tx) error {
		// Everything the install creates is resolved in pg_catalog: the
		// session's search_path may name schemas other roles write.
		if _, err := tx.Exec(ctx, "SELECT pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true), pg_catalog.set_config('lock_timeout', $1, true)",
			fmt.Sprintf("%dms", installLockTimeout.Milliseconds())); err != nil {
			return err
		}
		// One installation at a time per database: CREATE OR REPLACE of
		// the same function in two sessions at once fails.
		if _, err := tx.Exec(ctx, "SELECT pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtext('siphon schema capture'))"); err != nil {
			if pgerr.Is(err, pgerrcode.LockNotAvailable) {
				return fmt.Errorf("another session held siphon's install lock (advisory lock hashtext('siphon schema capture')) for %v; find it in pg_locks and end it: %w", installLockTimeout, err)
			}
			return err
		}
		s, err := c.readCapture(ctx, tx)
		if err != nil {
			return err
		}
		if !s.superuser {
			return fmt.Errorf("%w: connect as a superuser and call InstallSchemaCapture with the same WithPublication and WithTables, or accept that only added and dropped columns are followed (WithoutSchemaCapture says so)", ErrCaptureNeedsSuperuser)
		}
		if len(s.foreign) > 0 {
			return s.foreignError()
		}
		// The capture's own DDL is not a schema change of the database:
		// an installed capture leaves it out (version 1 read a setting).
		if _, err := tx.Exec(ctx, `SELECT pg_catalog.set_config('siphon.capturing', 'on', true);
			DO $own$ BEGIN
			  IF pg_catalog.to_regclass('siphon.capture_pending') IS NOT NULL THEN
			    `+markOwnSQL+`;
			  END IF;
			END $own$`); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, captureSQL); err != nil {
			return err
		}
		return c.registerCapture(ctx, tx)
	})
}

// captureKeyless names each KeylessTables policy as the capture's
// function reads it.
var captureKeyless = map[KeylessTables]string{KeylessSkip: "skip", KeylessInsertsOnly: "inserts", KeylessFull: "full"}

// registerCapture makes the capture look after c's publication and puts
// the capture's table in it, when it exists (the capture adds it to a
// publication it looks after when it is created).
func (c *Conn) registerCapture(ctx context.Context, tx pgx.Tx) error {
	var inserts *string
	if c.opts.keyless == KeylessInsertsOnly {
		name := c.opts.publication + insertsSuffix
		inserts = &name
	}
	var tables []byte
	if len(c.tables) > 0 {
		pairs := make([][2]string, len(c.tables))
		for i, t := range c.tables {
			pairs[i] = [2]string{t.Schema, t.Name}
		}
		tables, _ = json.Marshal(pairs) // strings only: cannot fail
	}
	_, err := tx.Exec(ctx, `INSERT INTO siphon.capture_publications (publication, inserts_publication, keyless, tables)
		VALUES ($1, $2, $3, $4::pg_catalog.jsonb)
		ON CONFLICT (publication) DO UPDATE SET inserts_publication = excluded.inserts_publication,
		  keyless = excluded.keyless, tables = excluded.tables`,
		c.opts.publication, inserts, captureKeyless[c.opts.keyless], tables)
	if err != nil {
		return err
	}
	_, err = tx.Exec(ctx, `DO $add$ BEGIN
		  IF EXISTS (SELECT FROM pg_catalog.pg_publication p WHERE p.pubname = `+sqltext.Literal(c.opts.publication)+` AND NOT p.puballtables
		               AND NOT EXISTS (SELECT FROM pg_catalog.pg_publication_rel r WHERE r.prpubid = p.oid AND r.prrelid = '`+captureTable+`'::pg_catalog.regclass)
		               AND NOT EXISTS (SELECT FROM pg_catalog.pg_publication_namespace pn WHERE pn.pnpubid = p.oid
		                                 AND pn.pnnspid = 'siphon'::pg_catalog.regnamespace)) THEN
		    ALTER PUBLICATION `+sqltext.Ident(c.opts.publication)+` ADD TABLE `+captureTable+`;
		  END IF;
		END $add$`)
	return err
}

// ensureCapture reports whether the capture looks after c's publication,
// and otherwise says once what siphon follows without it. It installs
// nothing. A capture whose objects another role owns is an error: its rows
// are not siphon's.
func (c *Conn) ensureCapture(ctx context.Context) (bool, error) {
	if c.opts.noSchemaCapture {
		return false, nil
	}
	s, err := c.readCapture(ctx, c.pool)
	if err != nil {
		return false, err
	}
	if len(s.foreign) > 0 && (s.installed || s.holds) {
		return false, errorf("siphon: schema capture: %w", s.foreignError())
	}
	if s.ready() {
		return true, nil
	}
	c.captureWarning.Do(func() {
		c.log.Warn("schema changes are not captured for this publication: "+
			"added and dropped columns are followed, other schema changes stop the apply; "+
			"have a superuser call InstallSchemaCapture with the same WithPublication, or give WithoutSchemaCapture",
			"publication", c.opts.publication)
	})
	return false, nil
}

// removeCapture stops the capture looking after c's publication once it
// is gone and, when no publication it looks after exists any more, removes
// it. With lastSlot (no change-stream slot of the database remains), the
// publications it looks after are read by no slot: it drops them first,
// so that the last Detach removes everything whatever the order in which
// Conns detached. Only a superuser may: for any other role the capture
// stays as it is, and removeCapture says so at Warn and returns nil (the
// role's own objects are gone; the capture is the superuser's).
func (c *Conn) removeCapture(ctx context.Context, q querier, lastSlot bool) error {
	s, err := c.readCapture(ctx, q)
	if err != nil {
		return err
	}
	var present bool
	if err := q.QueryRow(ctx, "SELECT EXISTS (SELECT FROM pg_catalog.pg_namespace WHERE nspname = 'siphon')").Scan(&present); err != nil || !present && !s.installed {
		return err
	}
	if !s.superuser {
		if s.installed {
			c.log.Warn("the schema capture stays installed: only a superuser may remove it (Detach on a superuser's Conn with the same WithPublication)",
				"installer", s.installer)
		}
		return nil
	}
	if len(s.foreign) > 0 {
		return s.foreignError()
	}
	if lastSlot {
		if err := dropCapturePublications(ctx, q); err != nil {
			return err
		}
	}
	var live int
	err = q.QueryRow(ctx, `WITH gone AS (DELETE FROM siphon.capture_publications r
		                    WHERE NOT EXISTS (SELECT FROM pg_catalog.pg_publication WHERE pubname = r.publication) RETURNING r.publication)
		SELECT pg_catalog.count(*) FROM siphon.capture_publications r
		WHERE r.publication NOT IN (SELECT publication FROM gone) AND EXISTS (SELECT FROM pg_catalog.pg_publication WHERE pubname = r.publication)`).Scan(&live)
	if err != nil && !pgerr.Is(err, pgerrcode.UndefinedTable) {
		return err
	}
	if live > 0 {
		c.log.Info("schema capture kept: it looks after publications that exist", "publications", live)
		return nil
	}
	_, err = q.Exec(ctx, `DROP EVENT TRIGGER IF EXISTS `+captureCallerTrig+`;
		DROP EVENT TRIGGER IF EXISTS `+captureEndTrigger+`;
		DROP EVENT TRIGGER IF EXISTS `+captureDropTrigger+`;
		DROP FUNCTION IF EXISTS siphon.capture_event(), siphon.capture_caller(), siphon.capture_ddl(pg_catalog.text, pg_catalog.text, pg_catalog.text),
		  siphon.capture_ddl(pg_catalog.text, pg_catalog.text, pg_catalog.text, pg_catalog.text),
		  siphon.capture_failed(pg_catalog.text, pg_catalog.text), siphon.capture_pending_row();
		DROP TABLE IF EXISTS siphon.schema_changes, siphon.capture_publications, siphon.capture_pending`)
	if err != nil {
		return err
	}
	// The schema goes too when nothing else lives there (an apply's
	// bookkeeping may).
	if _, err := q.Exec(ctx, "DROP SCHEMA IF EXISTS siphon"); err != nil && !pgerr.Is(err, pgerrcode.DependentObjectsStillExist) {
		return err
	}
	return nil
}

// dropCapturePublications drops the publications the capture looks after
// (siphon's: InstallSchemaCapture registered them), once no slot of the
// database may read them.
func dropCapturePublications(ctx context.Context, q querier) error {
	rows, err := q.Query(ctx, `SELECT p.pubname::pg_catalog.text FROM siphon.capture_publications r
		JOIN pg_catalog.pg_publication p ON p.pubname IN (r.publication, r.inserts_publication) ORDER BY 1`)
	var names []string
	if err == nil {
		names, err = pgx.CollectRows(rows, pgx.RowTo[string])
	}
	switch {
	case pgerr.Is(err, pgerrcode.UndefinedTable): // schema siphon holds an apply's bookkeeping only
		return nil
	case err != nil:
		return fmt.Errorf("list the publications the capture looks after: %w", err)
	}
	for _, name := range names {
		if _, err := q.Exec(ctx, "DROP PUBLICATION IF EXISTS "+sqltext.Ident(name)); err != nil {
			return fmt.Errorf("drop publication %q, which no slot reads any more: %w", name, err)
		}
	}
	return nil
}

// isCaptureTable reports whether name is the capture's table, or a
// relation named like it that is not siphon's (see checkCaptureRelation).
func isCaptureTable(name canonical.TableName) bool {
	return name.Schema == "siphon" && (name.Name == captureTableName || name.Name == forgedCaptureName)
}

// forgedCaptureName is the name the stream gives a relation named
// siphon.schema_changes that is not the capture's table: its rows are
// never read as schema changes, nor delivered as data.
const forgedCaptureName = captureTableName + " (not siphon's)"

// captureRelationQuery reports whether the relation $1 is the capture's
// table: siphon.schema_changes, owned, as its schema is, by the superuser
// who owns the capture's ddl_command_end trigger ($2).
const captureRelationQuery = `
SELECT EXISTS (
  SELECT FROM pg_catalog.pg_class c
  JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
  JOIN pg_catalog.pg_event_trigger e ON e.evtname = $2 AND e.evtowner = c.relowner AND e.evtowner = n.nspowner
  JOIN pg_catalog.pg_roles r ON r.oid = e.evtowner AND r.rolsuper
  WHERE c.oid = $1::pg_catalog.int8::pg_catalog.oid AND n.nspname = 'siphon' AND c.relname = 'schema_changes')`

// checkCaptureRelation renames rel, a relation a change stream decodes,
// to forgedCaptureName when it is named like the capture's table but is
// not the table the capture installed, by its OID: a database owner could
// otherwise make a schema siphon and a table of that name, write a row
// that claims a superuser's statement into it, and drop both again before
// the stream starts, in a publication of all tables. A row of a table the
// capture has since removed reads as forged too: nothing vouches for it
// any more.
func (c *Conn) checkCaptureRelation(ctx context.Context, rel *pgoutput.Relation) error {
	if rel.Schema != "siphon" || rel.Name != captureTableName {
		return nil
	}
	var genuine bool
	if err := c.pool.QueryRow(ctx, captureRelationQuery, int64(rel.ID), captureEndTrigger).Scan(&genuine); err != nil {
		return fmt.Errorf("check the relation siphon.%s (oid %d): %w", captureTableName, rel.ID, err)
	}
	if !genuine {
		rel.Name = forgedCaptureName
	}
	return nil
}

// withoutCaptureTable returns tables without the capture's table.
func withoutCaptureTable(tables []canonical.TableName) []canonical.TableName {
	return slices.DeleteFunc(tables, isCaptureTable)
}

// captureChecks is Preflight's check of the schema capture.
func (c *Conn) captureChecks(ctx context.Context) ([]Check, error) {
	s, err := c.readCapture(ctx, c.pool)
	if err != nil {
		return nil, err
	}
	ch := Check{Name: CheckSchemaCapture, Status: CheckOK,
		Needed: "schema changes (DDL) carried by the stream and applied at their place, so chains and replicas survive migrations"}
	const followed = "the stream then carries no schema changes: siphon follows added and dropped columns, and an apply stops at any other schema change for it to be made by hand"
	switch {
	case len(s.foreign) > 0 && (s.installed || s.holds):
		ch.Status, ch.Found = CheckFailed, s.foreignError().Error()
		ch.Fix = "check what these objects do, then drop them (DROP SCHEMA siphon CASCADE, DROP EVENT TRIGGER) or give them to the installing superuser, and call InstallSchemaCapture"
	case c.opts.noSchemaCapture:
		ch.Status, ch.Found = CheckWarning, "WithoutSchemaCapture: "+followed
		ch.Fix = "leave out WithoutSchemaCapture, and have a superuser call InstallSchemaCapture"
	case s.ready():
		ch.Found = fmt.Sprintf("installed by %s (event trigger %s), looking after publication %q", s.installer, captureEndTrigger, c.opts.publication)
	default:
		ch.Status = CheckWarning
		ch.Found = "not installed for publication " + sqltext.Literal(c.opts.publication) + ": " + followed +
			". InstallSchemaCapture would install " + captureObjects
		ch.Fix = "have a superuser call InstallSchemaCapture on a Conn with the same WithPublication, WithTables and WithKeylessTables"
		if len(s.foreign) > 0 {
			ch.Found += "; it would refuse: " + s.foreignError().Error()
		}
		if s.superuser {
			ch.Fix = "call InstallSchemaCapture (the role is a superuser)"
		}
	}
	return []Check{ch}, nil
}

// isCaptureEntry reports whether a backup's entry is the schema capture's:
// Backup leaves siphon's schema out of the dump, but pg_dump keeps event
// triggers, which Restore leaves out (they are the source's machinery, and
// only a superuser may create them).
func isCaptureEntry(e pgdump.Entry) bool {
	return e.Is("EVENT TRIGGER", "", captureCallerTrig) || e.Is("EVENT TRIGGER", "", captureEndTrigger) || e.Is("EVENT TRIGGER", "", captureDropTrigger) ||
		e.Is("SCHEMA", "", "siphon") || strings.HasPrefix(e.Text, "COMMENT - SCHEMA siphon ")
}
