package main

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/siphondb/siphon/canonical"
)

// TestSinkRepairsAFileCutMidTransaction: a crash leaves a file that ends
// inside a transaction; reopening keeps the complete transactions, resumes
// after the last one, and the repaired file decodes cleanly.
func TestSinkRepairsAFileCutMidTransaction(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s, err := openSink(dir, 1<<20, "slot")
	require.NoError(t, err)
	require.True(t, s.last.IsZero())

	cols := []canonical.Column{{Name: "id", Type: "bigint", TypeOID: 20}}
	txn := func(xid uint32, commit, end canonical.Position) {
		at := time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)
		require.NoError(t, s.emit(canonical.Change{Op: canonical.OpBegin, XID: xid, Position: commit, CommitTime: at}))
		require.NoError(t, s.emit(canonical.Change{Op: canonical.OpInsert, XID: xid, Position: commit, Schema: "public", Table: "t",
			Columns: cols, New: canonical.Row{canonical.Text("1")}}))
		if end != 0 {
			require.NoError(t, s.emit(canonical.Change{Op: canonical.OpCommit, XID: xid, Position: end, CommitTime: at}))
		}
	}
	txn(10, 0x100, 0x110)
	txn(11, 0x200, 0) // cut: no commit
	require.NoError(t, s.close())

	reopened, err := openSink(dir, 1<<20, "slot")
	require.NoError(t, err)
	assert.Equal(t, canonical.Position(0x110), reopened.last, "resume after the last complete transaction")

	seen := map[string]int{}
	require.NoError(t, readInserts(filepath.Join(dir, "changes-000001.jsonl"), seen), "the repaired file decodes to its end record")
	assert.Equal(t, map[string]int{"1": 1}, seen, "the cut transaction's insert is gone")
	_, err = os.Stat(filepath.Join(dir, "changes-000001.jsonl.repair"))
	assert.True(t, os.IsNotExist(err), "no repair file left")
}

// TestSinkRefusesADamagedFile: a file damaged before its end (not cut) is
// an error, and left as it is: repairing it would drop transactions the
// slot no longer holds.
func TestSinkRefusesADamagedFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s, err := openSink(dir, 1<<20, "slot")
	require.NoError(t, err)
	at := time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)
	for xid := uint32(10); xid < 12; xid++ {
		commit := canonical.Position(xid) << 8
		require.NoError(t, s.emit(canonical.Change{Op: canonical.OpBegin, XID: xid, Position: commit, CommitTime: at}))
		require.NoError(t, s.emit(canonical.Change{Op: canonical.OpCommit, XID: xid, Position: commit + 0x10, CommitTime: at}))
	}
	require.NoError(t, s.close())

	path := filepath.Join(dir, "changes-000001.jsonl")
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	damaged := bytes.Replace(data, []byte(`"t":"commit"`), []byte(`"t":"commit"}`), 1)
	require.NotEqual(t, data, damaged)
	require.NoError(t, os.WriteFile(path, damaged, 0o644))

	_, err = openSink(dir, 1<<20, "slot")
	require.ErrorIs(t, err, canonical.ErrChecksum, "the commit's checksum finds the damage")
	after, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, damaged, after, "a damaged file is not rewritten")
}
