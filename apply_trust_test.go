package siphon_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/siphondb/siphon"
	"github.com/siphondb/siphon/canonical"
)

// The apply side of "the target never grants more than the
// source had". The schema changes here are hand-made ddl records, as the
// capture writes them (Role, SessionRole, Superuser, Installer), applied
// by the target's superuser: the attacks of the issue, made by a role
// "mallory" that owns schema mal and nothing else.

// trustTarget is a target database holding what the source holds before
// the attacks: public.accounts (two rows) owned by the superuser, which
// mallory may only read, schema
// mal where a fresh role mallory may create, her function mal.f() that
// logs who ran it into mal.marks, and a role alice owning public.ledger.
// It returns the admin session and the roles' names; the roles are
// dropped when the test ends.
type trustTarget struct {
	dsn            string
	admin          *pgx.Conn
	mallory, alice string
	bob            string
	superuser      string // the target's, which applies
	accounts       canonical.Table
	slot           string
}

func newTrustTarget(t *testing.T) *trustTarget {
	t.Helper()
	dsn, admin := newDatabase(t)
	n := roleSeq.Add(1) // one counter for every role name of the tests: roles belong to the cluster
	tt := &trustTarget{dsn: dsn, admin: admin, slot: streamSlot(t),
		mallory: fmt.Sprintf("mallory_%d_%d", os.Getpid(), n), alice: fmt.Sprintf("alice_%d_%d", os.Getpid(), n), bob: fmt.Sprintf("bob_%d_%d", os.Getpid(), n)}
	require.NoError(t, admin.QueryRow(context.Background(), "SELECT current_user").Scan(&tt.superuser))
	for _, r := range []string{tt.mallory, tt.alice, tt.bob} {
		execSQL(t, admin, "CREATE ROLE "+r)
	}
	t.Cleanup(func() {
		for _, r := range []string{tt.mallory, tt.alice, tt.bob} {
			execSQL(t, admin, "DROP OWNED BY "+r, "DROP ROLE "+r)
		}
	})
	execSQL(t, admin,
		"CREATE TABLE public.accounts (id int PRIMARY KEY, owner text)",
		"INSERT INTO public.accounts VALUES (1, 'ann'), (2, 'ben')",
		"GRANT SELECT ON public.accounts TO "+tt.mallory, // her GRANT ALL on it is a no-op warning then
		"CREATE SCHEMA mal",
		"GRANT USAGE, CREATE ON SCHEMA mal TO "+tt.mallory,
		"SET ROLE "+tt.mallory,
		"CREATE TABLE mal.marks (who text)",
		`CREATE FUNCTION mal.f() RETURNS int LANGUAGE plpgsql AS $$BEGIN INSERT INTO mal.marks VALUES (current_user); RETURN 1; END$$`,
		"RESET ROLE",
		"CREATE TABLE public.ledger (id int PRIMARY KEY)",
		"ALTER TABLE public.ledger OWNER TO "+tt.alice,
	)
	tt.accounts = canonical.Table{Schema: "public", Name: "accounts",
		Columns: []canonical.Column{
			{Name: "id", Type: "integer", TypeOID: 23},
			{Name: "owner", Type: "text", TypeOID: 25, Nullable: true},
		},
		PrimaryKey: []string{"id"}, IdentityKey: []string{"id"}, ReplicaIdentity: canonical.IdentityDefault}
	return tt
}

// ddlBy is a schema change made on the source by role, logged in as
// role, not a superuser, in a capture installed by another role.
func ddlBy(role, tag, stmt string) canonical.Change {
	return canonical.Change{Op: canonical.OpDDL, DDL: &canonical.DDL{Tag: tag, Statement: stmt, SearchPath: `"mal", "public"`,
		Role: role, SessionRole: role, Installer: "the_installer"}}
}

// consumeTx applies a stream of one transaction (an insert into accounts
// of the row id, then changes) with c, and returns the apply's error and
// the transaction's end.
func (tt *trustTarget) consumeTx(t *testing.T, c *siphon.Conn, start canonical.Position, id int, changes ...canonical.Change) (canonical.Position, error) {
	t.Helper()
	return tt.consumeTxSkipping(t, c, nil, start, id, changes...)
}

// consumeTxSkipping is consumeTx, skipping the schema changes of the
// transactions skip names.
func (tt *trustTarget) consumeTxSkipping(t *testing.T, c *siphon.Conn, skip []canonical.Position, start canonical.Position, id int, changes ...canonical.Change) (canonical.Position, error) {
	t.Helper()
	s := newStream(t, canonical.KindChanges, start, tt.slot, tt.accounts)
	chs := append([]canonical.Change{ins(tt.accounts.TableName(), tv(fmt.Sprint(id)), tv("before"))}, changes...)
	end := s.tx(chs...)
	return end, tt.apply(c, s.done(), skip)
}

// apply applies stream with c, running the schema changes of these
// hand-written streams as if they were authenticated (they are the key
// holder's): what is checked here is whom the target trusts.
func (tt *trustTarget) apply(c *siphon.Conn, stream []byte, skip []canonical.Position) error {
	opt := siphon.ApplyOptions{UnauthenticatedSchemaChanges: true, SkipSchemaChanges: skip}
	return c.ConsumeCanonicalWith(context.Background(), opt, bytes.NewReader(stream))
}

// connect opens a target Conn.
func (tt *trustTarget) connect(t *testing.T, opts ...siphon.Option) *siphon.Conn {
	t.Helper()
	return connect(t, tt.dsn, opts...)
}

// untrusted asserts err is an *UntrustedSchemaChangeError naming role and
// fix, and returns it.
func untrusted(t *testing.T, err error, role, fix string) *siphon.UntrustedSchemaChangeError {
	t.Helper()
	var ute *siphon.UntrustedSchemaChangeError
	require.ErrorAs(t, err, &ute)
	assert.Equal(t, role, ute.SessionRole)
	assert.Contains(t, err.Error(), fmt.Sprintf("%q", role))
	assert.Contains(t, err.Error(), fix)
	return ute
}

func (tt *trustTarget) has(t *testing.T, role, table, privilege string) bool {
	t.Helper()
	var ok bool
	require.NoError(t, tt.admin.QueryRow(context.Background(), "SELECT has_table_privilege($1, $2, $3)", role, table, privilege).Scan(&ok))
	return ok
}

func (tt *trustTarget) exists(t *testing.T, regclass string) bool {
	t.Helper()
	return count(t, tt.admin, fmt.Sprintf("SELECT count(*) FROM pg_class WHERE oid = to_regclass('%s')", regclass)) == 1
}

func (tt *trustTarget) procOwner(t *testing.T, proc string) string {
	t.Helper()
	var owner string
	require.NoError(t, tt.admin.QueryRow(context.Background(),
		"SELECT proowner::regrole::text FROM pg_proc WHERE oid = to_regprocedure($1)", proc).Scan(&owner))
	return owner
}

// TestUntrustedSchemaChangesHaveNoEffect runs the attacks on the
// apply as mallory's schema changes, with nothing trusted but the
// defaults: each stops the apply with an *UntrustedSchemaChangeError
// naming her and WithTrustedSchemaRoles, and the target is as before: no
// privilege given, nothing dropped, her function not run, nothing of her
// transaction applied (its row neither), the transaction before it
// applied.
func TestUntrustedSchemaChangesHaveNoEffect(t *testing.T) {
	t.Parallel()
	tt := newTrustTarget(t)
	m := tt.mallory
	c := tt.connect(t)
	tables := userTables(t, tt.admin)
	// A first transaction is applied; the one after it, in the same
	// stream, is refused whole: its row too.
	s := newStream(t, canonical.KindChanges, 0x1000, tt.slot, tt.accounts)
	first := s.tx(ins(tt.accounts.TableName(), tv("3"), tv("first")))
	s.tx(ins(tt.accounts.TableName(), tv("4"), tv("second")), ddlBy(m, "GRANT", "GRANT DELETE ON public.accounts TO "+m))
	untrusted(t, tt.apply(c, s.done(), nil), m, fmt.Sprintf("WithTrustedSchemaRoles(%q)", m))
	assert.Equal(t, first, appliedPosition(t, c))
	assert.Equal(t, 1, count(t, tt.admin, "SELECT count(*) FROM public.accounts WHERE id IN (3, 4)"))

	attacks := []struct{ name, tag, stmt string }{
		{"grant a no-op on the source", "GRANT", "GRANT ALL ON public.accounts TO " + m},
		{"default privileges", "ALTER DEFAULT PRIVILEGES", "ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT ALL ON TABLES TO " + m},
		{"drop owned by current_user", "DROP OWNED", "DROP OWNED BY CURRENT_USER"},
		{"her function in a CREATE TABLE AS", "CREATE TABLE AS", "CREATE TABLE mal.t AS SELECT mal.f()"},
		{"her security definer function", "CREATE FUNCTION", "CREATE FUNCTION mal.g() RETURNS text LANGUAGE sql SECURITY DEFINER AS $$SELECT current_user::text$$"},
	}
	for i, a := range attacks {
		end, err := tt.consumeTx(t, c, first, 10+i, ddlBy(m, a.tag, a.stmt))
		ute := untrusted(t, err, m, fmt.Sprintf("WithTrustedSchemaRoles(%q)", m))
		assert.Equal(t, end-0x38, ute.Position, a.name)
		assert.Equal(t, a.tag, ute.Tag, a.name)
		assert.Equal(t, first, appliedPosition(t, c), "%s: nothing of the transaction applied", a.name)
	}
	execSQL(t, tt.admin, "CREATE TABLE public.later (id int)")
	for _, p := range []string{"DELETE", "UPDATE", "INSERT", "TRUNCATE"} {
		assert.False(t, tt.has(t, m, "public.accounts", p), "mallory may not %s accounts", p)
		assert.False(t, tt.has(t, m, "public.later", p), "mallory may not %s the DBA's later tables", p)
	}
	assert.Zero(t, count(t, tt.admin, "SELECT count(*) FROM pg_default_acl"))
	assert.ElementsMatch(t, append(tables, "later"), userTables(t, tt.admin), "nothing dropped, nothing created")
	assert.False(t, tt.exists(t, "mal.t"))
	assert.Zero(t, count(t, tt.admin, "SELECT count(*) FROM mal.marks"), "her function never ran on the target")
	assert.Zero(t, count(t, tt.admin, "SELECT count(*) FROM pg_proc WHERE proname = 'g'"))
	assert.Equal(t, 3, count(t, tt.admin, "SELECT count(*) FROM public.accounts"), "the refused transactions' rows are not applied")
}

// TestTrustedSchemaChangeRunsAsItsRole trusts mallory: her schema changes
// apply, but as her: her SECURITY DEFINER function is hers on the target,
// not the superuser's, her CREATE TABLE AS runs her function as her, and
// the apply's own work after the statement (a row into accounts, where
// she may not write, and the applied Position) runs as the applying role.
func TestTrustedSchemaChangeRunsAsItsRole(t *testing.T) {
	t.Parallel()
	tt := newTrustTarget(t)
	m := tt.mallory
	c := tt.connect(t, siphon.WithTrustedSchemaRoles(m))
	after := ins(tt.accounts.TableName(), tv("20"), tv("after"))
	end, err := tt.consumeTx(t, c, 0x1000, 10,
		ddlBy(m, "CREATE FUNCTION", "CREATE FUNCTION mal.g() RETURNS text LANGUAGE sql SECURITY DEFINER AS $$SELECT current_user::text$$"),
		ddlBy(m, "CREATE TABLE AS", "CREATE TABLE mal.t AS SELECT mal.f() AS one"),
		after)
	require.NoError(t, err)
	assert.Equal(t, end, appliedPosition(t, c))
	assert.Equal(t, m, tt.procOwner(t, "mal.g()"), "her function is hers, not the superuser's")
	var who string
	require.NoError(t, tt.admin.QueryRow(context.Background(), "SELECT mal.g()").Scan(&who))
	assert.Equal(t, m, who, "her SECURITY DEFINER function runs as her")
	assert.Equal(t, []string{m}, marks(t, tt.admin), "her function ran once, as her")
	var owner string
	require.NoError(t, tt.admin.QueryRow(context.Background(), "SELECT relowner::regrole::text FROM pg_class WHERE oid = 'mal.t'::regclass").Scan(&owner))
	assert.Equal(t, m, owner)
	assert.Equal(t, 2, count(t, tt.admin, "SELECT count(*) FROM public.accounts WHERE id IN (10, 20)"), "the rows around her changes were applied")
	assert.False(t, tt.has(t, m, "public.accounts", "INSERT"))

	// A statement she could not run on the source fails as her on the target.
	_, err = tt.consumeTx(t, c, end, 30, ddlBy(m, "ALTER TABLE", "ALTER TABLE public.accounts ADD COLUMN stolen text"))
	var sce *siphon.SchemaChangeError
	require.ErrorAs(t, err, &sce)
	assert.ErrorContains(t, err, "must be owner")
	assert.Equal(t, end, appliedPosition(t, c))
}

func marks(t *testing.T, conn *pgx.Conn) []string {
	t.Helper()
	rows, err := conn.Query(context.Background(), "SELECT who FROM mal.marks")
	require.NoError(t, err)
	who, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return who
}

// TestRoleDependentSchemaChanges checks that a trusted role's statement
// whose meaning depends on who runs it is refused, naming
// WithRoleDependentSchemaChanges, even from a superuser; with it, it
// applies, as its role: alice's GRANT on her table gives bob SELECT,
// mallory's default privileges and DROP OWNED BY CURRENT_USER touch only
// what is hers, and her GRANT on accounts (a no-op warning on the source)
// gives her nothing.
func TestRoleDependentSchemaChanges(t *testing.T) {
	t.Parallel()
	tt := newTrustTarget(t)
	m, a := tt.mallory, tt.alice
	changes := []canonical.Change{
		ddlBy(a, "GRANT", "GRANT SELECT ON public.ledger TO "+tt.bob),
		ddlBy(m, "GRANT", "GRANT ALL ON public.accounts TO "+m),
		ddlBy(m, "ALTER DEFAULT PRIVILEGES", "ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT ALL ON TABLES TO "+m),
		ddlBy(m, "CREATE TABLE", "CREATE TABLE mal.own (id int)"),
		ddlBy(m, "DROP OWNED", "DROP OWNED BY CURRENT_USER"),
	}
	superuser := ddlBy(tt.superuser, "REVOKE", "REVOKE ALL ON public.accounts FROM PUBLIC")
	superuser.DDL.Superuser = true

	refusing := tt.connect(t, siphon.WithTrustedSchemaRoles(m, a))
	for _, ch := range append(changes[:1:1], superuser) {
		_, err := tt.consumeTx(t, refusing, 0x1000, 10, ch)
		ute := untrusted(t, err, ch.DDL.SessionRole, "WithRoleDependentSchemaChanges()")
		assert.Contains(t, ute.Reason, "depends on who runs it")
	}
	assert.False(t, tt.has(t, tt.bob, "public.ledger", "SELECT"))

	c := tt.connect(t, siphon.WithTrustedSchemaRoles(m, a), siphon.WithRoleDependentSchemaChanges())
	_, err := tt.consumeTx(t, c, 0x1000, 10, changes...)
	require.NoError(t, err)
	assert.True(t, tt.has(t, tt.bob, "public.ledger", "SELECT"), "alice's GRANT applied")
	execSQL(t, tt.admin, "CREATE TABLE public.later (id int)")
	for _, p := range []string{"DELETE", "UPDATE"} {
		assert.False(t, tt.has(t, m, "public.accounts", p), "her no-op GRANT gave her nothing")
	}
	assert.False(t, tt.has(t, m, "public.later", "SELECT"), "her default privileges are for her tables, not the DBA's")
	assert.True(t, tt.exists(t, "public.accounts"), "DROP OWNED BY CURRENT_USER dropped only what is hers")
	assert.True(t, tt.exists(t, "public.ledger"))
	assert.False(t, tt.exists(t, "mal.own"))
	assert.False(t, tt.exists(t, "mal.marks"), "her own table went with DROP OWNED")
}

// TestSchemaChangeTrustDefaults checks who is trusted without options: a
// source superuser and the role that installed the capture; a record
// that does not say who made it is not; SkipSchemaChanges still skips an
// untrusted change, explicitly.
func TestSchemaChangeTrustDefaults(t *testing.T) {
	t.Parallel()
	tt := newTrustTarget(t)
	c := tt.connect(t)
	super := ddlBy("somebody_else", "CREATE TABLE", "CREATE TABLE public.by_superuser (id int)")
	super.DDL.Superuser = true
	installer := ddlBy(tt.mallory, "CREATE TABLE", "CREATE TABLE mal.by_installer (id int)")
	installer.DDL.Installer = tt.mallory
	end, err := tt.consumeTx(t, c, 0x1000, 10, super, installer)
	require.NoError(t, err)
	assert.True(t, tt.exists(t, "public.by_superuser"))
	assert.True(t, tt.exists(t, "mal.by_installer"))
	var owner string
	require.NoError(t, tt.admin.QueryRow(context.Background(), "SELECT relowner::regrole::text FROM pg_class WHERE oid = 'mal.by_installer'::regclass").Scan(&owner))
	assert.Equal(t, tt.mallory, owner, "the installer's change runs as the installer")

	anonymous := canonical.Change{Op: canonical.OpDDL, DDL: &canonical.DDL{Tag: "CREATE TABLE", Statement: "CREATE TABLE public.by_nobody (id int)", SearchPath: `"public"`}}
	next, err := tt.consumeTx(t, c, end, 11, anonymous)
	ute := untrusted(t, err, "", "WithTrustedSchemaRoles")
	assert.Contains(t, ute.Reason, "does not say which role")
	assert.False(t, tt.exists(t, "public.by_nobody"))

	got, err := tt.consumeTxSkipping(t, c, []canonical.Position{next - 0x38}, end, 11, anonymous)
	require.NoError(t, err)
	assert.Equal(t, next, got)
	assert.Equal(t, next, appliedPosition(t, c))
	assert.False(t, tt.exists(t, "public.by_nobody"), "skipped, not applied")
	assert.Equal(t, 1, count(t, tt.admin, "SELECT count(*) FROM public.accounts WHERE id = 11"), "its rows are applied")
}

// TestApplyChangeSchemaTrust checks ApplyChange's own path (a pooled
// session): an untrusted change is refused with the typed error; a
// trusted one runs as its role, and the pooled session is the applying
// role's again for the next change.
func TestApplyChangeSchemaTrust(t *testing.T) {
	t.Parallel()
	tt := newTrustTarget(t)
	m := tt.mallory
	ctx := context.Background()
	g := ddlBy(m, "CREATE FUNCTION", "CREATE FUNCTION mal.g() RETURNS text LANGUAGE sql SECURITY DEFINER AS $$SELECT current_user::text$$")
	g.Position = 0x2000

	err := tt.connect(t).ApplyChange(ctx, g)
	untrusted(t, err, m, fmt.Sprintf("WithTrustedSchemaRoles(%q)", m))
	assert.Zero(t, count(t, tt.admin, "SELECT count(*) FROM pg_proc WHERE proname = 'g'"))

	c := tt.connect(t, siphon.WithTrustedSchemaRoles(m))
	require.NoError(t, c.ApplyChange(ctx, g))
	assert.Equal(t, m, tt.procOwner(t, "mal.g()"))
	row := ins(tt.accounts.TableName(), tv("40"), tv("after"))
	row.Columns = tt.accounts.Columns
	require.NoError(t, c.ApplyChange(ctx, row), "the pooled session applies as the applying role again")
	ctas := ddlBy(m, "CREATE TABLE AS", "CREATE TABLE mal.t AS SELECT current_user::text AS who")
	require.NoError(t, c.ApplyChange(ctx, ctas))
	assert.Equal(t, 1, count(t, tt.admin, fmt.Sprintf("SELECT count(*) FROM mal.t WHERE who = '%s'", m)))
}

// TestSchemaChangeRoleMissingOnTarget: a trusted role the target does not
// have is refused, naming the role and the fix, with nothing of its
// transaction applied: run as the applying superuser, its SECURITY DEFINER
// function would be the superuser's, and any role of the target could
// call it to become superuser. A source superuser's role missing on the
// target runs as the applying role (which holds no more than a
// superuser), said once in the log.
func TestSchemaChangeRoleMissingOnTarget(t *testing.T) {
	t.Parallel()
	tt := newTrustTarget(t)
	var logged bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&logged, &slog.HandlerOptions{Level: slog.LevelInfo}))
	ghost := "ghost_of_" + tt.mallory
	c := tt.connect(t, siphon.WithTrustedSchemaRoles(ghost), siphon.WithLogger(logger))
	_, err := tt.consumeTx(t, c, 0x1000, 10,
		ddlBy(ghost, "CREATE FUNCTION", "CREATE FUNCTION public.run(q text) RETURNS void LANGUAGE plpgsql SECURITY DEFINER AS $$BEGIN EXECUTE q; END$$"))
	ute := untrusted(t, err, ghost, fmt.Sprintf("create role %q on the target", ghost))
	assert.Contains(t, ute.Reason, "does not exist on the target")
	assert.Zero(t, count(t, tt.admin, "SELECT count(*) FROM pg_proc WHERE proname = 'run'"), "no function made")
	assert.Zero(t, count(t, tt.admin, "SELECT count(*) FROM public.accounts WHERE id = 10"), "nothing of its transaction")

	admin := "source_admin_of_" + tt.mallory
	super := func(stmt string) canonical.Change {
		ch := ddlBy(admin, "CREATE TABLE", stmt)
		ch.DDL.Superuser = true
		return ch
	}
	_, err = tt.consumeTx(t, c, 0x1000, 11, super("CREATE TABLE public.g1 (id int)"), super("CREATE TABLE public.g2 (id int)"))
	require.NoError(t, err)
	var owner string
	require.NoError(t, tt.admin.QueryRow(context.Background(), "SELECT relowner::regrole::text FROM pg_class WHERE oid = 'public.g2'::regclass").Scan(&owner))
	assert.Equal(t, tt.superuser, owner)
	assert.Equal(t, 1, strings.Count(logged.String(), "run as the applying role"), logged.String())
	assert.Contains(t, logged.String(), admin)
}

// TestTrustOptionsChecked checks that Connect refuses an empty role name.
func TestTrustOptionsChecked(t *testing.T) {
	t.Parallel()
	dsn, _ := newDatabase(t)
	_, err := siphon.Connect(context.Background(), dsn, siphon.WithTrustedSchemaRoles("app", ""))
	var oe *siphon.OptionError
	require.ErrorAs(t, err, &oe)
	assert.Equal(t, "WithTrustedSchemaRoles", oe.Option)
	assert.False(t, errors.Is(err, context.Canceled))
}
