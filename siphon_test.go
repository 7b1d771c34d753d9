package siphon_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/siphondb/siphon"
	"github.com/siphondb/siphon/canonical"
	"github.com/siphondb/siphon/siphontest"
)

func TestConnectRejectsInvalidOptions(t *testing.T) {
	t.Parallel()
	cases := []struct {
		option string
		opt    siphon.Option
	}{
		{"WithSlot", siphon.WithSlot("Bad-Name")},
		{"WithSlot", siphon.WithSlot("")},
		{"WithSlot", siphon.WithSlot(strings.Repeat("a", 64))},
		{"WithPublication", siphon.WithPublication("pub; DROP TABLE x")},
		{"WithTables", siphon.WithTables(`public."unterminated`)},
		{"WithTables", siphon.WithTables("a.b.c")},
		{"WithTables", siphon.WithTables("has space")},
		{"WithStatusInterval", siphon.WithStatusInterval(0)},
		{"WithHeartbeat", siphon.WithHeartbeat(-1)},
		{"WithCopySessions", siphon.WithCopySessions(0)},
		{"WithLogger", siphon.WithLogger(nil)},
		{"WithSlotRetry", siphon.WithSlotRetry(siphon.SlotRetry{MaxBlocked: -1})},
	}
	for _, tc := range cases {
		// No server is needed: options are checked before connecting.
		c, err := siphon.Connect(context.Background(), "postgres://nobody@127.0.0.1:1/none", tc.opt)
		require.Nil(t, c)
		var optErr *siphon.OptionError
		require.ErrorAs(t, err, &optErr, tc.option)
		assert.Equal(t, tc.option, optErr.Option)
		assert.NotEmpty(t, optErr.Fix, "the error says how to fix it")
	}
}

func TestConnectInvalidDSNHidesPassword(t *testing.T) {
	t.Parallel()
	for _, dsn := range []string{
		"postgres://user:s3cretPW@host:notaport/db",
		"host=h password=s3cretPW port=notaport",
		"postgres://user:s3cretPW@[::1/db",
	} {
		_, err := siphon.Connect(context.Background(), dsn)
		require.ErrorIs(t, err, siphon.ErrInvalidDSN)
		assert.NotContains(t, err.Error(), "s3cretPW")
		var optErr *siphon.OptionError
		assert.False(t, errors.As(err, &optErr))
	}
}

func TestConnectWrongPasswordHidesIt(t *testing.T) {
	t.Parallel()
	dsn, admin := newDatabase(t)
	role := "secret_role_connect"
	execSQL(t, admin, "CREATE ROLE "+role+" LOGIN PASSWORD 'right-pw-1234'")
	t.Cleanup(func() { admin.Exec(context.Background(), "DROP ROLE IF EXISTS "+role) })

	var logs bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	wrong := strings.Replace(dsn, "postgres@", role+":wrong-pw-5678@", 1)
	_, err := siphon.Connect(context.Background(), wrong, siphon.WithLogger(logger))
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr, "the server's refusal")
	assert.Equal(t, "28P01", pgErr.Code, "invalid_password, not another failure")
	assert.NotContains(t, err.Error(), "wrong-pw-5678")
	assert.NotContains(t, logs.String(), "wrong-pw-5678")

	right := strings.Replace(dsn, "postgres@", role+":right-pw-1234@", 1)
	c, err := siphon.Connect(context.Background(), right, siphon.WithLogger(logger))
	require.NoError(t, err)
	_, err = c.InspectSchema(context.Background())
	require.NoError(t, err)
	require.NoError(t, c.Close())
	require.NoError(t, c.Close(), "Close twice is fine")
	assert.NotContains(t, logs.String(), "right-pw-1234")
}

func TestInspectSchema(t *testing.T) {
	t.Parallel()
	dsn, admin := newDatabase(t)
	execSQL(t, admin,
		`CREATE SCHEMA "Odd Schema"`,
		`CREATE TABLE "Odd Schema"."Mixed ""Case"" ü" (
			"Id" bigint, b numeric(12,2) NOT NULL, c text[], d int GENERATED ALWAYS AS ("Id" * 2) STORED,
			PRIMARY KEY (b, "Id"))`,
		`CREATE TABLE public.full_ident (a int, b text)`,
		`ALTER TABLE public.full_ident REPLICA IDENTITY FULL`,
		`CREATE TABLE public.idx_ident (a int NOT NULL, b text NOT NULL, c int)`,
		`CREATE UNIQUE INDEX idx_ident_b_a ON public.idx_ident (b, a)`,
		`ALTER TABLE public.idx_ident REPLICA IDENTITY USING INDEX idx_ident_b_a`,
		`CREATE TABLE public.parted (id int, at date, PRIMARY KEY (id, at)) PARTITION BY RANGE (at)`,
		`CREATE TABLE public.parted_2026 PARTITION OF public.parted FOR VALUES FROM ('2026-01-01') TO ('2027-01-01')`,
		`CREATE VIEW public.not_a_table AS SELECT 1`,
	)
	c, err := siphon.Connect(context.Background(), dsn)
	require.NoError(t, err)
	defer c.Close()

	schema, err := c.InspectSchema(context.Background())
	require.NoError(t, err)
	var names []string
	for _, tb := range schema.Tables {
		names = append(names, tb.TableName().String())
	}
	assert.Equal(t, []string{`Odd Schema.Mixed "Case" ü`, "public.full_ident", "public.idx_ident", "public.parted", "public.parted_2026"}, names)

	odd := schema.Table("Odd Schema", `Mixed "Case" ü`)
	require.NotNil(t, odd)
	assert.Equal(t, []canonical.Column{
		{Name: "Id", Type: "bigint", TypeOID: 20, Nullable: false},
		{Name: "b", Type: "numeric(12,2)", TypeOID: 1700, Nullable: false},
		{Name: "c", Type: "text[]", TypeOID: 1009, Nullable: true},
	}, odd.Columns, "generated column left out")
	assert.Equal(t, []string{"b", "Id"}, odd.PrimaryKey, "key in key order")
	assert.Equal(t, canonical.IdentityDefault, odd.ReplicaIdentity)
	assert.Equal(t, []string{"b", "Id"}, odd.IdentityKey)

	full := schema.Table("public", "full_ident")
	assert.Equal(t, canonical.IdentityFull, full.ReplicaIdentity)
	assert.Equal(t, []string{"a", "b"}, full.IdentityKey)
	assert.Empty(t, full.PrimaryKey)

	idx := schema.Table("public", "idx_ident")
	assert.Equal(t, canonical.IdentityIndex, idx.ReplicaIdentity)
	assert.Equal(t, []string{"b", "a"}, idx.IdentityKey)

	assert.True(t, schema.Table("public", "parted").Partitioned)
	assert.Equal(t, &canonical.TableName{Schema: "public", Name: "parted"}, schema.Table("public", "parted_2026").PartitionOf)
}

func TestInspectSchemaWithTables(t *testing.T) {
	t.Parallel()
	dsn, admin := newDatabase(t)
	execSQL(t, admin, `CREATE TABLE a (id int)`, `CREATE TABLE "B" (id int)`, `CREATE TABLE c (id int)`)

	c, err := siphon.Connect(context.Background(), dsn, siphon.WithTables(`"B"`, "public.a", "A"))
	require.NoError(t, err)
	defer c.Close()
	schema, err := c.InspectSchema(context.Background())
	require.NoError(t, err)
	require.Len(t, schema.Tables, 2, "duplicates folded, order kept")
	assert.Equal(t, "B", schema.Tables[0].Name)
	assert.Equal(t, "a", schema.Tables[1].Name)

	_, err = siphon.Connect(context.Background(), dsn, siphon.WithTables("public.nope", "a"))
	var preflight *siphon.PreflightError
	require.ErrorAs(t, err, &preflight, "Connect finds a missing table at once")
	assert.Equal(t, siphon.CheckTables, preflight.Check.Name)
	assert.Contains(t, err.Error(), "public.nope")

	execSQL(t, admin, `CREATE TABLE gone (id int)`)
	dropped, err := siphon.Connect(context.Background(), dsn, siphon.WithTables("gone"))
	require.NoError(t, err)
	defer dropped.Close()
	execSQL(t, admin, `DROP TABLE gone`)
	_, err = dropped.InspectSchema(context.Background())
	var schemaErr *siphon.SchemaIncompatibleError
	require.ErrorAs(t, err, &schemaErr, "a table dropped after Connect")
	assert.Equal(t, canonical.TableName{Schema: "public", Name: "gone"}, schemaErr.Table)
}

func TestSiphontestServerIsShared(t *testing.T) {
	t.Parallel()
	assert.Same(t, siphontest.Start(t), siphontest.Start(t))
}
