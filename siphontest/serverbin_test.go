package siphontest_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/siphondb/siphon/siphontest"
)

// localBinDir returns the directory of the shared server's binaries, or
// skips the test when siphontest does not run that server itself.
func localBinDir(t *testing.T) string {
	t.Helper()
	if os.Getenv(siphontest.EnvDSN) != "" {
		t.Skip("WithServerBin applies to servers siphontest starts itself, not the SIPHON_TEST_DSN one")
	}
	shared := siphontest.Start(t)
	if shared.Source() != "local" {
		t.Skipf("WithServerBin applies to servers siphontest starts from local binaries, not %s ones", shared.Source())
	}
	var dir string
	require.NoError(t, pgxQuery(shared.DSN(), "SELECT setting FROM pg_config WHERE name = 'BINDIR'", &dir))
	return dir
}

// linkedBinDir makes a directory with mode perm holding symbolic links to
// the initdb and postgres of binDir: a directory of server binaries that no
// search would find.
func linkedBinDir(t *testing.T, binDir string, perm os.FileMode) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "siphontest-bin-")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	for _, program := range []string{"initdb", "postgres"} {
		require.NoError(t, os.Symlink(filepath.Join(binDir, program), filepath.Join(dir, program)))
	}
	require.NoError(t, os.Chmod(dir, perm))
	return dir
}

func launch(t *testing.T, opts ...siphontest.Option) (*siphontest.Server, error) {
	t.Helper()
	// Launching runs initdb and starts a server: seconds when quiet, most of
	// a minute on a loaded machine. Only a hang reaches this bound.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	srv, err := siphontest.Launch(ctx, opts...)
	if err == nil {
		t.Cleanup(func() { srv.Close() })
	}
	return srv, err
}

// TestWithServerBinRunsThoseBinaries names a directory of server binaries
// that the search would not find: the postmaster runs from it.
func TestWithServerBinRunsThoseBinaries(t *testing.T) {
	t.Parallel()
	dir := linkedBinDir(t, localBinDir(t), 0o755)
	srv, err := launch(t, siphontest.WithServerBin(dir))
	require.NoError(t, err)
	assert.Equal(t, filepath.Join(dir, "postgres"), postmasterCommand(t, srv))
}

// TestWithServerBinWithoutBinariesFails names a directory without server
// binaries: Launch fails, saying which directory, and does not fall back to
// other binaries or report that no server is available (which would skip
// the tests instead of failing them).
func TestWithServerBinWithoutBinariesFails(t *testing.T) {
	t.Parallel()
	localBinDir(t)
	dir := t.TempDir()
	_, err := launch(t, siphontest.WithServerBin(dir))
	require.Error(t, err)
	assert.False(t, errors.Is(err, siphontest.ErrNoServer), "no fallback: %v", err)
	assert.Contains(t, err.Error(), "no executable initdb and postgres in "+dir)
}

// TestEnvServerBinIsTheDefault sets SIPHON_TEST_SERVER_BIN: Launch uses the
// directory it names, unless WithServerBin names another.
func TestEnvServerBinIsTheDefault(t *testing.T) {
	binDir := localBinDir(t)
	empty := t.TempDir()
	t.Setenv(siphontest.EnvServerBin, empty)
	_, err := launch(t)
	require.Error(t, err)
	assert.Contains(t, err.Error(), empty, "the directory the variable names is used")

	dir := linkedBinDir(t, binDir, 0o755)
	srv, err := launch(t, siphontest.WithServerBin(dir))
	require.NoError(t, err, "WithServerBin wins over the variable")
	assert.Equal(t, filepath.Join(dir, "postgres"), postmasterCommand(t, srv))
}

// TestServerBinTheServerUserCannotRead runs as root, where the server runs
// as an unprivileged user, with binaries in a directory only root may
// enter: Launch says what that user must be able to reach.
func TestServerBinTheServerUserCannotRead(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("only a root test runs the server as another user")
	}
	t.Parallel()
	dir := linkedBinDir(t, localBinDir(t), 0o700)
	_, err := launch(t, siphontest.WithServerBin(dir))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "must be able to read and execute "+dir)
	assert.Contains(t, err.Error(), "chmod -R a+rX")
}

// postmasterCommand returns the path the server's postmaster was started
// as, from its postmaster.pid and /proc.
func postmasterCommand(t *testing.T, srv *siphontest.Server) string {
	t.Helper()
	var dataDir string
	require.NoError(t, pgxQuery(srv.DSN(), "SELECT current_setting('data_directory')", &dataDir))
	pidFile, err := os.ReadFile(filepath.Join(dataDir, "postmaster.pid"))
	require.NoError(t, err)
	pid, err := strconv.Atoi(strings.SplitN(string(pidFile), "\n", 2)[0])
	require.NoError(t, err)
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	require.NoError(t, err)
	command, _, _ := strings.Cut(string(cmdline), "\x00")
	return command
}
