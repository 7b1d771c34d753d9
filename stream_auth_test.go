package siphon_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/siphondb/siphon"
	"github.com/siphondb/siphon/canonical"
)

var (
	authKey  = bytes.Repeat([]byte{0xa1}, 32)
	oldKey   = bytes.Repeat([]byte{0xb2}, 32)
	wrongKey = bytes.Repeat([]byte{0xc3}, 32)
)

// reencode decodes a stream (with keys), lets edit change its records and
// writes it again with key (nil: unauthenticated), as someone who can
// write the storage and runs canonical.Encoder can.
func reencode(t *testing.T, stream []byte, keys [][]byte, key []byte, edit func([]canonical.Record) []canonical.Record) []byte {
	t.Helper()
	d := canonical.NewDecoder(bytes.NewReader(stream))
	d.SetKeys(keys...)
	h, err := d.Header()
	require.NoError(t, err)
	var recs []canonical.Record
	for {
		rec, err := d.Next()
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
		recs = append(recs, rec)
	}
	var out bytes.Buffer
	enc := canonical.NewEncoder(&out)
	if key != nil {
		require.NoError(t, enc.SetKey(key))
	}
	require.NoError(t, enc.WriteHeader(h))
	for _, rec := range edit(recs) {
		require.NoError(t, enc.WriteRecord(rec))
	}
	return out.Bytes()
}

// withDDL returns an edit that puts a schema change running statement
// into the first transaction, after its begin.
func withDDL(statement string) func([]canonical.Record) []canonical.Record {
	return func(recs []canonical.Record) []canonical.Record {
		for i, r := range recs {
			if r.Type == canonical.RecordChange && r.Change.Op == canonical.OpBegin {
				ddl := canonical.Record{Type: canonical.RecordChange, Change: &canonical.Change{Op: canonical.OpDDL, XID: r.Change.XID,
					Position: r.Change.Position, DDL: &canonical.DDL{Tag: strings.ToUpper(strings.Fields(statement)[0]), Statement: statement, SearchPath: "public",
						Role: "postgres", SessionRole: "postgres", Superuser: true}}}
				return append(recs[:i+1], append([]canonical.Record{ddl}, recs[i+1:]...)...)
			}
		}
		panic("no transaction")
	}
}

// replaceStatement returns an edit that replaces every schema change's
// statement.
func replaceStatement(statement string) func([]canonical.Record) []canonical.Record {
	return func(recs []canonical.Record) []canonical.Record {
		for _, r := range recs {
			if r.Type == canonical.RecordChange && r.Change.Op == canonical.OpDDL {
				d := *r.Change.DDL
				d.Statement = statement
				r.Change.DDL = &d
			}
		}
		return recs
	}
}

// resumStream recomputes every CRC-32C checksum of a stream, as anyone
// who changed its bytes can.
func resumStream(data []byte) []byte {
	var out []byte
	var crc uint32
	for _, line := range bytes.SplitAfter(data, []byte("\n")) {
		if at := bytes.LastIndex(line, []byte(`,"sum":"`)); at >= 0 && bytes.HasSuffix(line, []byte("\"}\n")) {
			head := line[:at+len(`,"sum":"`)]
			sum := crc32c(crc, head)
			line = append(append(bytes.Clone(head), fmt.Sprintf("%08x", sum)...), "\"}\n"...)
		}
		crc = crc32c(crc, line)
		out = append(out, line...)
	}
	return out
}

// markerPath is a path in t.TempDir() that the server (which may run as
// another user) can create a file at.
func markerPath(t *testing.T, name string) string {
	t.Helper()
	dir := t.TempDir()
	for _, d := range []string{filepath.Dir(dir), dir} {
		require.NoError(t, os.Chmod(d, 0o777))
	}
	return filepath.Join(dir, name)
}

// copyToProgram is a statement that, run on the target, writes marker.
func copyToProgram(marker string) string {
	return fmt.Sprintf("COPY (SELECT 1) TO PROGRAM 'touch %s'", marker)
}

// keyedChainFixture is a chain (a base, then an incremental of one tick
// and one of two) taken by a Conn WithStreamKey(authKey).
func keyedChainFixture(t *testing.T) (base []byte, incs [][]byte) {
	t.Helper()
	ctx := context.Background()
	dsn, src := newDatabase(t)
	execSQL(t, src,
		`CREATE TABLE tbl (id int PRIMARY KEY, v text NOT NULL)`,
		`INSERT INTO tbl SELECT g, 'v' || g FROM generate_series(1, 30) g`,
		`CREATE TABLE ticks (k int PRIMARY KEY)`)
	c, _ := backupConn(t, dsn, siphon.WithStreamKey(authKey))
	base = backup(t, c, siphon.BackupOptions{StartChain: true})
	rep, err := c.Verify(ctx, bytes.NewReader(base))
	require.NoError(t, err)
	require.True(t, rep.OK, "%v", rep.Problems)
	prev := rep.ChainLink()
	for k := 1; k <= 2; k++ {
		tick(t, src, k)
		if k == 2 {
			tick(t, src, 3) // the last incremental has two transactions
		}
		var incr bytes.Buffer
		prev, err = c.BackupIncrementalAfter(ctx, prev, &incr)
		require.NoError(t, err)
		incs = append(incs, incr.Bytes())
	}
	return base, incs
}

// TestAuthTamperedIncrementalIsRefused runs the tampered-file attack on a
// chain taken WithStreamKey: the last incremental, with a schema change
// its key holder wrote, is applied; the same with the statement replaced
// by COPY ... TO PROGRAM, re-encoded without the key, with another key, or
// edited in place with its checksums recomputed, is a problem for
// VerifyChain and refused whole by RestoreChain: the target is unchanged
// and the program never ran.
func TestAuthTamperedIncrementalIsRefused(t *testing.T) {
	t.Parallel()
	skipUnlessDumpClients(t)
	ctx := context.Background()
	base, incs := keyedChainFixture(t)
	for i, inc := range incs {
		assert.Contains(t, string(inc), `"key":"`+canonical.KeyID(authKey)+`"`, "incremental %d is authenticated", i+1)
	}
	legit := reencode(t, incs[1], [][]byte{authKey}, authKey, withDDL("CREATE TABLE legit (id int)"))
	marker := markerPath(t, "pwned")
	forged := map[string][]byte{
		"re-encoded without the key":   reencode(t, legit, [][]byte{authKey}, nil, replaceStatement(copyToProgram(marker))),
		"re-encoded with another key":  reencode(t, legit, [][]byte{authKey}, wrongKey, replaceStatement(copyToProgram(marker))),
		"edited, checksums recomputed": resumStream(bytes.Replace(legit, []byte("CREATE TABLE legit (id int)"), []byte(copyToProgram(marker)), 1)),
	}

	_, keyed, _ := restoreTargetWith(t, siphon.WithStreamKey(authKey))
	chain, err := keyed.VerifyChain(ctx, bytes.NewReader(base), bytes.NewReader(incs[0]), bytes.NewReader(legit))
	require.NoError(t, err)
	require.True(t, chain.OK, "%v", chain.Problems)
	for i, link := range chain.Links[1:] {
		assert.True(t, link.Authenticated, "link %d", i+2)
		assert.Equal(t, canonical.KeyID(authKey), link.KeyID)
	}
	assert.Equal(t, 1, chain.Links[2].SchemaChanges)

	for name, stream := range forged {
		t.Run(name, func(t *testing.T) {
			chain, err := keyed.VerifyChain(ctx, bytes.NewReader(base), bytes.NewReader(incs[0]), bytes.NewReader(stream))
			require.NoError(t, err)
			assert.False(t, chain.OK)
			assert.False(t, chain.Links[2].Authenticated)
			problems := strings.Join(chain.Problems, "; ")
			assert.Contains(t, problems, "link 3: ")
			assert.NotContains(t, problems, string(authKey))

			_, target, dst := restoreTargetWith(t, siphon.WithStreamKey(authKey))
			_, err = target.RestoreChain(ctx, siphon.RestoreChainOptions{}, chainOf(base, incs[0], stream)...)
			var chainErr *siphon.ChainError
			require.ErrorAs(t, err, &chainErr)
			assert.Equal(t, 3, chainErr.Link)
			assert.Empty(t, userTables(t, dst), "nothing was restored")
			assert.NoFileExists(t, marker)
		})
	}

	// A forged link in the middle: its successor names the real one.
	middle := reencode(t, incs[0], [][]byte{authKey}, nil, func(r []canonical.Record) []canonical.Record { return r })
	chain, err = keyed.VerifyChain(ctx, bytes.NewReader(base), bytes.NewReader(middle), bytes.NewReader(legit))
	require.NoError(t, err)
	assert.False(t, chain.OK)
	assert.Contains(t, strings.Join(chain.Problems, "; "), "link 3: names hmac-sha256:")

	dsn, target, dst := restoreTargetWith(t, siphon.WithStreamKey(authKey))
	_, err = target.RestoreChain(ctx, siphon.RestoreChainOptions{}, chainOf(base, incs[0], legit)...)
	require.NoError(t, err)
	assert.Equal(t, 1, count(t, dst, "SELECT count(*) FROM pg_tables WHERE tablename = 'legit'"), "the key holder's schema change ran")
	assert.Equal(t, []int{1, 2, 3}, ticksOf(t, dst))
	require.NoError(t, target.Close())
	assertNoLeaks(t, dsn)

	// A point-in-time restore cuts the last link after its first
	// transaction, the one with the schema change, and writes it again
	// for the apply: authenticated, with the Conn's key, so it runs.
	_, target, dst = restoreTargetWith(t, siphon.WithStreamKey(authKey))
	cut := firstCommit(t, legit)
	reached, err := target.RestoreChain(ctx, siphon.RestoreChainOptions{TargetPosition: cut}, chainOf(base, incs[0], legit)...)
	require.NoError(t, err)
	assert.Equal(t, cut, reached)
	assert.Equal(t, 1, count(t, dst, "SELECT count(*) FROM pg_tables WHERE tablename = 'legit'"))
	assert.Equal(t, []int{1, 2}, ticksOf(t, dst))
}

// firstCommit returns the end of a stream's first transaction.
func firstCommit(t *testing.T, stream []byte) canonical.Position {
	t.Helper()
	d := canonical.NewDecoder(bytes.NewReader(stream))
	for {
		rec, err := d.Next()
		require.NoError(t, err)
		if rec.Type == canonical.RecordChange && rec.Change.Op == canonical.OpCommit {
			return rec.Change.Position
		}
	}
}

// restoreTargetWith is restoreTarget with options.
func restoreTargetWith(t *testing.T, opts ...siphon.Option) (string, *siphon.Conn, *pgx.Conn) {
	t.Helper()
	dsn, conn := newDatabase(t)
	c, err := siphon.Connect(context.Background(), dsn, opts...)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return dsn, c, conn
}

// changeStream writes a change stream of two transactions on tbl (id int
// primary key, v text): row 100, then row 101 with the schema change
// statement (none when empty) before it; with key (nil: none).
func changeStream(t *testing.T, key []byte, statement string) []byte {
	t.Helper()
	tbl := &canonical.Table{Schema: "public", Name: "tbl", Columns: []canonical.Column{
		{Name: "id", Type: "integer", TypeOID: 23}, {Name: "v", Type: "text", TypeOID: 25}},
		PrimaryKey: []string{"id"}, IdentityKey: []string{"id"}, ReplicaIdentity: canonical.IdentityDefault}
	var out bytes.Buffer
	enc := canonical.NewEncoder(&out)
	if key != nil {
		require.NoError(t, enc.SetKey(key))
	}
	require.NoError(t, enc.WriteHeader(canonical.Header{Kind: canonical.KindChanges, Engine: canonical.EnginePostgres,
		Start: 0x1000, SystemID: "7300000000000000024", Timeline: 1, Slot: "auth"}))
	now := time.Now().UTC()
	for i, id := range []string{"100", "101"} {
		pos, xid := canonical.Position(0x2000*(i+1)), uint32(800+i)
		require.NoError(t, enc.WriteChange(&canonical.Change{Op: canonical.OpBegin, XID: xid, Position: pos + 0x20, CommitTime: now}))
		if i == 1 && statement != "" {
			require.NoError(t, enc.WriteChange(&canonical.Change{Op: canonical.OpDDL, XID: xid, Position: pos + 0x40,
				DDL: &canonical.DDL{Tag: strings.ToUpper(strings.Fields(statement)[0]), Statement: statement, SearchPath: "public",
					Role: "postgres", SessionRole: "postgres", Superuser: true}}))
		}
		require.NoError(t, enc.WriteChange(&canonical.Change{Op: canonical.OpInsert, XID: xid, Position: pos, Schema: "public", Table: "tbl",
			Columns: tbl.Columns, New: canonical.Row{canonical.Text(id), canonical.Text("v")}}))
		require.NoError(t, enc.WriteChange(&canonical.Change{Op: canonical.OpCommit, XID: xid, Position: pos + 0x40, CommitTime: now}))
	}
	require.NoError(t, enc.WriteEnd(0x4040))
	return out.Bytes()
}

// consumeTarget is a fresh target with table tbl and a Conn with opts.
func consumeTarget(t *testing.T, opts ...siphon.Option) (string, *siphon.Conn, *pgx.Conn) {
	t.Helper()
	dsn, c, conn := restoreTargetWith(t, opts...)
	execSQL(t, conn, `CREATE TABLE tbl (id int PRIMARY KEY, v text NOT NULL)`)
	return dsn, c, conn
}

func idsOf(t *testing.T, conn *pgx.Conn) string {
	t.Helper()
	var ids string
	require.NoError(t, conn.QueryRow(context.Background(), "SELECT coalesce(string_agg(id::text, ',' ORDER BY id), '') FROM tbl").Scan(&ids))
	return ids
}

// TestAuthConsumeRefusesUnauthenticatedSchemaChanges: ConsumeCanonical
// applies the row changes of an unauthenticated stream, refuses its schema
// change with ErrUnauthenticatedSchemaChange (naming the Position) before
// anything of that source transaction is applied, and runs it only with
// ApplyOptions.UnauthenticatedSchemaChanges, for that call; a stream that names the Conn's key but
// fails its check stops at the checkpoint that fails; rotation: a stream
// authenticated with the previous key is accepted by a Conn whose current
// key is new, and refused by one that was not given the old key.
func TestAuthConsumeRefusesUnauthenticatedSchemaChanges(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	marker := markerPath(t, "pwned")
	attack := copyToProgram(marker)

	for name, c := range map[string]struct {
		stream []byte
		opts   []siphon.Option
		want   error
	}{
		"unauthenticated":          {changeStream(t, nil, attack), nil, siphon.ErrUnauthenticatedSchemaChange},
		"unauthenticated, keyed":   {changeStream(t, nil, attack), []siphon.Option{siphon.WithStreamKey(authKey)}, siphon.ErrUnauthenticatedSchemaChange},
		"another key":              {changeStream(t, wrongKey, attack), []siphon.Option{siphon.WithStreamKey(authKey)}, siphon.ErrUnauthenticatedSchemaChange},
		"old key not given":        {changeStream(t, oldKey, attack), []siphon.Option{siphon.WithStreamKey(authKey)}, siphon.ErrUnauthenticatedSchemaChange},
		"edited, checksums redone": {resumStream(bytes.Replace(changeStream(t, authKey, "CREATE TABLE legit (id int)"), []byte("CREATE TABLE legit (id int)"), []byte(attack), 1)), []siphon.Option{siphon.WithStreamKey(authKey)}, canonical.ErrAuthentication},
	} {
		t.Run(name, func(t *testing.T) {
			dsn, target, dst := consumeTarget(t, c.opts...)
			err := target.ConsumeCanonical(ctx, bytes.NewReader(c.stream))
			require.ErrorIs(t, err, c.want)
			if errors.Is(c.want, siphon.ErrUnauthenticatedSchemaChange) {
				assert.Contains(t, err.Error(), "0/4040", "names the source transaction")
				assert.Contains(t, err.Error(), "ApplyOptions.UnauthenticatedSchemaChanges")
				assert.Contains(t, err.Error(), "WithStreamKey")
			}
			assert.Equal(t, "100", idsOf(t, dst), "the transaction before is applied, nothing of the refused one")
			assert.NoFileExists(t, marker)
			require.NoError(t, target.Close())
			assertNoLeaks(t, dsn)
		})
	}

	t.Run("opted in", func(t *testing.T) {
		optIn := siphon.ApplyOptions{UnauthenticatedSchemaChanges: true}
		_, target, dst := consumeTarget(t)
		require.NoError(t, target.ConsumeCanonicalWith(ctx, optIn, bytes.NewReader(changeStream(t, nil, "CREATE TABLE legit (id int)"))))
		assert.Equal(t, "100,101", idsOf(t, dst))
		assert.Equal(t, 1, count(t, dst, "SELECT count(*) FROM pg_tables WHERE tablename = 'legit'"))

		// What the option means: the stream's statement runs, whatever it is.
		opened := markerPath(t, "opened")
		_, target, _ = consumeTarget(t)
		require.NoError(t, target.ConsumeCanonicalWith(ctx, optIn, bytes.NewReader(changeStream(t, nil, copyToProgram(opened)))))
		assert.FileExists(t, opened)
	})
	t.Run("rotation", func(t *testing.T) {
		_, target, dst := consumeTarget(t, siphon.WithStreamKey(authKey, oldKey))
		require.NoError(t, target.ConsumeCanonical(ctx, bytes.NewReader(changeStream(t, oldKey, "CREATE TABLE legit (id int)"))))
		assert.Equal(t, "100,101", idsOf(t, dst))
		assert.Equal(t, 1, count(t, dst, "SELECT count(*) FROM pg_tables WHERE tablename = 'legit'"))
	})
	t.Run("data only", func(t *testing.T) {
		_, target, dst := consumeTarget(t)
		require.NoError(t, target.ConsumeCanonical(ctx, bytes.NewReader(changeStream(t, nil, ""))))
		assert.Equal(t, "100,101", idsOf(t, dst), "row changes of unauthenticated streams apply")
	})
	assert.NoFileExists(t, marker)
}

// TestAuthStreamKeyOption: a short key is an *OptionError that does not
// print the key; the Conn's streams are authenticated with its key.
func TestAuthStreamKeyOption(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn, db := newDatabase(t)
	short := []byte("0123456789abcdefghijklmnopq")
	for _, opt := range []siphon.Option{siphon.WithStreamKey(short), siphon.WithStreamKey(authKey, short)} {
		_, err := siphon.Connect(ctx, dsn, opt)
		var optErr *siphon.OptionError
		require.ErrorAs(t, err, &optErr)
		assert.Equal(t, "WithStreamKey", optErr.Option)
		assert.NotContains(t, err.Error(), string(short))
	}
	// EmitCanonical writes an authenticated snapshot.
	execSQL(t, db, `CREATE TABLE tbl (id int PRIMARY KEY, v text NOT NULL)`, `INSERT INTO tbl VALUES (1, 'v')`)
	c, _ := backupConn(t, dsn, siphon.WithStreamKey(authKey))
	var snap bytes.Buffer
	_, err := c.EmitCanonical(ctx, nil, &snap)
	require.NoError(t, err)
	rep, err := c.Verify(ctx, bytes.NewReader(snap.Bytes()))
	require.NoError(t, err)
	assert.True(t, rep.OK, "%v", rep.Problems)
	assert.True(t, rep.Authenticated)
	assert.Equal(t, canonical.KeyID(authKey), rep.KeyID)

	keyed := siphon.VerifyOptions{Keys: [][]byte{authKey}}
	rep, err = siphon.VerifyStream(ctx, keyed, bytes.NewReader(changeStream(t, authKey, "CREATE TABLE legit (id int)")))
	require.NoError(t, err)
	assert.True(t, rep.OK, "%v", rep.Problems)
	assert.True(t, rep.Authenticated)
	assert.Equal(t, 1, rep.SchemaChanges)
	rep, err = siphon.VerifyStream(ctx, siphon.VerifyOptions{}, bytes.NewReader(changeStream(t, authKey, "CREATE TABLE legit (id int)")))
	require.NoError(t, err)
	assert.False(t, rep.OK, "a schema change no key given authenticates is a problem")
	assert.False(t, rep.Authenticated)
	assert.Equal(t, canonical.KeyID(authKey), rep.KeyID)
	assert.Contains(t, strings.Join(rep.Problems, "; "), "ApplyOptions.UnauthenticatedSchemaChanges")
}

// TestAuthColumnTypeIsNotSpliced: a stream (checked, no schema change)
// whose table record adds a column with a type that is SQL is refused
// with a *SchemaIncompatibleError naming the column, and nothing runs; a
// type that passes the text check but that the target's parser does not
// take for one type name is refused too; real type names are followed.
func TestAuthColumnTypeIsNotSpliced(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	marker := markerPath(t, "pwned")
	for _, typ := range []string{
		"int; " + copyToProgram(marker) + "; --",
		`int) ; ` + copyToProgram(marker) + ` --`,
		`"int; ` + copyToProgram(marker) + `"`,
		"int default 5",
		"integer generated always as (1) stored",
		"no_such_type",
	} {
		t.Run(typ, func(t *testing.T) {
			_, target, dst := consumeTarget(t)
			err := target.ConsumeCanonicalWith(ctx, siphon.ApplyOptions{UnauthenticatedSchemaChanges: true}, bytes.NewReader(addColumnStream(t, typ)))
			var inc *siphon.SchemaIncompatibleError
			require.ErrorAs(t, err, &inc)
			assert.Equal(t, "evil", inc.Column)
			assert.Equal(t, 0, count(t, dst, "SELECT count(*) FROM information_schema.columns WHERE table_name = 'tbl' AND column_name = 'evil'"))
			assert.NoFileExists(t, marker)
		})
	}
	for typ, want := range map[string]string{"numeric(12,4)": "numeric(12,4)", "character varying(20)": "character varying(20)",
		"timestamp with time zone": "timestamp with time zone", "integer[]": "integer[]"} {
		_, target, dst := consumeTarget(t)
		require.NoError(t, target.ConsumeCanonical(ctx, bytes.NewReader(addColumnStream(t, typ))), typ)
		var got string
		require.NoError(t, dst.QueryRow(ctx, `SELECT format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = 'tbl'::regclass AND attname = 'evil'`).Scan(&got))
		assert.Equal(t, want, got)
	}
}

// addColumnStream is a change stream whose table record for tbl has a
// column "evil" of type typ (nullable, no default) that the target lacks.
func addColumnStream(t *testing.T, typ string) []byte {
	t.Helper()
	cols := []canonical.Column{{Name: "id", Type: "integer", TypeOID: 23}, {Name: "v", Type: "text", TypeOID: 25},
		{Name: "evil", Type: typ, Nullable: true}}
	var out bytes.Buffer
	enc := canonical.NewEncoder(&out)
	require.NoError(t, enc.WriteHeader(canonical.Header{Kind: canonical.KindChanges, Engine: canonical.EnginePostgres,
		Start: 0x1000, SystemID: "7300000000000000025", Timeline: 1, Slot: "auth"}))
	now := time.Now().UTC()
	require.NoError(t, enc.WriteChange(&canonical.Change{Op: canonical.OpBegin, XID: 9, Position: 0x2020, CommitTime: now}))
	require.NoError(t, enc.WriteChange(&canonical.Change{Op: canonical.OpInsert, XID: 9, Position: 0x2000, Schema: "public", Table: "tbl",
		Columns: cols, New: canonical.Row{canonical.Text("1"), canonical.Text("v"), canonical.Null()}}))
	require.NoError(t, enc.WriteChange(&canonical.Change{Op: canonical.OpCommit, XID: 9, Position: 0x2040, CommitTime: now}))
	require.NoError(t, enc.WriteEnd(0x2040))
	return out.Bytes()
}

// crc32c adds b to the running CRC-32C crc.
func crc32c(crc uint32, b []byte) uint32 {
	return crc32.Update(crc, crc32.MakeTable(crc32.Castagnoli), b)
}
