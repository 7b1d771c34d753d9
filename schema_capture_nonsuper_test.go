package siphon_test

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"regexp"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/siphondb/siphon"
	"github.com/siphondb/siphon/canonical"
)

// Issue 24's deliverable 7, "the documented non-superuser setup works": a
// superuser installs the capture for the publication of a REPLICATION role
// that is not a superuser, and that role streams, backs up and detaches;
// and an audit of what the install leaves in the catalog.

// TestSchemaCaptureForReplicationRole runs the documented setup in both
// orders: (a) the role's publication exists first (it ran
// CurrentPosition), then the superuser installs; (b) the superuser
// installs first, then the role creates its publication, which the
// capture gives its table. Then, as the role: Preflight's schema capture
// check is OK; StreamChanges delivers the superuser's ALTER TABLE ... ADD
// COLUMN as an OpDDL, with no warning that schema changes are not
// captured; BackupIncremental carries the ddl record; Detach drops the
// role's slot and publication and keeps the capture, saying at Warn that
// a superuser must remove it; a superuser's Detach then removes it.
func TestSchemaCaptureForReplicationRole(t *testing.T) {
	t.Parallel()
	for _, order := range []string{"publication first", "capture first"} {
		t.Run(order, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			roleDSN, admin := sourceRole(t)
			roleConn := connectOrFail(t, roleDSN)
			var role string
			require.NoError(t, roleConn.QueryRow(ctx, "SELECT current_user").Scan(&role))
			execSQL(t, roleConn, "CREATE TABLE public.notes (id int PRIMARY KEY, body text)",
				"INSERT INTO public.notes VALUES (1, 'one')")
			adminDSN := strings.Replace(roleDSN, role+":plain-pw-1234@", "postgres@", 1)
			slot := streamSlot(t)
			same := []siphon.Option{siphon.WithPublication(slot), siphon.WithTables("public.notes"), siphon.WithKeylessTables(siphon.KeylessSkip)}
			roleOpts := append([]siphon.Option{siphon.WithSlot(slot)}, same...)
			super := connect(t, adminDSN, append([]siphon.Option{siphon.WithSlot(slot + "_super")}, same...)...)
			// The role's Conn logs from when the capture is installed: before,
			// it rightly warns that schema changes are not captured.
			var logs lockedBuffer
			logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
			var c *siphon.Conn
			var start canonical.Position
			var err error
			if order == "publication first" {
				first := connect(t, roleDSN, append(roleOpts, siphon.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))...)
				start, err = first.CurrentPosition(ctx)
				require.NoError(t, err)
				require.NoError(t, first.Close())
				require.NoError(t, super.InstallSchemaCapture(ctx))
				c = connect(t, roleDSN, append(roleOpts, siphon.WithLogger(logger))...)
			} else {
				require.NoError(t, super.InstallSchemaCapture(ctx))
				c = connect(t, roleDSN, append(roleOpts, siphon.WithLogger(logger))...)
				start, err = c.CurrentPosition(ctx)
				require.NoError(t, err)
			}
			assert.Equal(t, []string{"public.notes", "siphon.schema_changes"},
				auditRows(t, admin, "SELECT schemaname || '.' || tablename FROM pg_publication_tables WHERE pubname = $1 ORDER BY 1", slot),
				"the capture's table is in the role's publication")

			report, err := c.Preflight(ctx)
			if assert.NoError(t, err, "Preflight as the role") {
				check, ok := report.Check(siphon.CheckSchemaCapture)
				require.True(t, ok)
				assert.Equal(t, siphon.CheckOK, check.Status, check.String())
			}

			execSQL(t, admin, "ALTER TABLE public.notes ADD COLUMN tag text", "INSERT INTO public.notes VALUES (2, 'two', 'red')")
			var inc bytes.Buffer
			_, err = c.BackupIncremental(ctx, start, &inc)
			require.NoError(t, err, "BackupIncremental as the role")
			assert.Equal(t, []string{"ALTER TABLE public.notes ADD COLUMN tag text"}, statementsOf(ddlOf(decodeChanges(t, inc.Bytes()))),
				"the incremental carries the ddl record")

			emitMarker(t, admin, "end")
			changes, _ := streamUntil(t, c, start, "end")
			ddl := ddlOf(changes)
			require.Equal(t, []string{"ALTER TABLE public.notes ADD COLUMN tag text"}, statementsOf(ddl), "StreamChanges as the role")
			assert.Empty(t, ddl[0].Problem)
			assert.True(t, ddl[0].Superuser)
			assert.Equal(t, "postgres", ddl[0].Installer)
			assert.NotContains(t, logs.String(), "not captured", "no warning that schema changes are not captured")

			require.NoError(t, c.Detach(ctx), "Detach as the role")
			assert.Zero(t, count(t, admin, "SELECT count(*) FROM pg_replication_slots WHERE slot_name = '"+slot+"'"), "its slot is gone")
			assert.Zero(t, count(t, admin, "SELECT count(*) FROM pg_publication WHERE pubname = '"+slot+"'"), "its publication is gone")
			assert.Contains(t, captureObjects(t, admin), "event trigger siphon_capture_ddl", "the capture stays installed")
			var warned []string
			for _, line := range strings.Split(logs.String(), "\n") {
				if strings.Contains(line, "only a superuser may remove it") {
					warned = append(warned, line)
				}
			}
			require.Len(t, warned, 1, logs.String())
			assert.Contains(t, warned[0], "level=WARN")

			require.NoError(t, super.Detach(ctx), "a superuser's Detach")
			assert.Empty(t, captureObjects(t, admin), "no event trigger, no schema siphon")
			require.NoError(t, c.Close())
			require.NoError(t, super.Close())
			assertNoLeaks(t, adminDSN)
		})
	}
}

// decodeChanges returns the changes of a canonical stream.
func decodeChanges(t *testing.T, stream []byte) []canonical.Change {
	t.Helper()
	d := canonical.NewDecoder(bytes.NewReader(stream))
	var out []canonical.Change
	for {
		rec, err := d.Next()
		if err == io.EOF {
			return out
		}
		require.NoError(t, err)
		if rec.Type == canonical.RecordChange {
			out = append(out, *rec.Change)
		}
	}
}

// auditRows returns the rows (as text) of an audit query: each one a
// finding.
func auditRows(t *testing.T, conn *pgx.Conn, query string, args ...any) []string {
	t.Helper()
	rows, err := conn.Query(context.Background(), query, args...)
	require.NoError(t, err)
	found, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return found
}

// unqualifiedDeclaration is a PL/pgSQL variable declared with a built-in
// type the capture uses, without its schema.
var unqualifiedDeclaration = regexp.MustCompile(`(?m)(^|[^.\w])(text|jsonb|oid\[\]|int4|int8|bool)\s*(;|:=)`)

// declareSections are the DECLARE sections of a PL/pgSQL body.
var declareSections = regexp.MustCompile(`(?is)\bDECLARE\b(.*?)\bBEGIN\b`)

// TestSchemaCaptureCatalogAudit audits what InstallSchemaCapture leaves in
// the catalog (deliverable 2): every object of schema siphon and every
// event trigger belongs to the installer; every SECURITY DEFINER function
// has its search_path pinned to exactly pg_catalog, pg_temp, and declares
// no variable with an unqualified built-in type; no function of schema
// siphon is executable by PUBLIC; no table or sequence there grants
// anything to PUBLIC or another role; the schema grants nothing to PUBLIC.
func TestSchemaCaptureCatalogAudit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn, admin := newDatabase(t)
	c, _, _ := captureConnAt(t, dsn)
	var installer string
	require.NoError(t, admin.QueryRow(ctx, "SELECT current_user").Scan(&installer))
	require.NotEmpty(t, captureObjects(t, admin))

	assert.Empty(t, auditRows(t, admin, `
		SELECT 'relation ' || c.oid::regclass::text || ' owned by ' || c.relowner::regrole::text FROM pg_class c
		WHERE c.relnamespace = 'siphon'::regnamespace AND c.relowner <> $1::regrole
		UNION ALL SELECT 'function ' || p.oid::regprocedure::text || ' owned by ' || p.proowner::regrole::text FROM pg_proc p
		WHERE p.pronamespace = 'siphon'::regnamespace AND p.proowner <> $1::regrole
		UNION ALL SELECT 'type ' || t.oid::regtype::text || ' owned by ' || t.typowner::regrole::text FROM pg_type t
		WHERE t.typnamespace = 'siphon'::regnamespace AND t.typowner <> $1::regrole
		UNION ALL SELECT 'schema siphon owned by ' || nspowner::regrole::text FROM pg_namespace WHERE nspname = 'siphon' AND nspowner <> $1::regrole
		UNION ALL SELECT 'event trigger ' || evtname || ' owned by ' || evtowner::regrole::text FROM pg_event_trigger WHERE evtowner <> $1::regrole`,
		installer), "everything belongs to the installer")
	assert.Equal(t, 3, count(t, admin, "SELECT count(*) FROM pg_event_trigger WHERE evtname LIKE 'siphon\\_capture\\_%'"))

	definers := auditRows(t, admin, "SELECT p.oid::regprocedure::text FROM pg_proc p WHERE p.pronamespace = 'siphon'::regnamespace AND p.prosecdef ORDER BY 1")
	require.NotEmpty(t, definers)
	assert.Empty(t, auditRows(t, admin, `
		SELECT p.oid::regprocedure::text || ' has proconfig ' || coalesce(p.proconfig::text, 'NULL') FROM pg_proc p
		WHERE p.pronamespace = 'siphon'::regnamespace AND p.prosecdef
		  AND p.proconfig IS DISTINCT FROM ARRAY['search_path=pg_catalog, pg_temp']`), "every SECURITY DEFINER function pins its search_path")

	assert.Empty(t, auditRows(t, admin, `
		SELECT p.oid::regprocedure::text FROM pg_proc p, aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) a
		WHERE p.pronamespace = 'siphon'::regnamespace AND a.grantee = 0 AND a.privilege_type = 'EXECUTE'`), "no function is executable by PUBLIC")
	assert.Empty(t, auditRows(t, admin, `
		SELECT c.oid::regclass::text || ' grants ' || a.privilege_type || ' to ' || CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE a.grantee::regrole::text END
		FROM pg_class c, aclexplode(coalesce(c.relacl, acldefault(CASE WHEN c.relkind = 'S' THEN 's' ELSE 'r' END::"char", c.relowner))) a
		WHERE c.relnamespace = 'siphon'::regnamespace AND a.grantee <> c.relowner`), "no table grants anything to PUBLIC or another role")
	assert.Empty(t, auditRows(t, admin, `
		SELECT 'schema siphon grants ' || a.privilege_type || ' to PUBLIC'
		FROM pg_namespace n, aclexplode(coalesce(n.nspacl, acldefault('n', n.nspowner))) a
		WHERE n.nspname = 'siphon' AND a.grantee = 0`), "the schema grants nothing to PUBLIC")

	bodies := auditRows(t, admin, "SELECT p.oid::regprocedure::text || E'\\n' || p.prosrc FROM pg_proc p WHERE p.pronamespace = 'siphon'::regnamespace AND p.prosecdef ORDER BY 1")
	require.Len(t, bodies, len(definers))
	for _, body := range bodies {
		name, src, _ := strings.Cut(body, "\n")
		sections := declareSections.FindAllStringSubmatch(src, -1)
		require.NotEmpty(t, sections, "%s declares its variables", name)
		for _, s := range sections {
			for _, m := range unqualifiedDeclaration.FindAllString(s[1], -1) {
				assert.Fail(t, "an unqualified type in a DECLARE section", "%s: %q", name, strings.TrimSpace(m))
			}
		}
	}

	require.NoError(t, c.Detach(ctx))
	require.NoError(t, c.Close())
	assert.Empty(t, captureObjects(t, admin))
	assertNoLeaks(t, dsn)
}
