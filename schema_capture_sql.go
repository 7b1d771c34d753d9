package siphon

// The SQL of the schema capture (see schema_capture.go for what it does
// and SECURITY.md for whom it trusts).
//
// It runs inside the user's database for every role's DDL, so it is
// written against the roles it does not trust:
//   - siphon.capture_event and the functions it calls are SECURITY DEFINER
//     with search_path pinned to pg_catalog, pg_temp; every type and
//     function is named with its schema, variables included (pg_temp is
//     never searched for functions or operators, and comes last for types
//     and tables);
//   - siphon.capture_caller is the only function that runs as the caller:
//     it reads the caller's role and effective schemas (which a SECURITY
//     DEFINER function cannot see) and hands them on in a setting; it
//     names everything with its schema and has nothing to give away;
//   - the state the capture keeps between events (objects sql_drop saw,
//     tables the transaction created, "the capture's own statement") is in
//     the unlogged table siphon.capture_pending, which no other role can
//     write: no setting another role can set switches the capture on, off,
//     or to failure;
//   - every event writes a row, those on temporary objects too, so the
//     stream can count the events of a query string and match each to its
//     statement.
//
// The trigger never makes the application's DDL fail: whatever goes wrong
// in it is caught, recorded as a schema change the apply refuses, or at
// worst raised as a WARNING.

// captureVersion names the version of the capture's SQL; InstallSchemaCapture
// installs it again when the installed one differs.
const captureVersion = "siphon schema capture 4"

// The objects of the capture.
const (
	captureTable         = "siphon.schema_changes"
	captureTableName     = "schema_changes"
	captureCallerTrig    = "siphon_capture_caller" // sorts before the others: it fires first
	captureEndTrigger    = "siphon_capture_ddl"
	captureDropTrigger   = "siphon_capture_drop"
	captureCallerSetting = "siphon.caller"
)

// captureObjects describes what InstallSchemaCapture installs, for
// Preflight and the docs.
const captureObjects = "schema siphon with the tables siphon.schema_changes (in the publication), siphon.capture_publications " +
	"and the unlogged siphon.capture_pending; the functions siphon.capture_event(), siphon.capture_ddl(text, text, text) and " +
	"siphon.capture_failed(text, text) (SECURITY DEFINER, search_path pinned to pg_catalog, pg_temp, not executable by PUBLIC) " +
	"and siphon.capture_caller() (runs as the caller, reads its role and schemas); the event triggers " + captureCallerTrig + ", " +
	captureEndTrigger + " (ddl_command_end) and " + captureDropTrigger + " (sql_drop), ENABLE ALWAYS; everything owned by the installing superuser"

// markOwnSQL marks the running transaction's statements as the capture's
// own: the installed capture leaves them out.
const markOwnSQL = `INSERT INTO siphon.capture_pending (backend, xact, own) VALUES (pg_catalog.pg_backend_pid(), pg_catalog.pg_current_xact_id(), true)
  ON CONFLICT (backend) DO UPDATE SET xact = excluded.xact, own = true`

// captureSQL creates or replaces the capture's objects. It runs after the
// install checked that nothing in schema siphon belongs to another role.
const captureSQL = `
CREATE SCHEMA IF NOT EXISTS siphon;
REVOKE ALL ON SCHEMA siphon FROM PUBLIC;
CREATE TABLE IF NOT EXISTS siphon.schema_changes (
  id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  change jsonb NOT NULL);
CREATE TABLE IF NOT EXISTS siphon.capture_publications (
  publication text PRIMARY KEY,
  inserts_publication text,
  keyless text NOT NULL,
  tables jsonb);
CREATE UNLOGGED TABLE IF NOT EXISTS siphon.capture_pending (
  backend int PRIMARY KEY,
  xact xid8 NOT NULL,
  dropped jsonb NOT NULL DEFAULT '[]',
  temporary_drops int NOT NULL DEFAULT 0,
  created oid[] NOT NULL DEFAULT '{}',
  own bool NOT NULL DEFAULT false);
REVOKE ALL ON siphon.schema_changes, siphon.capture_publications, siphon.capture_pending FROM PUBLIC;
-- The install's own statements from here on are not schema changes of the
-- database (before, markOwnSQL did the same where the table existed).
` + markOwnSQL + `;

-- capture_pending_row returns this backend's row of capture_pending for
-- the running transaction, made anew when missing or left by another one.
CREATE OR REPLACE FUNCTION siphon.capture_pending_row() RETURNS siphon.capture_pending
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $pending$
DECLARE
  r siphon.capture_pending;
BEGIN
  INSERT INTO siphon.capture_pending AS p (backend, xact) VALUES (pg_catalog.pg_backend_pid(), pg_catalog.pg_current_xact_id())
    ON CONFLICT (backend) DO UPDATE SET xact = excluded.xact, dropped = '[]', temporary_drops = 0, created = '{}', own = false
    WHERE p.xact IS DISTINCT FROM excluded.xact
    RETURNING p.* INTO r;
  IF r IS NULL THEN
    SELECT p.* INTO r FROM siphon.capture_pending p WHERE p.backend = pg_catalog.pg_backend_pid();
  END IF;
  RETURN r;
END
$pending$;

CREATE OR REPLACE FUNCTION siphon.capture_ddl(event pg_catalog.text, tag pg_catalog.text, stack pg_catalog.text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $capture$
DECLARE
  pending siphon.capture_pending;
  caller pg_catalog.jsonb;
  drops pg_catalog.jsonb;
  temp_drops pg_catalog.int4;
  objects pg_catalog.jsonb;
  commands pg_catalog.int4;
  kept pg_catalog.int4;
  made pg_catalog.oid[];
  rels pg_catalog.oid[];
  created_tables pg_catalog.oid[];
  candidates pg_catalog.oid[];
  changes pg_catalog.jsonb := '[]';
  statements pg_catalog.text[] := '{}';
  failure pg_catalog.text;
  skip pg_catalog.text;
  query pg_catalog.text := pg_catalog.current_query();
  empty pg_catalog.bool;
  p record;
  t record;
  leaf record;
  change_id pg_catalog.int8;
BEGIN
  pending := siphon.capture_pending_row();
  IF pending.own THEN
    RETURN; -- a statement the capture runs itself
  END IF;
  IF event = 'sql_drop' THEN
    SELECT coalesce(pg_catalog.jsonb_agg(pg_catalog.jsonb_build_object('type', d.object_type, 'identity', d.object_identity, 'dropped', true))
             FILTER (WHERE NOT d.is_temporary AND d.schema_name IS DISTINCT FROM 'siphon'), '[]'),
           pg_catalog.count(*) FILTER (WHERE d.is_temporary)
      INTO drops, temp_drops
      FROM pg_catalog.pg_event_trigger_dropped_objects() d WHERE d.original;
    UPDATE siphon.capture_pending SET dropped = capture_pending.dropped || drops,
           temporary_drops = capture_pending.temporary_drops + temp_drops
     WHERE backend = pending.backend;
    RETURN;
  END IF;
  UPDATE siphon.capture_pending SET dropped = '[]', temporary_drops = 0 WHERE backend = pending.backend;
  drops := pending.dropped;
  caller := nullif(pg_catalog.current_setting('` + captureCallerSetting + `', true), '')::pg_catalog.jsonb;
  PERFORM pg_catalog.set_config('` + captureCallerSetting + `', '', true);

  SELECT pg_catalog.count(*),
         pg_catalog.count(*) FILTER (WHERE NOT c.in_extension AND c.schema_name IS DISTINCT FROM 'siphon'
                                      AND coalesce(c.schema_name, '') NOT LIKE 'pg\_temp%'),
         coalesce(pg_catalog.jsonb_agg(pg_catalog.jsonb_strip_nulls(pg_catalog.jsonb_build_object('type', c.object_type, 'identity', c.object_identity,
                    'table', (SELECT pg_catalog.jsonb_build_array(tn.nspname, tc.relname) FROM pg_catalog.pg_class tc
                              JOIN pg_catalog.pg_namespace tn ON tn.oid = tc.relnamespace WHERE tc.oid = o.rel))))
                  FILTER (WHERE NOT c.in_extension AND c.schema_name IS DISTINCT FROM 'siphon'
                            AND coalesce(c.schema_name, '') NOT LIKE 'pg\_temp%'), '[]'),
         coalesce(pg_catalog.array_agg(c.objid) FILTER (WHERE c.classid = 'pg_catalog.pg_class'::pg_catalog.regclass AND c.object_type = 'table'
                    AND c.command_tag IN ('CREATE TABLE', 'CREATE TABLE AS', 'SELECT INTO') AND NOT c.in_extension), '{}'),
         coalesce(pg_catalog.array_agg(o.rel) FILTER (WHERE o.rel IS NOT NULL), '{}')
    INTO commands, kept, objects, made, rels
    FROM pg_catalog.pg_event_trigger_ddl_commands() c
    LEFT JOIN LATERAL (SELECT CASE c.classid
        WHEN 'pg_catalog.pg_class'::pg_catalog.regclass THEN (
          SELECT CASE WHEN r.relkind IN ('i', 'I') THEN (SELECT i.indrelid FROM pg_catalog.pg_index i WHERE i.indexrelid = r.oid)
                      WHEN r.relkind = 'S' THEN (SELECT d.refobjid FROM pg_catalog.pg_depend d WHERE d.classid = 'pg_catalog.pg_class'::pg_catalog.regclass
                                                   AND d.objid = r.oid AND d.refclassid = 'pg_catalog.pg_class'::pg_catalog.regclass
                                                   AND d.deptype IN ('a', 'i') LIMIT 1)
                      ELSE r.oid END
          FROM pg_catalog.pg_class r WHERE r.oid = c.objid)
        WHEN 'pg_catalog.pg_constraint'::pg_catalog.regclass THEN (SELECT nullif(k.conrelid, 0) FROM pg_catalog.pg_constraint k WHERE k.oid = c.objid)
        WHEN 'pg_catalog.pg_trigger'::pg_catalog.regclass THEN (SELECT g.tgrelid FROM pg_catalog.pg_trigger g WHERE g.oid = c.objid)
        WHEN 'pg_catalog.pg_attrdef'::pg_catalog.regclass THEN (SELECT a.adrelid FROM pg_catalog.pg_attrdef a WHERE a.oid = c.objid)
        END AS rel) o ON true;

  -- What the target has nothing to replay for still writes a row, so that
  -- the stream counts every event of the query string.
  skip := CASE
    WHEN tag LIKE '% PUBLICATION' OR tag LIKE '% SUBSCRIPTION' THEN 'publication'
    WHEN tag = 'COMMENT' AND commands > 0 AND NOT EXISTS (SELECT FROM pg_catalog.pg_event_trigger_ddl_commands() c
                                                         WHERE c.object_type NOT IN ('publication', 'subscription')) THEN 'publication'
    WHEN tag LIKE 'DROP %' AND pg_catalog.jsonb_array_length(drops) = 0 AND pending.temporary_drops > 0 THEN 'temporary objects'
    WHEN tag LIKE 'DROP %' AND pg_catalog.jsonb_array_length(drops) = 0 THEN 'nothing dropped'
    WHEN commands > 0 AND kept = 0 AND pg_catalog.jsonb_array_length(drops) = 0 THEN 'temporary, an extension''s or siphon''s objects'
    END;

  IF tag = 'CREATE PUBLICATION' THEN
    -- A publication the capture looks after holds its table from the start.
    UPDATE siphon.capture_pending SET own = true WHERE backend = pending.backend;
    BEGIN
      FOR p IN SELECT r.publication FROM siphon.capture_publications r JOIN pg_catalog.pg_publication pb ON pb.pubname = r.publication
                WHERE NOT pb.puballtables
                  AND NOT EXISTS (SELECT FROM pg_catalog.pg_publication_rel pr WHERE pr.prpubid = pb.oid
                                    AND pr.prrelid = 'siphon.schema_changes'::pg_catalog.regclass)
                  AND NOT EXISTS (SELECT FROM pg_catalog.pg_publication_namespace pn WHERE pn.pnpubid = pb.oid
                                    AND pn.pnnspid = 'siphon'::pg_catalog.regnamespace) LOOP
        EXECUTE pg_catalog.format('ALTER PUBLICATION %I ADD TABLE siphon.schema_changes', p.publication);
      END LOOP;
    EXCEPTION WHEN OTHERS THEN
      failure := SQLERRM;
    END;
    UPDATE siphon.capture_pending SET own = false WHERE backend = pending.backend;
  END IF;

  IF skip IS NULL AND tag IN ('CREATE TABLE', 'CREATE TABLE AS', 'SELECT INTO', 'ALTER TABLE', 'ALTER INDEX', 'DROP INDEX') THEN
    created_tables := pending.created || made;
    UPDATE siphon.capture_pending SET created = created_tables, own = true WHERE backend = pending.backend;
    -- The tables whose place in a publication the command may change: those
    -- it touched or the transaction created, and the partitioned tables
    -- above them; a dropped index may have been a replica identity.
    SELECT coalesce(pg_catalog.array_agg(DISTINCT s.oid), '{}') INTO candidates FROM (
        SELECT u.oid FROM pg_catalog.unnest(rels || created_tables) AS u(oid)
        UNION SELECT a.relid FROM pg_catalog.unnest(rels || created_tables) AS u(oid) CROSS JOIN LATERAL pg_catalog.pg_partition_ancestors(u.oid) a) s;
    IF tag IN ('DROP INDEX', 'ALTER INDEX') THEN
      candidates := candidates || ARRAY(SELECT x.oid FROM pg_catalog.pg_class x WHERE x.relreplident = 'i');
    END IF;
    BEGIN
      FOR p IN SELECT r.* FROM siphon.capture_publications r JOIN pg_catalog.pg_publication pb ON pb.pubname = r.publication LOOP
        FOR t IN
          SELECT c.oid, c.oid::pg_catalog.regclass::pg_catalog.text AS name, pg_catalog.jsonb_build_array(n.nspname, c.relname) AS pair,
                 ` + usableIdentity + ` AS usable,
                 d.by_definition OR EXISTS (SELECT FROM pg_catalog.pg_publication_rel pr JOIN pg_catalog.pg_publication pb ON pb.oid = pr.prpubid
                         WHERE pr.prrelid = c.oid AND pb.pubname = p.publication) AS published,
                 d.by_definition,
                 EXISTS (SELECT FROM pg_catalog.pg_publication_rel pr JOIN pg_catalog.pg_publication pb ON pb.oid = pr.prpubid
                         WHERE pr.prrelid = c.oid AND pb.pubname = p.inserts_publication) AS inserts_only
          FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
          -- A table a publication holds by its definition (FOR ALL TABLES,
          -- TABLES IN SCHEMA) is published, and no ALTER PUBLICATION can
          -- add or drop it by name.
          CROSS JOIN LATERAL (SELECT EXISTS (SELECT FROM pg_catalog.pg_publication pb WHERE pb.pubname = p.publication AND (pb.puballtables
                   OR EXISTS (SELECT FROM pg_catalog.pg_publication_namespace pn WHERE pn.pnpubid = pb.oid AND pn.pnnspid = c.relnamespace)))
                 AS by_definition) d
          WHERE c.oid = ANY (candidates) AND ` + isUserTable + `
            AND CASE WHEN p.tables IS NULL THEN NOT c.relispartition
                     ELSE p.tables @> pg_catalog.jsonb_build_array(pg_catalog.jsonb_build_array(n.nspname, c.relname)) END
        LOOP
          IF t.published AND NOT t.usable OR NOT t.published AND NOT t.inserts_only AND p.tables IS NULL AND t.oid = ANY (created_tables) THEN
            IF NOT t.published THEN
              -- Rows written before the table joins the publication are
              -- not decoded: only an empty table, or one a CREATE TABLE AS
              -- just filled (the target runs the same statement), joins.
              EXECUTE pg_catalog.format('SELECT NOT EXISTS (SELECT FROM %s)', t.name) INTO empty;
              CONTINUE WHEN NOT empty AND NOT t.oid = ANY (made);
            END IF;
            IF NOT t.usable AND p.keyless = 'full' THEN
              FOR leaf IN SELECT x.oid FROM pg_catalog.pg_class x
                       WHERE (x.oid = t.oid AND x.relkind = 'r' OR x.oid IN (SELECT relid FROM pg_catalog.pg_partition_tree(t.oid) WHERE isleaf))
                         AND x.relreplident <> 'f' LOOP
                statements := statements || pg_catalog.format('ALTER TABLE %s REPLICA IDENTITY FULL', leaf.oid::pg_catalog.regclass);
                EXECUTE statements[pg_catalog.cardinality(statements)];
              END LOOP;
              IF NOT t.published THEN
                EXECUTE pg_catalog.format('ALTER PUBLICATION %I ADD TABLE %s', p.publication, t.name);
                changes := changes || pg_catalog.jsonb_build_object('publication', p.publication, 'table', t.pair, 'action', 'added');
              END IF;
            ELSIF t.usable THEN
              EXECUTE pg_catalog.format('ALTER PUBLICATION %I ADD TABLE %s', p.publication, t.name);
              changes := changes || pg_catalog.jsonb_build_object('publication', p.publication, 'table', t.pair, 'action', 'added');
            ELSIF t.by_definition THEN
              -- It stays published: its UPDATE and DELETE fail on the source
              -- until it has a usable replica identity again.
              changes := changes || pg_catalog.jsonb_build_object('publication', p.publication, 'table', t.pair, 'action', 'held');
            ELSE
              IF t.published THEN
                EXECUTE pg_catalog.format('ALTER PUBLICATION %I DROP TABLE %s', p.publication, t.name);
              END IF;
              IF p.keyless = 'inserts' AND p.inserts_publication IS NOT NULL THEN
                EXECUTE pg_catalog.format('ALTER PUBLICATION %I ADD TABLE %s', p.inserts_publication, t.name);
                changes := changes || pg_catalog.jsonb_build_object('publication', p.publication, 'table', t.pair, 'action', 'inserts only');
              ELSIF t.published THEN
                changes := changes || pg_catalog.jsonb_build_object('publication', p.publication, 'table', t.pair, 'action', 'removed');
              END IF;
            END IF;
          END IF;
        END LOOP;
      END LOOP;
    EXCEPTION WHEN OTHERS THEN
      failure := SQLERRM;
    END;
    UPDATE siphon.capture_pending SET own = false WHERE backend = pending.backend;
  END IF;

  -- A query string that may carry a secret (a user mapping's or a
  -- server's OPTIONS, a subscription's connection string) is not
  -- recorded: the apply stops there for the change to be made by hand.
  IF query ~* '\m(user\s+mapping|server|subscription|foreign\s+data\s+wrapper)\M' AND query ~* '\m(options|password|connection)\M' THEN
    query := NULL;
    stack := NULL;
  END IF;

  INSERT INTO siphon.schema_changes (change) VALUES (pg_catalog.jsonb_strip_nulls(pg_catalog.jsonb_build_object(
      'tag', tag, 'query', query, 'redacted', query IS NULL, 'stack', stack, 'caller', caller,
      'session_role', SESSION_USER, 'superuser', (SELECT r.rolsuper FROM pg_catalog.pg_roles r WHERE r.rolname = SESSION_USER),
      'installer', CURRENT_USER, 'backend', pending.backend, 'started', pg_catalog.statement_timestamp(),
      'skip', skip, 'objects', objects || drops, 'publication', changes, 'statements', pg_catalog.to_jsonb(statements),
      'publication_error', failure)))
    RETURNING schema_changes.id INTO change_id;
  DELETE FROM siphon.schema_changes WHERE schema_changes.id = change_id;
  -- The capture's own statements ran capture_caller again.
  PERFORM pg_catalog.set_config('` + captureCallerSetting + `', '', true);
END
$capture$;

CREATE OR REPLACE FUNCTION siphon.capture_failed(tag pg_catalog.text, failure pg_catalog.text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $failed$
DECLARE
  change_id pg_catalog.int8;
BEGIN
  INSERT INTO siphon.schema_changes (change)
    VALUES (pg_catalog.jsonb_build_object('tag', tag, 'error', failure, 'session_role', SESSION_USER,
            'installer', CURRENT_USER, 'backend', pg_catalog.pg_backend_pid(), 'started', pg_catalog.statement_timestamp()))
    RETURNING schema_changes.id INTO change_id;
  DELETE FROM siphon.schema_changes WHERE schema_changes.id = change_id;
END
$failed$;

CREATE OR REPLACE FUNCTION siphon.capture_event() RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $event$
DECLARE
  stack pg_catalog.text;
BEGIN
  GET DIAGNOSTICS stack = PG_CONTEXT;
  PERFORM siphon.capture_ddl(TG_EVENT, TG_TAG, stack);
EXCEPTION WHEN OTHERS THEN
  BEGIN
    PERFORM siphon.capture_failed(TG_TAG, SQLERRM);
  EXCEPTION WHEN OTHERS THEN
    RAISE WARNING 'siphon: the schema change was not captured: %', SQLERRM;
  END;
END
$event$;

-- Runs as the caller, with the caller's search_path: it names every
-- function and type with its schema and has no privilege to give away.
CREATE OR REPLACE FUNCTION siphon.capture_caller() RETURNS event_trigger
LANGUAGE plpgsql AS $caller$
BEGIN
  PERFORM pg_catalog.set_config('` + captureCallerSetting + `', pg_catalog.jsonb_build_object(
      'role', CURRENT_USER, 'schemas', pg_catalog.current_schemas(false),
      'standard_conforming_strings', pg_catalog.current_setting('standard_conforming_strings'))::pg_catalog.text, true);
EXCEPTION WHEN OTHERS THEN
  -- The capture then records that it does not know who ran the change.
  PERFORM pg_catalog.set_config('` + captureCallerSetting + `', '', true);
END
$caller$;

REVOKE ALL ON FUNCTION siphon.capture_ddl(pg_catalog.text, pg_catalog.text, pg_catalog.text), siphon.capture_failed(pg_catalog.text, pg_catalog.text),
  siphon.capture_event(), siphon.capture_caller(), siphon.capture_pending_row() FROM PUBLIC;
COMMENT ON FUNCTION siphon.capture_ddl(pg_catalog.text, pg_catalog.text, pg_catalog.text) IS '` + captureVersion + `';

-- The version before 2 had another capture_ddl; its triggers are kept.
DROP FUNCTION IF EXISTS siphon.capture_ddl(pg_catalog.text, pg_catalog.text, pg_catalog.text, pg_catalog.text);

DO $triggers$ BEGIN
  IF NOT EXISTS (SELECT FROM pg_catalog.pg_event_trigger WHERE evtname = '` + captureCallerTrig + `') THEN
    CREATE EVENT TRIGGER ` + captureCallerTrig + ` ON ddl_command_end EXECUTE FUNCTION siphon.capture_caller();
  END IF;
  IF NOT EXISTS (SELECT FROM pg_catalog.pg_event_trigger WHERE evtname = '` + captureEndTrigger + `') THEN
    CREATE EVENT TRIGGER ` + captureEndTrigger + ` ON ddl_command_end EXECUTE FUNCTION siphon.capture_event();
  END IF;
  IF NOT EXISTS (SELECT FROM pg_catalog.pg_event_trigger WHERE evtname = '` + captureDropTrigger + `') THEN
    CREATE EVENT TRIGGER ` + captureDropTrigger + ` ON sql_drop EXECUTE FUNCTION siphon.capture_event();
  END IF;
END $triggers$;
-- Under session_replication_role = replica too: a restore with triggers
-- disabled, or siphon's own apply into a database that is itself a source.
ALTER EVENT TRIGGER ` + captureCallerTrig + ` ENABLE ALWAYS;
ALTER EVENT TRIGGER ` + captureEndTrigger + ` ENABLE ALWAYS;
ALTER EVENT TRIGGER ` + captureDropTrigger + ` ENABLE ALWAYS;`
