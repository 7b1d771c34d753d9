package pgdump

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// An entry that no process holds is what a killed process leaves: the
// kernel drops its locks when it dies.
func TestTempEntriesOfDeadMakersAreSwept(t *testing.T) {
	t.Parallel()
	if runtime.GOOS != "linux" && runtime.GOOS != "darwin" && runtime.GOOS != "freebsd" {
		t.Skip("no flock: nothing is swept")
	}
	tmp := t.TempDir()
	orphanDir := filepath.Join(tmp, "siphon-backup-0123456789abcdef")
	require.NoError(t, os.MkdirAll(filepath.Join(orphanDir, "sub"), 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(orphanDir, "toc.dat"), []byte("x"), 0o600))
	orphanFile := filepath.Join(tmp, "siphon-pgpass-00000000deadbeef")
	require.NoError(t, os.WriteFile(orphanFile, []byte("*:*:*:*:secret\n"), 0o600))
	var others []string // names of the same prefixes that are not ours
	for _, name := range []string{"siphon-backup-chain-1234", "siphon-backup-0123456789ABCDEF", "siphon-backup-123", "siphon-pgpass-x"} {
		others = append(others, filepath.Join(tmp, name))
		require.NoError(t, os.Mkdir(others[len(others)-1], 0o700))
	}

	held, remove, err := MkdirTemp(tmp, "siphon-backup-*")
	require.NoError(t, err)
	assert.NoDirExists(t, orphanDir, "a directory no one holds is swept")
	assert.FileExists(t, orphanFile, "another pattern's entries are left")

	again, removeAgain, err := MkdirTemp(tmp, "siphon-backup-*")
	require.NoError(t, err)
	assert.DirExists(t, held, "a held directory is not swept")

	pass, heldPass, err := createPassfile(tmp, "pw")
	require.NoError(t, err)
	assert.NoFileExists(t, orphanFile, "a password file no one holds is swept")
	info, err := os.Stat(pass)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), info.Mode().Perm())
	for _, other := range others {
		assert.DirExists(t, other, "not a name of ours")
	}

	require.NoError(t, remove())
	require.NoError(t, removeAgain())
	require.NoError(t, os.Remove(pass))
	heldPass.Close()
	assert.NoDirExists(t, held)
	assert.NoDirExists(t, again)
	assert.NoFileExists(t, pass)
}

// On Linux the password file is gone from dir before the program starts:
// the program reads it through the descriptor it inherits.
func TestPassfileIsUnlinkedAndInherited(t *testing.T) {
	t.Parallel()
	if runtime.GOOS != "linux" {
		t.Skip("the password file is inherited on Linux only")
	}
	tmp := t.TempDir()
	env, inherit, release, err := writePassfile(tmp, `pa:ss\word`)
	require.NoError(t, err)
	defer release()
	assert.Equal(t, "/proc/self/fd/3", env)
	entries, err := os.ReadDir(tmp)
	require.NoError(t, err)
	assert.Empty(t, entries, "no password file by name")
	require.NotNil(t, inherit)
	info, err := inherit.Stat()
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), info.Mode().Perm(), "libpq ignores a password file others can read")
	data, err := os.ReadFile(fmt.Sprintf("/proc/self/fd/%d", inherit.Fd()))
	require.NoError(t, err, "opening the descriptor by path reopens the deleted file")
	assert.Equal(t, `*:*:*:*:pa\:ss\\word`+"\n", string(data))
}
