package siphon

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"

	"github.com/siphondb/siphon/canonical"
	"github.com/siphondb/siphon/internal/pgerr"
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
// publication of all tables (as WithKeylessTables says for a table without
// a usable replica identity) before its first row, and a published table
// that loses its usable replica identity is moved out as the policy says,
// so the application's UPDATE and DELETE never fail. The publications it
// looks after are listed in siphon.capture_publications.
//
// The trigger never makes the application's DDL fail: whatever goes wrong
// in it is caught, recorded as a schema change the apply refuses (so the
// failure is not silent), or at worst raised as a WARNING.

// captureVersion names the version of the capture's SQL; Conns install it
// again when the installed one differs.
const captureVersion = "siphon schema capture 1"

// The objects of the capture.
const (
	captureTable        = "siphon.schema_changes"
	captureTableName    = "schema_changes"
	captureRegistry     = "siphon.capture_publications"
	captureDescribeFunc = "siphon.capture_ddl"
	captureEndTrigger   = "siphon_capture_ddl"
	captureDropTrigger  = "siphon_capture_drop"
)

// captureSQL creates or replaces the capture's objects. The describing
// function runs with a fixed search_path and is not executable by others;
// the trigger function runs as its owner too, with the caller's
// search_path (which it records), so it names everything with its schema.
const captureSQL = `
CREATE SCHEMA IF NOT EXISTS siphon;
CREATE TABLE IF NOT EXISTS siphon.schema_changes (
  id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  change jsonb NOT NULL);
CREATE TABLE IF NOT EXISTS siphon.capture_publications (
  publication text PRIMARY KEY,
  inserts_publication text,
  keyless text NOT NULL,
  tables jsonb);
REVOKE ALL ON siphon.schema_changes, siphon.capture_publications FROM PUBLIC;

CREATE OR REPLACE FUNCTION siphon.capture_ddl(event text, tag text, path text, stack text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $capture$
DECLARE
  dropped jsonb;
  objects jsonb;
  commands int;
  made oid[];
  rels oid[];
  created oid[];
  candidates oid[];
  changes jsonb := '[]';
  statements text[] := '{}';
  failure text;
  empty bool;
  p record;
  t record;
  leaf record;
  change_id bigint;
BEGIN
  IF current_setting('siphon.capturing', true) = 'on' OR tag LIKE '% PUBLICATION' OR tag LIKE '% SUBSCRIPTION' THEN
    RETURN;
  END IF;
  IF event = 'sql_drop' THEN
    SELECT coalesce(jsonb_agg(jsonb_build_object('type', d.object_type, 'identity', d.object_identity, 'dropped', true)), '[]')
      INTO dropped FROM pg_event_trigger_dropped_objects() d
     WHERE d.original AND NOT d.is_temporary AND d.schema_name IS DISTINCT FROM 'siphon';
    PERFORM set_config('siphon.dropped', (coalesce(nullif(current_setting('siphon.dropped', true), ''), '[]')::jsonb || dropped)::text, true);
    RETURN;
  END IF;
  dropped := coalesce(nullif(current_setting('siphon.dropped', true), ''), '[]')::jsonb;
  PERFORM set_config('siphon.dropped', '', true);

  SELECT count(*),
         coalesce(jsonb_agg(jsonb_strip_nulls(jsonb_build_object('type', c.object_type, 'identity', c.object_identity,
                    'table', (SELECT jsonb_build_array(tn.nspname, tc.relname) FROM pg_class tc
                              JOIN pg_namespace tn ON tn.oid = tc.relnamespace WHERE tc.oid = o.rel))))
                  FILTER (WHERE NOT c.in_extension AND c.schema_name IS DISTINCT FROM 'siphon'
                            AND coalesce(c.schema_name, '') NOT LIKE 'pg\_temp%'), '[]'),
         coalesce(array_agg(c.objid) FILTER (WHERE c.classid = 'pg_class'::regclass AND c.object_type = 'table'
                    AND c.command_tag IN ('CREATE TABLE', 'CREATE TABLE AS', 'SELECT INTO') AND NOT c.in_extension), '{}'),
         coalesce(array_agg(o.rel) FILTER (WHERE o.rel IS NOT NULL), '{}')
    INTO commands, objects, made, rels
    FROM pg_event_trigger_ddl_commands() c
    LEFT JOIN LATERAL (SELECT CASE c.classid
        WHEN 'pg_class'::regclass THEN (
          SELECT CASE WHEN r.relkind IN ('i', 'I') THEN (SELECT i.indrelid FROM pg_index i WHERE i.indexrelid = r.oid)
                      WHEN r.relkind = 'S' THEN (SELECT d.refobjid FROM pg_depend d WHERE d.classid = 'pg_class'::regclass
                                                   AND d.objid = r.oid AND d.refclassid = 'pg_class'::regclass
                                                   AND d.deptype IN ('a', 'i') LIMIT 1)
                      ELSE r.oid END
          FROM pg_class r WHERE r.oid = c.objid)
        WHEN 'pg_constraint'::regclass THEN (SELECT nullif(k.conrelid, 0) FROM pg_constraint k WHERE k.oid = c.objid)
        WHEN 'pg_trigger'::regclass THEN (SELECT g.tgrelid FROM pg_trigger g WHERE g.oid = c.objid)
        WHEN 'pg_attrdef'::regclass THEN (SELECT a.adrelid FROM pg_attrdef a WHERE a.oid = c.objid)
        END AS rel) o ON true;
  -- Temporary objects, an extension's own, siphon's: nothing to replay.
  IF commands > 0 AND jsonb_array_length(objects) = 0 OR tag LIKE 'DROP %' AND jsonb_array_length(dropped) = 0 THEN
    RETURN;
  END IF;

  IF tag IN ('CREATE TABLE', 'CREATE TABLE AS', 'SELECT INTO', 'ALTER TABLE', 'ALTER INDEX', 'DROP INDEX') THEN
    created := coalesce(nullif(current_setting('siphon.created', true), ''), '{}')::oid[] || made;
    PERFORM set_config('siphon.created', created::text, true);
    PERFORM set_config('siphon.capturing', 'on', true);
    -- The tables whose place in a publication the command may change: those
    -- it touched or the transaction created, and the partitioned tables
    -- above them; a dropped index may have been a replica identity.
    SELECT coalesce(array_agg(DISTINCT s.oid), '{}') INTO candidates FROM (
        SELECT u.oid FROM unnest(rels || created) AS u(oid)
        UNION SELECT a.relid FROM unnest(rels || created) AS u(oid) CROSS JOIN LATERAL pg_partition_ancestors(u.oid) a) s;
    IF tag IN ('DROP INDEX', 'ALTER INDEX') THEN
      candidates := candidates || ARRAY(SELECT x.oid FROM pg_class x WHERE x.relreplident = 'i');
    END IF;
    BEGIN
      FOR p IN SELECT r.* FROM siphon.capture_publications r JOIN pg_publication pb ON pb.pubname = r.publication LOOP
        FOR t IN
          SELECT c.oid, c.oid::regclass::text AS name, jsonb_build_array(n.nspname, c.relname) AS pair,
                 ` + usableIdentity + ` AS usable,
                 EXISTS (SELECT FROM pg_publication_rel pr JOIN pg_publication pb ON pb.oid = pr.prpubid
                         WHERE pr.prrelid = c.oid AND pb.pubname = p.publication) AS published,
                 EXISTS (SELECT FROM pg_publication_rel pr JOIN pg_publication pb ON pb.oid = pr.prpubid
                         WHERE pr.prrelid = c.oid AND pb.pubname = p.inserts_publication) AS inserts_only
          FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
          WHERE c.oid = ANY (candidates) AND ` + isUserTable + `
            AND CASE WHEN p.tables IS NULL THEN NOT c.relispartition
                     ELSE p.tables @> jsonb_build_array(jsonb_build_array(n.nspname, c.relname)) END
        LOOP
          IF t.published AND NOT t.usable OR NOT t.published AND NOT t.inserts_only AND p.tables IS NULL AND t.oid = ANY (created) THEN
            IF NOT t.published THEN
              -- Rows written before the table joins the publication are
              -- not decoded: only an empty table, or one a CREATE TABLE AS
              -- just filled (the target runs the same statement), joins.
              EXECUTE format('SELECT NOT EXISTS (SELECT FROM %s)', t.name) INTO empty;
              CONTINUE WHEN NOT empty AND NOT t.oid = ANY (made);
            END IF;
            IF NOT t.usable AND p.keyless = 'full' THEN
              FOR leaf IN SELECT x.oid FROM pg_class x
                       WHERE (x.oid = t.oid AND x.relkind = 'r' OR x.oid IN (SELECT relid FROM pg_partition_tree(t.oid) WHERE isleaf))
                         AND x.relreplident <> 'f' LOOP
                statements := statements || format('ALTER TABLE %s REPLICA IDENTITY FULL', leaf.oid::regclass);
                EXECUTE statements[cardinality(statements)];
              END LOOP;
              IF NOT t.published THEN
                EXECUTE format('ALTER PUBLICATION %I ADD TABLE %s', p.publication, t.name);
                changes := changes || jsonb_build_object('publication', p.publication, 'table', t.pair, 'action', 'added');
              END IF;
            ELSIF t.usable THEN
              EXECUTE format('ALTER PUBLICATION %I ADD TABLE %s', p.publication, t.name);
              changes := changes || jsonb_build_object('publication', p.publication, 'table', t.pair, 'action', 'added');
            ELSE
              IF t.published THEN
                EXECUTE format('ALTER PUBLICATION %I DROP TABLE %s', p.publication, t.name);
              END IF;
              IF p.keyless = 'inserts' AND p.inserts_publication IS NOT NULL THEN
                EXECUTE format('ALTER PUBLICATION %I ADD TABLE %s', p.inserts_publication, t.name);
                changes := changes || jsonb_build_object('publication', p.publication, 'table', t.pair, 'action', 'inserts only');
              ELSIF t.published THEN
                changes := changes || jsonb_build_object('publication', p.publication, 'table', t.pair, 'action', 'removed');
              END IF;
            END IF;
          END IF;
        END LOOP;
      END LOOP;
    EXCEPTION WHEN OTHERS THEN
      failure := SQLERRM;
    END;
    PERFORM set_config('siphon.capturing', 'off', true);
  END IF;

  INSERT INTO siphon.schema_changes (change) VALUES (jsonb_strip_nulls(jsonb_build_object(
      'tag', tag, 'query', current_query(), 'stack', stack, 'search_path', path, 'role', session_user,
      'objects', objects || dropped, 'publication', changes, 'statements', to_jsonb(statements),
      'publication_error', failure)))
    RETURNING schema_changes.id INTO change_id;
  DELETE FROM siphon.schema_changes WHERE schema_changes.id = change_id;
END
$capture$;

CREATE OR REPLACE FUNCTION siphon.capture_failed(tag text, failure text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $failed$
DECLARE
  change_id bigint;
BEGIN
  INSERT INTO siphon.schema_changes (change)
    VALUES (jsonb_build_object('tag', tag, 'query', current_query(), 'error', failure, 'role', session_user))
    RETURNING schema_changes.id INTO change_id;
  DELETE FROM siphon.schema_changes WHERE schema_changes.id = change_id;
END
$failed$;

CREATE OR REPLACE FUNCTION siphon.capture_event() RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER AS $event$
DECLARE
  stack text;
BEGIN
  GET DIAGNOSTICS stack = PG_CONTEXT;
  PERFORM siphon.capture_ddl(TG_EVENT, TG_TAG, pg_catalog.current_setting('search_path'), stack);
EXCEPTION WHEN OTHERS THEN
  BEGIN
    PERFORM siphon.capture_failed(TG_TAG, SQLERRM);
  EXCEPTION WHEN OTHERS THEN
    RAISE WARNING 'siphon: the schema change was not captured: %', SQLERRM;
  END;
END
$event$;

REVOKE ALL ON FUNCTION siphon.capture_ddl(text, text, text, text), siphon.capture_failed(text, text) FROM PUBLIC;
COMMENT ON FUNCTION siphon.capture_ddl(text, text, text, text) IS '` + captureVersion + `';

DO $triggers$ BEGIN
  IF NOT EXISTS (SELECT FROM pg_event_trigger WHERE evtname = '` + captureEndTrigger + `') THEN
    CREATE EVENT TRIGGER ` + captureEndTrigger + ` ON ddl_command_end EXECUTE FUNCTION siphon.capture_event();
  END IF;
  IF NOT EXISTS (SELECT FROM pg_event_trigger WHERE evtname = '` + captureDropTrigger + `') THEN
    CREATE EVENT TRIGGER ` + captureDropTrigger + ` ON sql_drop EXECUTE FUNCTION siphon.capture_event();
  END IF;
END $triggers$;
-- Under session_replication_role = replica too: a restore with triggers
-- disabled, or siphon's own apply into a database that is itself a source.
ALTER EVENT TRIGGER ` + captureEndTrigger + ` ENABLE ALWAYS;
ALTER EVENT TRIGGER ` + captureDropTrigger + ` ENABLE ALWAYS;`

// captureState is what the source has of the capture.
type captureState struct {
	installed  bool // the triggers exist
	current    bool // and the function is this version's
	registered bool // the capture looks after c's publication
	// published: c's publication holds the capture's table, or does not
	// exist yet.
	published bool
	superuser bool
}

// readCapture reads the capture's state for c's publication.
func (c *Conn) readCapture(ctx context.Context, q querier) (captureState, error) {
	var s captureState
	var registry bool
	err := q.QueryRow(ctx, `SELECT
		  (SELECT count(*) = 2 FROM pg_event_trigger WHERE evtname IN ($1, $2)),
		  coalesce(obj_description(to_regprocedure('siphon.capture_ddl(text,text,text,text)'), 'pg_proc') = $3, false),
		  to_regclass('siphon.capture_publications') IS NOT NULL AND has_table_privilege('siphon.capture_publications', 'SELECT'),
		  NOT EXISTS (SELECT FROM pg_publication WHERE pubname = $4)
		    OR EXISTS (SELECT FROM pg_publication_tables WHERE pubname = $4 AND schemaname = 'siphon' AND tablename = $5),
		  (SELECT rolsuper FROM pg_roles WHERE rolname = current_user)`,
		captureEndTrigger, captureDropTrigger, captureVersion, c.opts.publication, captureTableName).
		Scan(&s.installed, &s.current, &registry, &s.published, &s.superuser)
	if err == nil && registry {
		err = q.QueryRow(ctx, "SELECT EXISTS (SELECT FROM siphon.capture_publications WHERE publication = $1)", c.opts.publication).Scan(&s.registered)
	}
	if err != nil {
		return s, fmt.Errorf("read the schema capture: %w", err)
	}
	return s, nil
}

// ready reports whether the capture looks after c's publication as this
// version does.
func (s captureState) ready() bool { return s.installed && s.current && s.registered && s.published }

// InstallSchemaCapture installs the capture of schema changes in the
// source database (an event trigger and its function, in schema siphon),
// or brings it up to this version's, and makes it look after c's
// publication (see the package documentation on schema changes). It needs
// a superuser: any other role gets an error wrapping
// [ErrCaptureNeedsSuperuser], and then siphon follows only the column
// changes it can see in the stream (see [WithoutSchemaCapture]).
//
// Conns install it themselves when they create their publication or start
// a stream, as far as their role may, unless [WithoutSchemaCapture] is
// given; call it to install it as a superuser for a Conn whose own role
// may not. Schema changes made before the capture was installed are not
// captured. [Conn.Detach] removes it with the last publication it looks
// after.
func (c *Conn) InstallSchemaCapture(ctx context.Context) error {
	if err := c.installCapture(ctx); err != nil {
		return errorf("siphon: install schema capture: %w", err)
	}
	return nil
}

func (c *Conn) installCapture(ctx context.Context) error {
	return pgx.BeginFunc(ctx, c.pool, func(tx pgx.Tx) error {
		// One installation at a time per database: CREATE OR REPLACE of
		// the same function in two sessions at once fails.
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock(hashtext('siphon schema capture'))"); err != nil {
			return err
		}
		s, err := c.readCapture(ctx, tx)
		if err != nil {
			return err
		}
		if !s.superuser {
			return fmt.Errorf("%w: connect as a superuser and call InstallSchemaCapture with the same WithPublication and WithTables, or accept that only added and dropped columns are followed (WithoutSchemaCapture says so)", ErrCaptureNeedsSuperuser)
		}
		// The capture's own DDL is not a schema change of the database:
		// an installed trigger leaves it out (see siphon.capturing).
		if _, err := tx.Exec(ctx, "SELECT set_config('siphon.capturing', 'on', true)"); err != nil {
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
// the capture's table in it, when it exists.
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
		VALUES ($1, $2, $3, $4::jsonb)
		ON CONFLICT (publication) DO UPDATE SET inserts_publication = excluded.inserts_publication,
		  keyless = excluded.keyless, tables = excluded.tables`,
		c.opts.publication, inserts, captureKeyless[c.opts.keyless], tables)
	if err != nil {
		return err
	}
	_, err = tx.Exec(ctx, `DO $add$ BEGIN
		  IF EXISTS (SELECT FROM pg_publication WHERE pubname = `+sqltext.Literal(c.opts.publication)+`)
		     AND NOT EXISTS (SELECT FROM pg_publication_tables WHERE pubname = `+sqltext.Literal(c.opts.publication)+`
		                     AND schemaname = 'siphon' AND tablename = '`+captureTableName+`') THEN
		    ALTER PUBLICATION `+sqltext.Ident(c.opts.publication)+` ADD TABLE `+captureTable+`;
		  END IF;
		END $add$`)
	return err
}

// ensureCapture installs the capture, or brings it up to date, when c
// captures schema changes and its role may; otherwise it says once what
// siphon follows without it. It reports whether the capture looks after
// c's publication.
func (c *Conn) ensureCapture(ctx context.Context) (bool, error) {
	if c.opts.noSchemaCapture {
		return false, nil
	}
	s, err := c.readCapture(ctx, c.pool)
	if err != nil {
		return false, err
	}
	switch {
	case s.ready():
		return true, nil
	case s.superuser:
		if err := c.installCapture(ctx); err != nil {
			return false, errorf("siphon: install schema capture: %w", err)
		}
		return true, nil
	}
	c.captureWarning.Do(func() {
		c.log.Warn("schema changes are not captured: the role is not a superuser (event triggers need one); "+
			"added and dropped columns are followed, other schema changes stop the apply: "+
			"call InstallSchemaCapture as a superuser, or give WithoutSchemaCapture", "publication", c.opts.publication)
	})
	return s.installed && s.registered && s.published, nil
}

// removeCapture stops the capture looking after c's publication once it
// is gone and, when no publication it looks after exists any more, removes
// it. q runs as a role that may (a superuser), or the capture is left as it
// is with an error.
func (c *Conn) removeCapture(ctx context.Context, q querier) error {
	var present bool
	if err := q.QueryRow(ctx, "SELECT to_regclass('siphon.capture_publications') IS NOT NULL OR EXISTS (SELECT FROM pg_event_trigger WHERE evtname IN ($1, $2))",
		captureEndTrigger, captureDropTrigger).Scan(&present); err != nil || !present {
		return err
	}
	var superuser bool
	if err := q.QueryRow(ctx, "SELECT rolsuper FROM pg_roles WHERE rolname = current_user").Scan(&superuser); err != nil {
		return err
	}
	if !superuser {
		return fmt.Errorf("%w: the schema capture stays installed; remove it as a superuser (Detach with the same WithPublication)", ErrCaptureNeedsSuperuser)
	}
	var live int
	err := q.QueryRow(ctx, `WITH gone AS (DELETE FROM siphon.capture_publications r
		                    WHERE NOT EXISTS (SELECT FROM pg_publication WHERE pubname = r.publication) RETURNING r.publication)
		SELECT count(*) FROM siphon.capture_publications r
		WHERE r.publication NOT IN (SELECT publication FROM gone) AND EXISTS (SELECT FROM pg_publication WHERE pubname = r.publication)`).Scan(&live)
	if err != nil && !pgerr.Is(err, pgerrcode.UndefinedTable) {
		return err
	}
	if live > 0 {
		c.log.Info("schema capture kept: it looks after publications that exist", "publications", live)
		return nil
	}
	_, err = q.Exec(ctx, `DROP EVENT TRIGGER IF EXISTS `+captureEndTrigger+`;
		DROP EVENT TRIGGER IF EXISTS `+captureDropTrigger+`;
		DROP FUNCTION IF EXISTS siphon.capture_event(), siphon.capture_ddl(text, text, text, text), siphon.capture_failed(text, text);
		DROP TABLE IF EXISTS siphon.schema_changes, siphon.capture_publications`)
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

// isCaptureTable reports whether name is the capture's table.
func isCaptureTable(name canonical.TableName) bool {
	return name.Schema == "siphon" && name.Name == captureTableName
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
	case c.opts.noSchemaCapture:
		ch.Status, ch.Found = CheckWarning, "WithoutSchemaCapture: "+followed
		ch.Fix = "leave out WithoutSchemaCapture to capture schema changes"
	case s.ready():
		ch.Found = fmt.Sprintf("installed (event trigger %s), looking after publication %q", captureEndTrigger, c.opts.publication)
	case s.superuser:
		ch.Found = "not installed yet; the role is a superuser, so siphon installs it when it creates the publication or starts a stream"
	default:
		ch.Status = CheckWarning
		ch.Found = "not installed for publication " + sqltext.Literal(c.opts.publication) + ", and the role is not a superuser (event triggers need one): " + followed
		ch.Fix = "have a superuser call InstallSchemaCapture on a Conn with the same WithPublication, WithTables and WithKeylessTables"
	}
	return []Check{ch}, nil
}

// isCaptureEntry reports whether a backup's entry is the schema capture's:
// Backup leaves siphon's schema out of the dump, but pg_dump keeps event
// triggers, which Restore leaves out (they are the source's machinery, and
// only a superuser may create them).
func isCaptureEntry(e pgdump.Entry) bool {
	return e.Is("EVENT TRIGGER", "", captureEndTrigger) || e.Is("EVENT TRIGGER", "", captureDropTrigger) ||
		e.Is("SCHEMA", "", "siphon") || strings.HasPrefix(e.Text, "COMMENT - SCHEMA siphon ")
}
