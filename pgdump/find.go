package pgdump

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"sync"
	"time"
)

// Program is a client program found on this machine.
type Program struct {
	// Name is "pg_dump" or "pg_restore".
	Name string
	// Path is the executable's path.
	Path string
	// Version is what the program's --version reports.
	Version Version
}

// ErrNotFound means no executable of the program was found. Install the
// PostgreSQL client programs or name the binary with [ExecOptions].Bin.
var ErrNotFound = errors.New("pgdump: program not found")

// VersionError means the program found is of an older major release than
// the server: pg_dump refuses to dump a newer server, and an older
// pg_restore may not read a newer pg_dump's archive.
type VersionError struct {
	Program Program
	Server  Version
}

func (e *VersionError) Error() string {
	return fmt.Sprintf("pgdump: %s %s (%s) is older than the server (%s): install the PostgreSQL %s client programs "+
		"(Debian/Ubuntu: apt-get install postgresql-client-%s) or point ExecOptions.Bin at them",
		e.Program.Name, e.Program.Version, e.Program.Path, e.Server, e.Server.Release(), e.Server.Release())
}

// installRoots are the glob patterns searched besides PATH, the layout of
// Debian and Ubuntu packages.
var installRoots = []string{"/usr/lib/postgresql/*/bin"}

// Find locates program ("pg_dump" or "pg_restore"). With bin set (a path
// to the program, or a directory holding it) only that one is considered;
// otherwise the candidates are the program on PATH and under
// /usr/lib/postgresql/*/bin, and the newest release wins (on a tie, the one
// under /usr/lib/postgresql, since the Debian PATH entry is a wrapper
// script). When server is not zero, a program of an older major release
// than the server is a [*VersionError]; no candidate at all is an error
// wrapping [ErrNotFound]. Versions are probed once per executable and
// cached.
func Find(ctx context.Context, program, bin string, server Version) (Program, error) {
	candidates := candidatePaths(program, bin)
	var best Program
	var probeErr error
	for _, path := range candidates {
		p, err := Probe(ctx, path)
		if err != nil {
			if bin != "" {
				return Program{}, err
			}
			probeErr = err
			continue
		}
		if best.Path == "" || p.Version.Compare(best.Version) > 0 {
			best = p
		}
	}
	if best.Path == "" {
		if probeErr != nil {
			return Program{}, probeErr
		}
		where := "on PATH or under " + installRoots[0]
		if bin != "" {
			where = "at " + bin
		}
		return Program{}, fmt.Errorf("%w: no executable %s %s: install the PostgreSQL client programs "+
			"(Debian/Ubuntu: apt-get install postgresql-client) or set ExecOptions.Bin", ErrNotFound, program, where)
	}
	if !server.IsZero() && best.Version.OlderRelease(server) {
		return Program{}, &VersionError{Program: best, Server: server}
	}
	return best, nil
}

// candidatePaths lists the executables to consider, install roots first
// (newest release directory first), then PATH.
func candidatePaths(program, bin string) []string {
	if bin != "" {
		if info, err := os.Stat(bin); err == nil && info.IsDir() {
			return []string{filepath.Join(bin, program)}
		}
		return []string{bin}
	}
	var paths []string
	for _, root := range installRoots {
		dirs, _ := filepath.Glob(root)
		sort.Slice(dirs, func(i, j int) bool { return releaseOfDir(dirs[i]).Compare(releaseOfDir(dirs[j])) > 0 })
		for _, dir := range dirs {
			if isExecutable(filepath.Join(dir, program)) {
				paths = append(paths, filepath.Join(dir, program))
			}
		}
	}
	if p, err := exec.LookPath(program); err == nil {
		paths = append(paths, p)
	}
	return paths
}

// releaseOfDir reads the release from a path like /usr/lib/postgresql/15/bin.
func releaseOfDir(dir string) Version {
	v, _ := ParseVersion(filepath.Base(filepath.Dir(dir)))
	return v
}

func isExecutable(path string) bool {
	info, err := os.Stat(path)
	return err == nil && info.Mode().IsRegular() && info.Mode()&0o111 != 0
}

// probeCache remembers versions by path, size and modification time, so
// a program replaced in place is probed again.
var probeCache sync.Map // probeKey -> Program

type probeKey struct {
	path  string
	size  int64
	mtime time.Time
}

// Probe runs path --version and returns the program it is. The result is
// cached while the file is unchanged.
func Probe(ctx context.Context, path string) (Program, error) {
	info, err := os.Stat(path)
	if err != nil {
		return Program{}, fmt.Errorf("pgdump: %w", err)
	}
	key := probeKey{path, info.Size(), info.ModTime()}
	if p, ok := probeCache.Load(key); ok {
		return p.(Program), nil
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, path, "--version").Output()
	if err != nil {
		return Program{}, fmt.Errorf("pgdump: %s --version: %w", path, err)
	}
	line, _, _ := bytes.Cut(out, []byte("\n"))
	name, _, _ := bytes.Cut(line, []byte(" "))
	v, err := ParseVersion(string(line))
	if err != nil || !bytes.Contains(line, []byte("PostgreSQL")) {
		return Program{}, fmt.Errorf("pgdump: %s --version printed %q: not a PostgreSQL client program", path, line)
	}
	p := Program{Name: string(name), Path: path, Version: v}
	probeCache.Store(key, p)
	return p, nil
}
