package siphon_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/siphondb/siphon"
	"github.com/siphondb/siphon/canonical"
)

// hostileDDL makes tables whose schema, table and column names hold
// quotes, semicolons, spaces, comment markers, unicode, upper case and
// reserved words. Quoted, they are legal; spliced into SQL, any of them
// would break the statement or inject one.
var hostileDDL = []string{
	`CREATE SCHEMA "Sch""; DROP TABLE x; --"`,
	`CREATE TABLE "Sch""; DROP TABLE x; --"."select" (
		"order" int8 PRIMARY KEY, "from" text, "a;b" text, "Spaced Col" int, "UPPER" bool, "ünï ☃" text)`,
	`CREATE TABLE public."Tab ""q"" ü ☃" ("Key'); --" text PRIMARY KEY, "group" int8 NOT NULL, "$1" text)`,
	`CREATE TABLE public."user" (id int8, "default" text)`,
	`ALTER TABLE public."user" REPLICA IDENTITY FULL`,
}

// hostileTables are hostileDDL's tables as WithTables and SQL take them.
var hostileTables = []string{`"Sch""; DROP TABLE x; --"."select"`, `public."Tab ""q"" ü ☃"`, `public."user"`}

// hostileRows fills the tables with values that are SQL, quotes, escapes
// and control characters.
var hostileRows = []string{
	`INSERT INTO "Sch""; DROP TABLE x; --"."select" SELECT g, E'\'; DROP TABLE t; --' || g, '"quoted" \ back\slash',
		g * 7, g % 2 = 0, E'tab\there\nnewline ☃ ' || g FROM generate_series(1, 50) g`,
	`INSERT INTO "Sch""; DROP TABLE x; --"."select" VALUES (0, '', NULL, NULL, NULL, 'NULL')`,
	`INSERT INTO public."Tab ""q"" ü ☃" SELECT 'k''' || g || '); --', g, '$1 $2 %s %v' FROM generate_series(1, 20) g`,
	`INSERT INTO public."user" SELECT g, CASE WHEN g % 3 = 0 THEN NULL ELSE 'u' || g END FROM generate_series(1, 10) g`,
}

// hostileChanges change every table after the snapshot and the backup:
// inserts, updates (of keys too), deletes; the last statement is the
// marker the stream stops at.
var hostileChanges = []string{
	`INSERT INTO "Sch""; DROP TABLE x; --"."select" VALUES (100, '''); --', '"', 1, true, '☃')`,
	`UPDATE "Sch""; DROP TABLE x; --"."select" SET "from" = "from" || ' updated', "order" = "order" + 1000 WHERE "order" % 5 = 0`,
	`DELETE FROM "Sch""; DROP TABLE x; --"."select" WHERE "order" % 7 = 1`,
	`UPDATE public."Tab ""q"" ü ☃" SET "Key'); --" = "Key'); --" || '"', "group" = -"group" WHERE "group" % 2 = 0`,
	`DELETE FROM public."Tab ""q"" ü ☃" WHERE "group" = 3`,
	`UPDATE public."user" SET "default" = 'changed''; --' WHERE id = 2`,
	`DELETE FROM public."user" WHERE id = 3`,
	`INSERT INTO public."user" VALUES (11, NULL)`,
	`SELECT pg_logical_emit_message(true, 'hostile.end', '')`,
}

// TestHostileNamesGoThroughEveryPath takes tables with hostile names and
// values through the snapshot, the change stream, a backup with its
// incremental, a restore, and both ways of applying (ConsumeCanonical and
// ApplyChange): both copies must equal the source. Slot and publication
// names that could not be used safely are refused up front.
func TestHostileNamesGoThroughEveryPath(t *testing.T) {
	t.Parallel()
	skipUnlessDumpClients(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*waitDeadline)
	defer cancel()
	srcDSN, srcConn := newDatabase(t)
	replicaDSN, replicaConn := newDatabase(t)
	restoredDSN, restoredConn := newDatabase(t)
	execSQL(t, srcConn, hostileDDL...)
	execSQL(t, srcConn, hostileRows...)
	execSQL(t, replicaConn, hostileDDL...)
	systemID := systemIdentifier(t, srcConn)

	slot, backupSlot := streamSlot(t), streamSlot(t)
	src, err := siphon.Connect(ctx, srcDSN, siphon.WithSlot(slot), siphon.WithTables(hostileTables...),
		siphon.WithPublication("hostile_pub"))
	require.NoError(t, err)
	defer src.Close()
	backups, err := siphon.Connect(ctx, srcDSN, siphon.WithSlot(backupSlot), siphon.WithTables(hostileTables...),
		siphon.WithPublication("hostile_pub"))
	require.NoError(t, err)
	defer backups.Close()
	replica, err := siphon.Connect(ctx, replicaDSN)
	require.NoError(t, err)
	defer replica.Close()
	restored, err := siphon.Connect(ctx, restoredDSN)
	require.NoError(t, err)
	defer restored.Close()
	forgetAppliedPosition(t, replicaDSN, systemID, slot)
	forgetAppliedPosition(t, restoredDSN, systemID, backupSlot)

	// The snapshot and the backup, then the changes after both.
	var snapshot, backup, incremental bytes.Buffer
	snapshotAt, err := src.EmitCanonical(ctx, nil, &snapshot)
	require.NoError(t, err)
	require.NoError(t, backups.Backup(ctx, siphon.BackupOptions{StartChain: true}, &backup))
	report, err := backups.Verify(ctx, bytes.NewReader(backup.Bytes()))
	require.NoError(t, err)
	require.True(t, report.OK, "%v", report.Problems)
	execSQL(t, srcConn, hostileChanges...)

	// Replica: the snapshot through ConsumeCanonical, the stream through
	// ApplyChange.
	require.NoError(t, replica.ConsumeCanonical(ctx, bytes.NewReader(snapshot.Bytes())))
	streamCtx, stop := context.WithCancel(ctx)
	defer stop()
	_, err = src.StreamChanges(streamCtx, snapshotAt, func(ch canonical.Change) error {
		if ch.Op == canonical.OpMessage && ch.Message.Prefix == "hostile.end" {
			stop()
		}
		return replica.ApplyChange(ctx, ch)
	})
	require.NoError(t, err)

	// Restored: the backup through Restore, the incremental through
	// ConsumeCanonical.
	_, err = backups.BackupIncremental(ctx, report.Start, &incremental)
	require.NoError(t, err)
	require.NoError(t, restored.Restore(ctx, siphon.RestoreOptions{}, bytes.NewReader(backup.Bytes())))
	require.NoError(t, restored.ConsumeCanonical(ctx, bytes.NewReader(incremental.Bytes())))

	for _, table := range hostileTables {
		want := digest(t, srcConn, table)
		assert.Equal(t, want, digest(t, replicaConn, table), "replica: %s", table)
		assert.Equal(t, want, digest(t, restoredConn, table), "restored: %s", table)
	}
	var sneaked int
	require.NoError(t, srcConn.QueryRow(ctx, `SELECT count(*) FROM pg_class WHERE relname = 'x'`).Scan(&sneaked))
	assert.Zero(t, sneaked, "no name was spliced into SQL")

	src.Close()
	backups.Close()
	assertNoLeaks(t, srcDSN, slot, backupSlot)
}

// TestHostileSlotAndPublicationNamesAreRefused checks that slot and
// publication names that are not plain identifiers are refused by Connect,
// before anything touches the server.
func TestHostileSlotAndPublicationNamesAreRefused(t *testing.T) {
	t.Parallel()
	dsn, conn := newDatabase(t)
	for _, name := range []string{`s"; DROP TABLE x; --`, "s'q", "has space", "UPPER", "ünï", "semi;colon", "", strings.Repeat("x", 64)} {
		for option, opt := range map[string]siphon.Option{"WithSlot": siphon.WithSlot(name), "WithPublication": siphon.WithPublication(name)} {
			c, err := siphon.Connect(context.Background(), dsn, opt)
			var optErr *siphon.OptionError
			if assert.True(t, errors.As(err, &optErr), "%s(%q): want an *OptionError, got %v", option, name, err) {
				assert.Equal(t, option, optErr.Option)
			}
			if c != nil {
				c.Close()
			}
		}
	}
	var slots, publications int
	require.NoError(t, conn.QueryRow(context.Background(), `SELECT
		(SELECT count(*) FROM pg_replication_slots WHERE database = current_database()),
		(SELECT count(*) FROM pg_publication)`).Scan(&slots, &publications))
	assert.Zero(t, slots)
	assert.Zero(t, publications)
}
