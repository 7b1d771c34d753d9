package siphon_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	mrand "math/rand/v2"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/siphondb/siphon"
	"github.com/siphondb/siphon/canonical"
	"github.com/siphondb/siphon/pgdump"
)

// snapSlotName returns a slot name unique on the server (slots are
// server-wide), derived from the test's name.
func snapSlotName(t testing.TB) string {
	var b [4]byte
	rand.Read(b[:])
	name := strings.ToLower(regexp.MustCompile(`[^A-Za-z0-9]+`).ReplaceAllString(t.Name(), "_"))
	return "t_" + name[:min(len(name), 40)] + "_" + hex.EncodeToString(b[:])
}

// snapConnect opens a siphon.Conn on dsn with a unique slot, closed when the
// test ends, and returns the slot's name too.
func snapConnect(t testing.TB, dsn string, opts ...siphon.Option) (*siphon.Conn, string) {
	t.Helper()
	slot := snapSlotName(t)
	c, err := siphon.Connect(context.Background(), dsn, append([]siphon.Option{siphon.WithSlot(slot)}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c, slot
}

// snapTake takes a snapshot, closed when the test ends.
func snapTake(t testing.TB, c *siphon.Conn) *siphon.Snapshot {
	t.Helper()
	snap, err := c.TakeSnapshot(context.Background())
	require.NoError(t, err)
	t.Cleanup(func() { snap.Close(context.Background()) })
	return snap
}

// snapCopied copies schema's tables from snap and returns each table's
// rows as "v1|v2|..." lines (NULL printed as ␀), sorted.
func snapCopied(t testing.TB, snap *siphon.Snapshot, schema *canonical.Schema) map[canonical.TableName][]string {
	t.Helper()
	out := map[canonical.TableName][]string{}
	err := snap.CopyTables(context.Background(), schema, siphon.CopyOptions{}, func(table *canonical.Table, row canonical.Row) error {
		out[table.TableName()] = append(out[table.TableName()], snapRowLine(row))
		return nil
	})
	require.NoError(t, err)
	for _, rows := range out {
		slices.Sort(rows)
	}
	return out
}

// snapRowLine prints a row for comparisons: values quoted, NULL as ␀.
func snapRowLine(row canonical.Row) string {
	parts := make([]string, len(row))
	for i, v := range row {
		if s, ok := v.Text(); ok {
			parts[i] = strconv.Quote(s)
		} else {
			parts[i] = "␀"
		}
	}
	return strings.Join(parts, "|")
}

// snapSession opens a session with siphon's session settings.
func snapSession(t testing.TB, dsn string) *pgx.Conn {
	t.Helper()
	config, err := pgx.ParseConfig(dsn)
	require.NoError(t, err)
	for k, v := range siphon.SessionSettingsForTest {
		config.RuntimeParams[k] = v
	}
	config.RuntimeParams["application_name"] = "siphon_test"
	conn, err := pgx.ConnectConfig(context.Background(), config)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// snapSelected returns what a plain SELECT of the columns prints in text
// format, as snapRowLine lines, sorted.
func snapSelected(t testing.TB, conn *pgx.Conn, table *canonical.Table) []string {
	t.Helper()
	cols := make([]string, len(table.Columns))
	for i, c := range table.Columns {
		cols[i] = pgx.Identifier{c.Name}.Sanitize()
	}
	sql := "SELECT " + strings.Join(cols, ", ") + " FROM ONLY " + pgx.Identifier{table.Schema, table.Name}.Sanitize()
	res := conn.PgConn().ExecParams(context.Background(), sql, nil, nil, nil, nil).Read()
	require.NoError(t, res.Err)
	var out []string
	for _, r := range res.Rows {
		row := make(canonical.Row, len(r))
		for i, v := range r {
			if v != nil {
				row[i] = canonical.Text(string(v))
			}
		}
		out = append(out, snapRowLine(row))
	}
	slices.Sort(out)
	return out
}

// snapTypesSchema creates a table with a column of every type class of
// DESIGN.md, under odd identifiers, and rows of edge values.
var snapTypesSchema = []string{
	`CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy ü')`,
	`CREATE DOMAIN posint AS int CHECK (VALUE > 0)`,
	`CREATE DOMAIN flag AS boolean`,
	`CREATE DOMAIN flag2 AS flag`,
	`CREATE DOMAIN money_amount AS numeric(12,2)`,
	`CREATE DOMAIN ip AS inet`,
	`CREATE DOMAIN word AS char(4)`,
	`CREATE TYPE pair AS (a int, "B b" text)`,
	`CREATE DOMAIN pair_d AS pair`,
	`CREATE DOMAIN ints AS int[]`,
	`CREATE SCHEMA "Odd ""Schema"""`,
	`CREATE TABLE "Odd ""Schema"""."Types Ü ""t""" (
		id int PRIMARY KEY,
		"Odd ""Col"" ü" text, vc varchar(10), ch char(5), nm name, qc "char", bo boolean,
		i2 int2, i4 int4, i8 int8, o oid, n numeric, n2 numeric(20,6), f4 float4, f8 float8, m money,
		d date, t time, ttz timetz, ts timestamp, tstz timestamptz, iv interval,
		by bytea, u uuid, j json, jb jsonb, x xml,
		a2 int[][], ta text[], ba boolean[], ia inet[], ca char(3)[], pa pair[],
		r int4range, tr tstzrange, nr numrange, mr int4multirange,
		e mood, dom posint, dflag flag, dflag2 flag2, dmon money_amount, dip ip, dword word, dpair pair_d, dints ints,
		comp pair, ip inet, cidr cidr, mac macaddr, mac8 macaddr8,
		bits bit(4), vb varbit, tsv tsvector, tsq tsquery, pt point, js jsonpath, pl pg_lsn)`,
	`INSERT INTO "Odd ""Schema"""."Types Ü ""t""" (id) VALUES (1)`,
	`INSERT INTO "Odd ""Schema"""."Types Ü ""t""" VALUES (2,
		'', '', '', '', '', false,
		0, 0, 0, 0, 0, 0, 0, 0, 0,
		'2000-01-01', '00:00', '00:00+00', '2000-01-01', '2000-01-01 00:00+00', '0',
		'', '00000000-0000-0000-0000-000000000000', '""', '""', '',
		'{}', '{"",NULL}', '{}', '{}', '{"   ",NULL}', '{"(,)",NULL}',
		'empty', 'empty', 'empty', '{}',
		'ok', 1, false, false, 0, '0.0.0.0', '', '(,)', '{}',
		'(,)', '0.0.0.0', '0.0.0.0/0', '00:00:00:00:00:00', '00:00:00:00:00:00:00:00',
		'0000', '', '', '', '(0,0)', '$', '0/0')`,
	`INSERT INTO "Odd ""Schema"""."Types Ü ""t""" VALUES (3,
		E'tab\there \\ "quote" ü 😀 \n new line', 'ab  ', 'ab', 'a name', 'é', true,
		-32768, -2147483648, 9223372036854775807, 4294967295, 'NaN', '-123456789012.000001', 'NaN', '-Infinity', '-92233720368547758.08',
		'infinity', '23:59:59.999999', '23:59:59.999999-15:59', '4713-01-01 BC', '294276-12-31 23:59:59.999999+00', '-178956970 years -8 mons -2147483647 days -2562047788:00:54.775807',
		'\x00ff10', 'A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11', '{"b": 1, "a": [1.50, "x"]}', '{"b": 1, "a": [1.50, "x\u00fc"]}', '<a b="c">&amp;</a>',
		'{{1,NULL},{3,4}}', '{"a,b","c\"d",NULL,"NULL",""}', '{t,f,NULL}', '{1.2.3.4/32,::1,10.0.0.0/8}', '{"a  ","  b"}', '{"(1,\"x y\")","(,)"}',
		'[1,5)', '[2024-01-01 10:00:00.5+02,infinity)', '(,1.5]', '{[1,3),[5,7)}',
		'happy ü', 2147483647, true, true, 9999999999.99, '192.168.1.1/24', 'ab', '(7,"a,b")', '{1,2}',
		'(5,"")', '10.1.2.3', '10.1.0.0/16', '08:00:2b:01:02:03', '08:00:2b:01:02:03:04:05',
		'1010', '101', 'a:1 fat:2B cat', 'fat & (rat | !cat)', '(1.5,-2)', '$.a[*] ? (@ > 1)', 'FFFFFFFF/FFFFFFFF')`,
	`INSERT INTO "Odd ""Schema"""."Types Ü ""t""" VALUES (4,
		'x', 'x', 'x    ', 'x', E'\\377', true,
		32767, 2147483647, -9223372036854775808, 0, '-Infinity', '0.000001', 'Infinity', 'NaN', 0.01,
		'-infinity', '00:00:00.000001', '00:00:00+15:59', '0001-01-01 00:00:00.000001 BC', '-infinity', '1 year 2 mons 3 days 04:05:06.789',
		'\x', 'ffffffff-ffff-ffff-ffff-ffffffffffff', 'null', 'null', '<?xml version="1.0"?><r/>',
		'{{{1}},{{NULL}}}', '{}', '{NULL}', '{NULL}', '{}', '{}',
		'[,)', '(,)', 'empty', '{[,)}',
		'sad', 1, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
		'(,"")', '::ffff:1.2.3.4', '2001:db8::/32', 'ff:ff:ff:ff:ff:ff', 'ff:ff:ff:ff:ff:ff:ff:ff',
		'1111', '', '''a b'':1A', 'a <-> b', '(0,-0)', 'strict $', '1/1')`,
	`INSERT INTO "Odd ""Schema"""."Types Ü ""t""" (id, n, n2, f4, f8, i8, ts, tstz, d) VALUES
		(5, 123456789012345678901234567890.123456789012345678901234567890, 0.1, 1e-45, 5e-324, 9007199254740993,
		 '1999-12-31 23:59:59.5', '1970-01-01 00:00:00.000001+00', '5874897-12-31'),
		(6, 1e-300, -0.000001, 3.4028235e38, 1.7976931348623157e308, -9007199254740993,
		 '4714-11-24 00:00:00 BC', '4714-11-24 00:00:00+00 BC', '4714-11-24 BC'),
		(7, 0.00, 100, -0, -0, 1, '2024-02-29 12:00:00.100', '2024-02-29 12:00:00.12+14', '2024-02-29'),
		(8, 1e20, 1e13, 123456, 123456789012345, 2, '0001-01-01 00:00:00', '0001-01-01 00:00:00+00', '0001-01-01'),
		(9, -9999.9999, 12345678901234.5, 1234567, 1234567890123456, 3, '1999-01-08 04:05:06', '1999-01-08 04:05:06-8:00', '1999-01-08 BC')`,
}

func TestSnapshotValuesMatchServerText(t *testing.T) {
	t.Parallel()
	dsn, admin := newDatabase(t)
	execSQL(t, admin, snapTypesSchema...)
	random := snapRandomValues(t)
	execSQL(t, admin, random...)
	c, _ := snapConnect(t, dsn)
	ctx := context.Background()
	schema, err := c.InspectSchema(context.Background())
	require.NoError(t, err)
	snap := snapTake(t, c)
	copied := snapCopied(t, snap, schema)

	conn := snapSession(t, dsn)
	for i := range schema.Tables {
		table := &schema.Tables[i]
		want := snapSelected(t, conn, table)
		got := copied[table.TableName()]
		require.Len(t, got, len(want), table.TableName().String())
		var differ []string
		for j := range want {
			if want[j] != got[j] {
				differ = append(differ, fmt.Sprintf("server %s\ncopied %s", want[j], got[j]))
			}
		}
		assert.Empty(t, differ, "%s: %d rows differ from the server's text", table.TableName(), len(differ))
	}

	// NULL, the empty string and a composite of NULLs stay apart.
	types := schema.Table(`Odd "Schema"`, `Types Ü "t"`)
	require.NotNil(t, types)
	byID := map[string]canonical.Row{}
	err = snap.CopyTables(context.Background(), &canonical.Schema{Tables: []canonical.Table{*types}}, siphon.CopyOptions{},
		func(_ *canonical.Table, row canonical.Row) error {
			id, _ := row[0].Text()
			byID[id] = slices.Clone(row)
			return nil
		})
	require.NoError(t, err)
	col := func(name string) int { return types.ColumnIndex(name) }
	assert.True(t, byID["1"][col(`Odd "Col" ü`)].IsNull())
	assert.Equal(t, canonical.Text(""), byID["2"][col(`Odd "Col" ü`)])
	assert.Equal(t, canonical.Text("(,)"), byID["2"][col("comp")])
	assert.True(t, byID["1"][col("comp")].IsNull())
	assert.Equal(t, canonical.Text("t"), byID["3"][col("dflag2")], "domain over a domain over boolean")
	assert.Equal(t, canonical.Text("x    "), byID["4"][col("ch")], "char(n) keeps its padding")
	assert.Equal(t, canonical.Text("9223372036854775807"), byID["3"][col("i8")])
	assert.Equal(t, canonical.Text("{1.2.3.4,::1,10.0.0.0/8}"), byID["3"][col("ia")])

	// Through JSONL into another database, every value reads back the same.
	var jsonl bytes.Buffer
	_, err = c.EmitCanonical(ctx, schema, &jsonl)
	require.NoError(t, err)
	targetDSN, target := newDatabase(t)
	execSQL(t, target, slices.DeleteFunc(slices.Clone(snapTypesSchema), func(s string) bool { return strings.HasPrefix(s, "INSERT") })...)
	execSQL(t, target, random[0], random[2]) // the CREATE TABLEs
	a := newSnapApplier(t, targetDSN)
	dec := canonical.NewDecoder(&jsonl)
	for {
		rec, err := dec.Next()
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
		if rec.Type == canonical.RecordRow {
			require.NoError(t, a.row(rec.Table, rec.Row))
		}
	}
	require.NoError(t, a.flush())
	assert.Equal(t, snapDigests(t, admin, schema), snapDigests(t, target, schema))
}

// snapRandomValues adds a table of many random float4, float8, numeric, date,
// timestamp and timestamptz values, whose text siphon computes itself from
// their binary form.
func snapRandomValues(t testing.TB) []string {
	r := mrand.New(mrand.NewPCG(1, 2))
	var rows []string
	for i := range 2000 {
		f8 := math.Float64frombits(r.Uint64())
		f4 := math.Float32frombits(r.Uint32())
		if i%2 == 1 { // values of ordinary magnitude too
			f8 = (r.Float64() - 0.5) * math.Pow(10, float64(r.IntN(40)-20))
			f4 = float32(f8)
		}
		f8s, f4s := snapFloatLiteral(f8, 64), snapFloatLiteral(float64(f4), 32)
		var num strings.Builder
		if r.IntN(2) == 0 {
			num.WriteByte('-')
		}
		for range 1 + r.IntN(30) {
			num.WriteByte(byte('0' + r.IntN(10)))
		}
		if r.IntN(3) > 0 {
			num.WriteByte('.')
			for range r.IntN(30) {
				num.WriteByte(byte('0' + r.IntN(10)))
			}
		}
		if r.IntN(4) == 0 {
			fmt.Fprintf(&num, "e%d", r.IntN(200)-100)
		}
		secs := -210866803200 + r.Float64()*(9224318016000+210866803200)
		rows = append(rows, fmt.Sprintf("(%d, %s::float8, %s::float4, '%s'::numeric, to_timestamp(%f), to_timestamp(%f) AT TIME ZONE 'UTC', ('4714-11-24 BC'::date + %d))",
			i, f8s, f4s, num.String(), secs, secs/40, r.IntN(2147483494)))
	}
	// Short decimals of large magnitude often lie exactly halfway between
	// two floats, where PostgreSQL prints more digits than the shortest.
	var ties []string
	for i := range 3000 {
		d4, d8 := 1+r.IntN(8), 1+r.IntN(17)
		ties = append(ties, fmt.Sprintf("(%d, '%de%d', '%de%d')", i,
			r.Int64N(int64(math.Pow10(d4))), r.IntN(38-d4), r.Int64N(int64(math.Pow10(d8))), r.IntN(308-d8)))
	}
	return []string{
		`CREATE TABLE float_ties (id int PRIMARY KEY, f4 float4, f8 float8)`,
		`INSERT INTO float_ties VALUES ` + strings.Join(ties, ",\n"),
		`CREATE TABLE random_values (id int PRIMARY KEY, f8 float8, f4 float4, n numeric, tstz timestamptz, ts timestamp, d date)`,
		`INSERT INTO random_values VALUES ` + strings.Join(rows, ",\n"),
	}
}

// snapFloatLiteral prints f exactly as an SQL literal (NaN and infinities
// quoted).
func snapFloatLiteral(f float64, bits int) string {
	switch {
	case math.IsNaN(f):
		return "'NaN'"
	case math.IsInf(f, 1):
		return "'Infinity'"
	case math.IsInf(f, -1):
		return "'-Infinity'"
	}
	return "'" + strconv.FormatFloat(f, 'g', -1, bits) + "'"
}

// snapApplier applies snapshot rows and streamed changes to a target
// database idempotently: rows and inserts are upserts by primary key, as a
// consumer of a resumed copy must apply them.
type snapApplier struct {
	conn  *pgx.Conn
	batch *pgx.Batch
}

func newSnapApplier(t testing.TB, dsn string) *snapApplier {
	t.Helper()
	config, err := pgx.ParseConfig(dsn)
	require.NoError(t, err)
	config.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol // values go as literals, read by input functions
	for k, v := range siphon.SessionSettingsForTest {
		config.RuntimeParams[k] = v
	}
	config.RuntimeParams["application_name"] = "siphon_test"
	conn, err := pgx.ConnectConfig(context.Background(), config)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close(context.Background()) })
	return &snapApplier{conn: conn, batch: &pgx.Batch{}}
}

func snapArgs(row canonical.Row) []any {
	args := make([]any, len(row))
	for i, v := range row {
		if s, ok := v.Text(); ok {
			args[i] = s
		}
	}
	return args
}

// upsertSQL inserts a row, replacing the row with its primary key.
func snapUpsertSQL(table canonical.TableName, cols []canonical.Column, key []string) string {
	names, params, set := make([]string, len(cols)), make([]string, len(cols)), make([]string, len(cols))
	for i, c := range cols {
		names[i] = pgx.Identifier{c.Name}.Sanitize()
		params[i] = fmt.Sprintf("$%d", i+1)
		set[i] = names[i] + " = EXCLUDED." + names[i]
	}
	keys := make([]string, len(key))
	for i, k := range key {
		keys[i] = pgx.Identifier{k}.Sanitize()
	}
	return "INSERT INTO " + pgx.Identifier{table.Schema, table.Name}.Sanitize() + " (" + strings.Join(names, ", ") +
		") VALUES (" + strings.Join(params, ", ") + ") ON CONFLICT (" + strings.Join(keys, ", ") + ") DO UPDATE SET " + strings.Join(set, ", ")
}

// row queues a snapshot row; flush sends the queue.
func (a *snapApplier) row(table *canonical.Table, row canonical.Row) error {
	a.batch.Queue(snapUpsertSQL(table.TableName(), table.Columns, table.PrimaryKey), snapArgs(row)...)
	if a.batch.Len() >= 500 {
		return a.flush()
	}
	return nil
}

func (a *snapApplier) flush() error {
	if a.batch.Len() == 0 {
		return nil
	}
	b := a.batch
	a.batch = &pgx.Batch{}
	return a.conn.SendBatch(context.Background(), b).Close()
}

// keyWhere is "k1 = $n AND ..." for the key columns of a change's row.
func snapKeyWhere(cols []canonical.Column, key []string, row canonical.Row, args []any) (string, []any) {
	var conds []string
	for _, k := range key {
		for i, c := range cols {
			if c.Name == k {
				args = append(args, snapArgs(row[i : i+1])[0])
				conds = append(conds, fmt.Sprintf("%s = $%d", pgx.Identifier{k}.Sanitize(), len(args)))
			}
		}
	}
	return strings.Join(conds, " AND "), args
}

// change applies one streamed change; key gives each table's primary key.
func (a *snapApplier) change(ch canonical.Change, key func(canonical.TableName) []string) error {
	ctx := context.Background()
	name := ch.TableName()
	target := pgx.Identifier{name.Schema, name.Name}.Sanitize()
	switch ch.Op {
	case canonical.OpInsert:
		_, err := a.conn.Exec(ctx, snapUpsertSQL(name, ch.Columns, key(name)), snapArgs(ch.New)...)
		return err
	case canonical.OpUpdate:
		if len(ch.Unchanged()) == 0 {
			if ch.Old != nil { // the key changed
				where, args := snapKeyWhere(ch.Columns, key(name), ch.Old, nil)
				if _, err := a.conn.Exec(ctx, "DELETE FROM "+target+" WHERE "+where, args...); err != nil {
					return err
				}
			}
			_, err := a.conn.Exec(ctx, snapUpsertSQL(name, ch.Columns, key(name)), snapArgs(ch.New)...)
			return err
		}
		var set []string
		var args []any
		for i, c := range ch.Columns {
			if !ch.New[i].IsUnchanged() {
				args = append(args, snapArgs(ch.New[i : i+1])[0])
				set = append(set, fmt.Sprintf("%s = $%d", pgx.Identifier{c.Name}.Sanitize(), len(args)))
			}
		}
		old := ch.New
		if ch.Old != nil {
			old = ch.Old
		}
		where, args := snapKeyWhere(ch.Columns, key(name), old, args)
		_, err := a.conn.Exec(ctx, "UPDATE "+target+" SET "+strings.Join(set, ", ")+" WHERE "+where, args...)
		return err
	case canonical.OpDelete:
		where, args := snapKeyWhere(ch.Columns, key(name), ch.Old, nil)
		_, err := a.conn.Exec(ctx, "DELETE FROM "+target+" WHERE "+where, args...)
		return err
	case canonical.OpTruncate:
		for _, n := range ch.Truncated {
			if _, err := a.conn.Exec(ctx, "TRUNCATE "+pgx.Identifier{n.Schema, n.Name}.Sanitize()); err != nil {
				return err
			}
		}
	}
	return nil
}

// snapDigests returns each table's row count and an ordered digest of its
// rows' text.
func snapDigests(t testing.TB, conn *pgx.Conn, schema *canonical.Schema) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, table := range schema.Tables {
		var digest string
		name := pgx.Identifier{table.Schema, table.Name}.Sanitize()
		require.NoError(t, conn.QueryRow(context.Background(),
			"SELECT count(*) || ' rows ' || md5(coalesce(string_agg(snap_row::text, E'\\n' ORDER BY snap_row::text), '')) FROM "+name+" snap_row").Scan(&digest))
		out[table.TableName().String()] = digest
	}
	return out
}

// snapShop is a small shop: a large table with TOASTed values, a table with
// generated keys, a partitioned table and a table with odd identifiers.
var snapShop = []string{
	`CREATE TABLE accounts (id bigint PRIMARY KEY, balance numeric(14,2) NOT NULL, note text, doc text, seen timestamptz)`,
	`CREATE TABLE events (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), account bigint, payload jsonb, at timestamptz DEFAULT now())`,
	`CREATE TABLE parted (id int, region text, qty int, PRIMARY KEY (id, region)) PARTITION BY LIST (region)`,
	`CREATE TABLE parted_eu PARTITION OF parted FOR VALUES IN ('eu')`,
	`CREATE TABLE parted_us PARTITION OF parted FOR VALUES IN ('us')`,
	`CREATE TABLE "Odd ""Name"" ü" ("Key" text PRIMARY KEY, "Val ue" int[])`,
}

// snapShopRows fills the shop: about 6 MB of accounts, some with a TOASTed
// doc.
var snapShopRows = []string{
	`INSERT INTO accounts SELECT i, i * 1.5, repeat(md5(i::text), 6),
		CASE WHEN i % 500 = 0 THEN (SELECT string_agg(md5(i::text || j), '') FROM generate_series(1, 200) j) END,
		'2024-01-01'::timestamptz + i * interval '1 minute'
	 FROM generate_series(1, 20000) i`,
	`INSERT INTO events (account, payload) SELECT i, jsonb_build_object('n', i, 'tags', jsonb_build_array('a', i)) FROM generate_series(1, 2000) i`,
	`INSERT INTO parted SELECT i, CASE WHEN i % 2 = 0 THEN 'eu' ELSE 'us' END, i FROM generate_series(1, 2000) i`,
	`INSERT INTO "Odd ""Name"" ü" SELECT 'k ' || i, ARRAY[i, NULL] FROM generate_series(1, 500) i`,
	`ANALYZE`,
}

func TestSnapshotSchemaChangedAfterSnapshot(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, change, column, problem string
	}{
		{"vacuum full", `VACUUM FULL t`, "", "rewritten after the snapshot"},
		{"truncate", `TRUNCATE t`, "", "rewritten after the snapshot"},
		{"rewriting alter", `ALTER TABLE t ALTER COLUMN v TYPE bigint`, "", "rewritten after the snapshot"},
		{"drop column", `ALTER TABLE t DROP COLUMN v`, "v", "dropped after the snapshot"},
		{"rename column", `ALTER TABLE t RENAME COLUMN v TO w`, "v", `renamed to "w" after the snapshot`},
		{"rename table", `ALTER TABLE t RENAME TO t2`, "", "renamed or dropped after the snapshot"},
		{"drop table", `DROP TABLE t`, "", "renamed or dropped after the snapshot"},
		{"replace table", `DROP TABLE t; CREATE TABLE t (id int PRIMARY KEY, v int)`, "", "dropped and created again after the snapshot"},
		{"primary key", `ALTER TABLE t DROP CONSTRAINT t_pkey; ALTER TABLE t ADD PRIMARY KEY (id, v)`, "", "primary key changed after the snapshot"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dsn, admin := newDatabase(t)
			execSQL(t, admin, `CREATE TABLE a (id int PRIMARY KEY)`, `INSERT INTO a SELECT generate_series(1, 10)`,
				`CREATE TABLE t (id int PRIMARY KEY, v int NOT NULL)`, `INSERT INTO t SELECT i, i FROM generate_series(1, 100) i`)
			c, slot := snapConnect(t, dsn)
			schema, err := c.InspectSchema(context.Background())
			require.NoError(t, err)
			snap := snapTake(t, c)
			execSQL(t, admin, tc.change)
			err = snap.CopyTables(context.Background(), schema, siphon.CopyOptions{}, func(*canonical.Table, canonical.Row) error { return nil })
			var schemaErr *siphon.SchemaIncompatibleError
			require.ErrorAs(t, err, &schemaErr)
			assert.Equal(t, canonical.TableName{Schema: "public", Name: "t"}, schemaErr.Table)
			assert.Equal(t, tc.column, schemaErr.Column)
			assert.Contains(t, schemaErr.Problem, tc.problem)
			require.NoError(t, snap.Close(context.Background()))
			require.NoError(t, c.Close())
			assertNoLeaks(t, dsn, slot)
		})
	}
}

// TestSnapshotOutlivesTheDatabasesTimeouts: a database whose sessions
// get timeouts of 500 ms still gets its copy when the consumer is slow and
// the copy starts a while after the snapshot: neither the session that
// exports the snapshot nor the copying sessions, idle in their
// transactions meanwhile, may be ended.
func TestSnapshotOutlivesTheDatabasesTimeouts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn, admin := newDatabase(t)
	execSQL(t, admin, `CREATE TABLE a (id int PRIMARY KEY)`, `INSERT INTO a SELECT generate_series(1, 10)`,
		`CREATE TABLE t (id int PRIMARY KEY, v int NOT NULL)`, `INSERT INTO t SELECT i, i FROM generate_series(1, 100) i`)
	shortDatabaseTimeouts(t, admin)
	c, slot := snapConnect(t, dsn, siphon.WithCopySessions(2))
	schema, err := c.InspectSchema(ctx)
	require.NoError(t, err)
	snap := snapTake(t, c)
	time.Sleep(time.Second)
	rows := map[string]int{}
	require.NoError(t, snap.CopyTables(ctx, schema, siphon.CopyOptions{}, func(table *canonical.Table, _ canonical.Row) error {
		if rows[table.Name] == 0 {
			time.Sleep(time.Second)
		}
		rows[table.Name]++
		return nil
	}))
	assert.Equal(t, map[string]int{"a": 10, "t": 100}, rows)
	require.NoError(t, snap.Close(ctx))
	require.NoError(t, c.Close())
	assertNoLeaks(t, dsn, slot)
}

func TestSnapshotSchemaDiffersFromSnapshot(t *testing.T) {
	t.Parallel()
	dsn, admin := newDatabase(t)
	execSQL(t, admin, `CREATE TABLE t (id int PRIMARY KEY, v int)`)
	c, _ := snapConnect(t, dsn)
	schema, err := c.InspectSchema(context.Background())
	require.NoError(t, err)
	execSQL(t, admin, `ALTER TABLE t ADD COLUMN "New" text`)
	snap := snapTake(t, c)
	err = snap.CopyTables(context.Background(), schema, siphon.CopyOptions{}, func(*canonical.Table, canonical.Row) error { return nil })
	var schemaErr *siphon.SchemaIncompatibleError
	require.ErrorAs(t, err, &schemaErr)
	assert.Equal(t, "New", schemaErr.Column)
	assert.Contains(t, schemaErr.Problem, "inspect the schema again")
}

// DDL that comes once a table is locked waits for the copy, which sees the
// table as it was.
func TestSnapshotDDLDuringCopyWaits(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn, admin := newDatabase(t)
	execSQL(t, admin, `CREATE TABLE a (id int PRIMARY KEY)`, `INSERT INTO a SELECT generate_series(1, 10)`,
		`CREATE TABLE b (id int PRIMARY KEY, v int)`, `INSERT INTO b SELECT i, i FROM generate_series(1, 10) i`)
	c, _ := snapConnect(t, dsn, siphon.WithCopySessions(1))
	schema, err := c.InspectSchema(ctx)
	require.NoError(t, err)
	snap := snapTake(t, c)
	ddl := make(chan error, 1)
	var pid uint32
	rows := 0
	err = snap.CopyTables(ctx, schema, siphon.CopyOptions{}, func(table *canonical.Table, row canonical.Row) error {
		rows++
		if rows > 1 {
			return nil
		}
		other, err := pgx.Connect(ctx, dsn)
		require.NoError(t, err)
		pid = other.PgConn().PID()
		go func() {
			defer other.Close(ctx)
			_, err := other.Exec(ctx, `ALTER TABLE b DROP COLUMN v`)
			ddl <- err
		}()
		snapWaitForLock(t, admin, pid, ddl)
		return nil
	})
	require.NoError(t, err)
	assert.Equal(t, 20, rows, "b copied with its column v")
	require.NoError(t, snap.Close(ctx))
	require.NoError(t, <-ddl, "the ALTER TABLE went through once the copy ended")
}

func TestEmitCanonical(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn, admin := newDatabase(t)
	execSQL(t, admin, snapShop...)
	execSQL(t, admin, snapShopRows...)
	execSQL(t, admin, `CREATE UNLOGGED TABLE scratch (id int)`, `INSERT INTO scratch VALUES (1)`)
	c, slot := snapConnect(t, dsn, siphon.WithCopySessions(3))

	var out bytes.Buffer
	pos, err := c.EmitCanonical(ctx, nil, &out)
	require.NoError(t, err)
	require.False(t, pos.IsZero())

	dec := canonical.NewDecoder(&out)
	h, err := dec.Header()
	require.NoError(t, err)
	assert.Equal(t, canonical.KindSnapshot, h.Kind)
	assert.Equal(t, canonical.EnginePostgres, h.Engine)
	assert.Equal(t, pos, h.Start)
	assert.Equal(t, slot, h.Slot)
	assert.NotEmpty(t, h.SystemID)
	assert.NotEmpty(t, h.ServerVersion)

	var tables []string
	rows := map[canonical.TableName][]string{}
	var order []canonical.TableName
	for {
		rec, err := dec.Next()
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
		switch rec.Type {
		case canonical.RecordTable:
			require.Empty(t, rows, "table records come first")
			tables = append(tables, rec.TableName().String())
		case canonical.RecordRow:
			name := rec.TableName()
			if len(order) == 0 || order[len(order)-1] != name {
				require.NotContains(t, order, name, "rows come table by table")
				order = append(order, name)
			}
			rows[name] = append(rows[name], snapRowLine(rec.Row))
		case canonical.RecordEnd:
			assert.Equal(t, pos, rec.Position)
		}
	}
	assert.Equal(t, []string{`public.Odd "Name" ü`, "public.accounts", "public.events", "public.parted", "public.parted_eu", "public.parted_us"},
		tables, "every published table, the unlogged one left out")

	// The rows are the source's (nothing changed since the snapshot).
	conn := snapSession(t, dsn)
	schema, err := c.InspectSchema(ctx)
	require.NoError(t, err)
	for _, table := range schema.Tables {
		if table.Name == "scratch" {
			continue
		}
		got := rows[table.TableName()]
		slices.Sort(got)
		assert.Equal(t, snapSelected(t, conn, &table), got, table.TableName().String())
	}
	require.NoError(t, c.Close())
	assertNoLeaks(t, dsn, slot)
}

func TestSnapshotPartitionedThroughLeaves(t *testing.T) {
	t.Parallel()
	dsn, admin := newDatabase(t)
	execSQL(t, admin,
		`CREATE TABLE m (id int, at date, note text, PRIMARY KEY (id, at)) PARTITION BY RANGE (at)`,
		`CREATE TABLE m_2025 PARTITION OF m FOR VALUES FROM ('2025-01-01') TO ('2026-01-01') PARTITION BY HASH (id)`,
		`CREATE TABLE m_2025_a PARTITION OF m_2025 FOR VALUES WITH (MODULUS 2, REMAINDER 0)`,
		`CREATE TABLE m_2025_b PARTITION OF m_2025 FOR VALUES WITH (MODULUS 2, REMAINDER 1)`,
		// A partition whose columns are in another order.
		`CREATE TABLE m_2026 (note text, at date NOT NULL, id int NOT NULL)`,
		`ALTER TABLE m ATTACH PARTITION m_2026 FOR VALUES FROM ('2026-01-01') TO ('2027-01-01')`,
		`INSERT INTO m SELECT i, '2025-01-01'::date + i, 'n' || i FROM generate_series(1, 600) i`,
		`CREATE TABLE zero_columns ()`, `INSERT INTO zero_columns DEFAULT VALUES`, `INSERT INTO zero_columns DEFAULT VALUES`)
	c, _ := snapConnect(t, dsn, siphon.WithTables("m", "zero_columns"), siphon.WithKeylessTables(siphon.KeylessInsertsOnly))
	schema, err := c.InspectSchema(context.Background())
	require.NoError(t, err)
	snap := snapTake(t, c)
	got := snapCopied(t, snap, schema)

	conn := snapSession(t, dsn)
	m := *schema.Table("public", "m")
	rows, err := conn.Query(context.Background(), `SELECT format('%L|%L|%L', id, at, note) FROM m`)
	require.NoError(t, err)
	want, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	for i := range want {
		want[i] = strings.ReplaceAll(want[i], "'", `"`)
	}
	slices.Sort(want)
	assert.Len(t, want, 600)
	assert.Equal(t, want, got[m.TableName()], "every leaf's rows, delivered as the partitioned table, in its column order")
	assert.Equal(t, []string{"", ""}, got[canonical.TableName{Schema: "public", Name: "zero_columns"}])
}

// TestSnapshotCopyCancelled stops copies with a cancelled ctx, a callback
// error and a callback panic: each returns (or panics) with every session
// it opened closed, and leaves nothing behind.
func TestSnapshotCopyCancelled(t *testing.T) {
	t.Parallel()
	dsn, admin := newDatabase(t)
	execSQL(t, admin, snapShop...)
	execSQL(t, admin, snapShopRows...)
	c, slot := snapConnect(t, dsn, siphon.WithCopySessions(4))
	schema, err := c.InspectSchema(context.Background())
	require.NoError(t, err)
	snap, err := c.TakeSnapshot(context.Background())
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	err = snap.CopyTables(ctx, schema, siphon.CopyOptions{}, func(*canonical.Table, canonical.Row) error {
		cancel()
		return nil
	})
	require.ErrorIs(t, err, context.Canceled)

	stop := errors.New("stop")
	err = snap.CopyTables(context.Background(), schema, siphon.CopyOptions{}, func(*canonical.Table, canonical.Row) error { return stop })
	require.ErrorIs(t, err, stop)

	// A callback that panics: the panic reaches the caller once every
	// copying session has stopped, and the snapshot copies again.
	assert.PanicsWithValue(t, "handler bug", func() {
		snap.CopyTables(context.Background(), schema, siphon.CopyOptions{}, func(*canonical.Table, canonical.Row) error { panic("handler bug") })
	})
	rows := 0
	require.NoError(t, snap.CopyTables(context.Background(), schema, siphon.CopyOptions{}, func(*canonical.Table, canonical.Row) error { rows++; return nil }))
	assert.Positive(t, rows)

	require.NoError(t, snap.Close(context.Background()))
	err = snap.CopyTables(context.Background(), schema, siphon.CopyOptions{}, func(*canonical.Table, canonical.Row) error { return nil })
	assert.ErrorIs(t, err, siphon.ErrClosed)
	assert.ErrorContains(t, err, "the snapshot")
	require.NoError(t, c.Close())
	assertNoLeaks(t, dsn, slot)
}

// snapWaitForLock waits until the session pid waits for a lock, and fails
// if its statement finished instead.
func snapWaitForLock(t *testing.T, admin *pgx.Conn, pid uint32, done chan error) {
	t.Helper()
	var waiting bool
	waitFor(t, "the session waits for a lock or its statement finishes", func() bool {
		if len(done) > 0 {
			return true
		}
		err := admin.QueryRow(context.Background(), `SELECT coalesce(wait_event_type = 'Lock', false) FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&waiting)
		return err == nil && waiting
	})
	if !waiting {
		err := <-done
		done <- err
		require.Fail(t, "the DDL did not wait for the copy", "it returned %v", err)
	}
}

// DDL that queues for a table between the locks of two copying sessions
// would deadlock with the copy (the second session waits for the DDL, which
// waits for the first): the copy fails instead, naming the table.
func TestSnapshotDDLQueuedDuringParallelCopy(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn, admin := newDatabase(t)
	execSQL(t, admin,
		`CREATE TABLE a (id int PRIMARY KEY, filler text)`, // about 8 tasks for 2 sessions
		`INSERT INTO a SELECT i, repeat('x', 200) FROM generate_series(1, 40000) i`,
		`CREATE TABLE b (id int PRIMARY KEY, filler text)`,
		`INSERT INTO b SELECT i, repeat('x', 200) FROM generate_series(1, 30000) i`)
	c, _ := snapConnect(t, dsn, siphon.WithCopySessions(2))
	schema, err := c.InspectSchema(ctx)
	require.NoError(t, err)
	snap := snapTake(t, c)
	ddl := make(chan error, 1)
	rows := 0
	err = snap.CopyTables(ctx, schema, siphon.CopyOptions{}, func(table *canonical.Table, row canonical.Row) error {
		if rows++; rows > 1 {
			return nil
		}
		// The copy is held up in table a: no session but the first has
		// touched b yet.
		other, err := pgx.Connect(ctx, dsn)
		require.NoError(t, err)
		pid := other.PgConn().PID()
		go func() {
			defer other.Close(ctx)
			_, err := other.Exec(ctx, `ALTER TABLE b ADD COLUMN c int`)
			ddl <- err
		}()
		snapWaitForLock(t, admin, pid, ddl)
		return nil
	})
	if err != nil {
		var schemaErr *siphon.SchemaIncompatibleError
		require.ErrorAs(t, err, &schemaErr)
		assert.Equal(t, "b", schemaErr.Table.Name)
		assert.Contains(t, schemaErr.Problem, "is waiting for the table")
	} else {
		t.Log("the first session copied all of b: the copy completed and the DDL waited")
	}
	require.NoError(t, snap.Close(ctx))
	require.NoError(t, <-ddl)
}

// pg_dump --snapshot=Name() dumps exactly what the snapshot holds.
func TestSnapshotNameForPgDump(t *testing.T) {
	t.Parallel()
	skipUnlessDumpClients(t)
	dsn, admin := newDatabase(t)
	execSQL(t, admin, `CREATE TABLE t (id int PRIMARY KEY)`, `INSERT INTO t SELECT generate_series(1, 5)`)
	c, slot := snapConnect(t, dsn)
	snap := snapTake(t, c)
	execSQL(t, admin, `INSERT INTO t VALUES (6)`, `DELETE FROM t WHERE id = 1`)

	pgDump, err := pgdump.Find(context.Background(), "pg_dump", "", pgdump.Version{})
	require.NoError(t, err)
	out, err := exec.Command(pgDump.Path, "--snapshot="+snap.Name(), "--data-only", "--table=t", "--dbname="+dsn).CombinedOutput()
	require.NoError(t, err, string(out))
	assert.Contains(t, string(out), "COPY public.t (id) FROM stdin;\n1\n2\n3\n4\n5\n\\.\n")

	require.NoError(t, snap.Close(context.Background()))
	require.NoError(t, c.Close())
	assertNoLeaks(t, dsn, slot) // the snapshot's temporary slot is gone
}
