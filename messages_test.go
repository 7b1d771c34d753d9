package siphon_test

// What users read when something is wrong: each message says what is
// known, once, with the fix.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/siphondb/siphon"
	"github.com/siphondb/siphon/canonical"
	"github.com/siphondb/siphon/pgdump"
)

// TestChainErrorsSayOnlyWhatIsKnown damages the first incremental of a
// chain in its middle: VerifyChain reports that link's problem and
// nothing of the next (the damaged link's end is unknown, so no gap can be
// told), and RestoreChain's error names the link once.
func TestChainErrorsSayOnlyWhatIsKnown(t *testing.T) {
	t.Parallel()
	skipUnlessDumpClients(t)
	ctx := context.Background()
	f := newChainFixture(t)
	damaged := flip(f.incrementals[0], int64(len(f.incrementals[0])/2))

	chain, err := f.c.VerifyChain(ctx, chainOf(f.base, damaged, f.incrementals[1])...)
	require.NoError(t, err)
	require.False(t, chain.OK)
	require.NotEmpty(t, chain.Problems)
	for _, p := range chain.Problems {
		assert.True(t, strings.HasPrefix(p, "link 2: "), "only the damaged link has a problem: %q", p)
		assert.NotContains(t, p, "link 2: link 2")
	}
	assert.NotContains(t, strings.Join(chain.Problems, "\n"), "0/0", "no end is made up for the damaged link")

	_, c, dst := restoreTarget(t)
	_, err = c.RestoreChain(ctx, siphon.RestoreChainOptions{}, chainOf(f.base, damaged, f.incrementals[1])...)
	var chainErr *siphon.ChainError
	require.ErrorAs(t, err, &chainErr)
	assert.Equal(t, 2, chainErr.Link)
	assert.Equal(t, "siphon: restore chain refused, nothing was restored: "+strings.Join(chain.Problems, "; "), err.Error())
	assert.Equal(t, 1, strings.Count(err.Error(), "link 2: "), err.Error())
	assert.Empty(t, userTables(t, dst), "the target stays untouched")

	// A link that is not there at all (a gap) is still told, with both ends.
	chain, err = f.c.VerifyChain(ctx, chainOf(f.base, f.incrementals[1])...)
	require.NoError(t, err)
	require.NotEmpty(t, chain.Problems)
	assert.Contains(t, chain.Problems[0], "link 2: starts at "+chain.Links[1].Start.String()+", but link 1 ends at "+chain.Links[0].End.String()+": a gap")
}

// TestEveryReplicationSessionSaysTheREPLICATIONFix: every call that opens
// a replication session, as a role without REPLICATION, returns a
// *PrivilegeError that names the attribute and the statement that grants
// it, where EmitCanonical used to return the server's bare FATAL.
func TestEveryReplicationSessionSaysTheREPLICATIONFix(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn, admin := newDatabase(t)
	role, roleDSN := loginRole(t, dsn, admin, "norepl", "NOREPLICATION")
	execSQL(t, admin, "GRANT CREATE ON DATABASE "+pgx.Identifier{dbName(t, admin)}.Sanitize()+" TO "+role,
		"CREATE TABLE accounts (id int PRIMARY KEY, owner text NOT NULL)", "ALTER TABLE accounts OWNER TO "+role)
	c, slot := streamConn(t, roleDSN)
	targetDSN, _ := newDatabase(t)
	target := connect(t, targetDSN)

	// The server's own words follow in parentheses; they differ between
	// releases ("must be superuser or replication role to start walsender"
	// before 16, "permission denied to start WAL sender" since).
	fix := fmt.Sprintf(`: role %q lacks the REPLICATION attribute (needed for replication sessions: slots, snapshots, streams, backups): `+
		`have a superuser run ALTER ROLE %q WITH REPLICATION (FATAL: `, role, role)
	calls := map[string]func() error{
		"EmitCanonical": func() error { _, err := c.EmitCanonical(ctx, nil, io.Discard); return err },
		"StreamChanges": func() error {
			_, err := c.StreamChanges(ctx, 0, func(canonical.Change) error { return nil })
			return err
		},
		"BackupIncremental": func() error { _, err := c.BackupIncremental(ctx, 0, io.Discard); return err },
		"Replicate": func() error {
			_, err := c.Replicate(ctx, target, siphon.ReplicateOptions{Snapshot: true})
			return err
		},
		"CurrentPosition": func() error { _, err := c.CurrentPosition(ctx); return err },
		"TakeSnapshot":    func() error { _, err := c.TakeSnapshot(ctx); return err },
		"Backup":          func() error { return c.Backup(ctx, siphon.BackupOptions{}, io.Discard) },
		"DropSlot":        func() error { return c.DropSlot(ctx, slot) },
	}
	for name, call := range calls {
		err := call()
		var oldDump *pgdump.VersionError
		if name == "Backup" && errors.As(err, &oldDump) {
			t.Logf("Backup not checked: %v", err) // this machine's pg_dump cannot dump the server
			continue
		}
		var privErr *siphon.PrivilegeError
		if !assert.ErrorAs(t, err, &privErr, name) {
			continue
		}
		assert.Equal(t, role, privErr.Role, name)
		msg := err.Error()
		assert.True(t, strings.HasPrefix(msg, "siphon: ") && strings.Count(msg, "siphon:") == 1, "%s: %s", name, msg)
		assert.Contains(t, msg, "(SQLSTATE 42501))", "%s: the server's words follow the fix", name)
		if name == "DropSlot" { // a function, not a session: the server says it its way
			assert.Contains(t, msg, fmt.Sprintf("have a superuser run ALTER ROLE %q WITH REPLICATION (ERROR: ", role))
			continue
		}
		assert.Contains(t, msg, fix, name)
	}
	require.NoError(t, c.Close())
	assertNoLeaks(t, dsn)
}

// TestPreflightAndBackupNameWhatPgDumpCannotRead: a role that may stream
// and read the tables, but not a sequence, a schema, nor the rows of a
// table with row-level security, gets a failed Preflight check that names
// each with its GRANT (not "pg_dump OK"), and a Backup that fails with a
// *PrivilegeError saying the same; once granted, both pass. The check of
// a keyless table reads as a sentence.
func TestPreflightAndBackupNameWhatPgDumpCannotRead(t *testing.T) {
	t.Parallel()
	skipUnlessDumpClients(t)
	ctx := context.Background()
	dsn, admin := newDatabase(t)
	role, roleDSN := loginRole(t, dsn, admin, "dumper", "REPLICATION")
	execSQL(t, admin,
		`CREATE TABLE customers (id serial PRIMARY KEY, email text NOT NULL)`,
		`CREATE SCHEMA vault`, `CREATE TABLE vault.keys (id int PRIMARY KEY)`,
		`CREATE TABLE notes (body text)`,
		`CREATE TABLE tenants (id int PRIMARY KEY, name text)`, `ALTER TABLE tenants ENABLE ROW LEVEL SECURITY`,
		`CREATE POLICY own ON tenants USING (name = current_user)`,
		"GRANT SELECT ON customers, notes, tenants, vault.keys TO "+role)
	c := connect(t, roleDSN)
	grants := []string{
		fmt.Sprintf("GRANT SELECT ON SEQUENCE public.customers_id_seq TO %q", role),
		`GRANT USAGE ON SCHEMA "vault" TO ` + fmt.Sprintf("%q", role),
		fmt.Sprintf("ALTER ROLE %q BYPASSRLS", role),
	}

	report, err := c.Preflight(ctx)
	require.NoError(t, err)
	check, ok := report.Check(siphon.CheckDumpPrivileges)
	require.True(t, ok)
	assert.Equal(t, siphon.CheckFailed, check.Status)
	assert.Equal(t, fmt.Sprintf("role %q lacks SELECT on sequence public.customers_id_seq, USAGE on schema \"vault\", "+
		"BYPASSRLS (row-level security applies to tables it dumps)", role), check.Found)
	assert.Equal(t, "have a superuser (or each object's owner) run "+strings.Join(grants, "; "), check.Fix)
	pgDump, _ := report.Check(siphon.CheckPgDump)
	assert.Equal(t, siphon.CheckOK, pgDump.Status, "the program itself is fine")
	identity, _ := report.Check(siphon.CheckReplicaIdentity)
	assert.Equal(t, "public.notes has no usable replica identity (no primary key, REPLICA IDENTITY FULL or USING INDEX), "+
		"so siphon leaves it out of the publication and captures none of its changes (KeylessSkip)", identity.Found)
	assert.Equal(t, "capturing updates and deletes while the application's own UPDATE and DELETE keep working", identity.Needed)

	err = c.Backup(ctx, siphon.BackupOptions{}, io.Discard)
	var privErr *siphon.PrivilegeError
	require.ErrorAs(t, err, &privErr)
	assert.Equal(t, check.Fix, privErr.Fix)
	assert.Contains(t, err.Error(), "(needed for Backup: pg_dump reads every table and sequence it dumps): have a superuser")
	// A backup of the tables it may read needs nothing more.
	var out bytes.Buffer
	require.NoError(t, c.Backup(ctx, siphon.BackupOptions{Tables: []string{"public.notes"}}, &out))

	execSQL(t, admin, grants...)
	report, err = c.Preflight(ctx)
	require.NoError(t, err)
	check, _ = report.Check(siphon.CheckDumpPrivileges)
	assert.Equal(t, siphon.CheckOK, check.Status, check.Found)
	require.NoError(t, c.Backup(ctx, siphon.BackupOptions{}, io.Discard))
	require.NoError(t, c.Close())
	assertNoLeaks(t, dsn)
}

// TestApplyAndCopyNameTheGrantsTheyLack: an applying role that may not
// write a target table, or move a target sequence, and a source role that
// may not read a published table, get a *PrivilegeError with the GRANT
// instead of the server's "permission denied".
func TestApplyAndCopyNameTheGrantsTheyLack(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srcDSN, src := newDatabase(t)
	execSQL(t, src, `CREATE TABLE items (id serial PRIMARY KEY, name text NOT NULL)`,
		`INSERT INTO items (name) SELECT 'item ' || g FROM generate_series(1, 10) g`)
	c, _ := backupConn(t, srcDSN)
	var snapshot bytes.Buffer
	_, err := c.EmitCanonical(ctx, nil, &snapshot)
	require.NoError(t, err)

	dstDSN, dst := newDatabase(t)
	execSQL(t, dst, `CREATE TABLE items (id serial PRIMARY KEY, name text NOT NULL)`)
	applier, applierDSN := loginRole(t, dstDSN, dst, "applier", "")
	execSQL(t, dst, "GRANT CREATE ON DATABASE "+pgx.Identifier{dbName(t, dst)}.Sanitize()+" TO "+applier,
		"GRANT SELECT ON items TO "+applier)
	target := connect(t, applierDSN)
	err = target.ConsumeCanonical(ctx, bytes.NewReader(snapshot.Bytes()))
	var privErr *siphon.PrivilegeError
	require.ErrorAs(t, err, &privErr)
	assert.Equal(t, applier, privErr.Role)
	assert.Equal(t, "INSERT, UPDATE, DELETE, TRUNCATE on table public.items", privErr.Privilege)
	assert.Equal(t, fmt.Sprintf("have a superuser (or each object's owner) run GRANT INSERT, UPDATE, DELETE, TRUNCATE ON TABLE public.items TO %q", applier), privErr.Fix)
	assert.Zero(t, count(t, dst, "SELECT count(*) FROM items"), "nothing applied")

	execSQL(t, dst, "GRANT INSERT, UPDATE, DELETE, TRUNCATE ON items TO "+applier, "GRANT SELECT ON SEQUENCE items_id_seq TO "+applier)
	err = target.ConsumeCanonical(ctx, bytes.NewReader(snapshot.Bytes()))
	require.ErrorAs(t, err, &privErr, "the rows are in, the sequence may not be moved")
	assert.Equal(t, "SELECT, UPDATE on sequence public.items_id_seq", privErr.Privilege)
	assert.Contains(t, privErr.Fix, fmt.Sprintf("GRANT SELECT, UPDATE ON SEQUENCE public.items_id_seq TO %q", applier))
	execSQL(t, dst, "GRANT UPDATE ON SEQUENCE items_id_seq TO "+applier)
	require.NoError(t, target.ConsumeCanonical(ctx, bytes.NewReader(snapshot.Bytes())), "applied again: nothing twice")
	assert.Equal(t, digest(t, src, "items"), digest(t, dst, "items"))
	require.NoError(t, c.Detach(ctx))

	// A source role that may stream but not read a published table.
	reader, readerDSN := loginRole(t, srcDSN, src, "reader", "REPLICATION")
	pub := "unread_" + strings.TrimPrefix(reader, "reader_")
	execSQL(t, src, "CREATE PUBLICATION "+pub+" FOR TABLE items")
	rc := connect(t, readerDSN, siphon.WithSlot(pub), siphon.WithPublication(pub))
	_, err = rc.EmitCanonical(ctx, nil, io.Discard)
	require.ErrorAs(t, err, &privErr)
	assert.Equal(t, fmt.Sprintf("siphon: emit canonical: role %q lacks SELECT on table public.items (needed for snapshots: copying each table's rows): "+
		"have a superuser (or each object's owner) run GRANT SELECT ON TABLE public.items TO %q (lock public.items: ERROR: permission denied for table items (SQLSTATE 42501))",
		reader, reader), err.Error())
	require.NoError(t, rc.DropSlot(ctx, pub))
	execSQL(t, src, "DROP PUBLICATION "+pub)
	require.NoError(t, rc.Close())
	require.NoError(t, c.Close())
	assertNoLeaks(t, srcDSN)
}
