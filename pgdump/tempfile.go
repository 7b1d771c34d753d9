package pgdump

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// Temporary files and directories (the password file, a directory-format
// dump) are removed by the call that made them, but a process that is
// killed (SIGKILL, the OOM killer, a crash) cannot remove them. So each is
// held, under an exclusive flock, by the process that made it for as long
// as it needs it, and making one first removes the entries of the same
// pattern in the same directory whose lock is free: their maker is gone.
// The part of a name that the pattern's "*" stands for is 16 hexadecimal
// digits, so that other names of the same prefix are never taken for ours.
// Without flock (systems other than Linux and the BSDs) nothing is swept.

// MkdirTemp creates a directory in dir ([os.TempDir] when empty), named
// from pattern as [os.MkdirTemp] names it (the last "*" stands for random
// characters), and returns its path and the function that removes it.
// This process holds the directory until then: a later MkdirTemp with the
// same pattern in dir, in any process, removes the directories of that
// pattern whose maker died holding them.
func MkdirTemp(dir, pattern string) (string, func() error, error) {
	path, held, err := holdTemp(dir, pattern, func(path string) error { return os.Mkdir(path, 0o700) })
	if err != nil {
		return "", nil, err
	}
	return path, func() error {
		err := os.RemoveAll(path)
		held.Close() // the lock goes with it, once the directory is gone
		return err
	}, nil
}

// holdTemp sweeps dir for entries of pattern whose maker is gone, then
// makes one with create (which fails if the path exists) and locks it. A
// sweep in another process may remove the new entry before it is locked:
// then it makes another.
func holdTemp(dir, pattern string, create func(path string) error) (string, *os.File, error) {
	if dir == "" {
		dir = os.TempDir()
	}
	i := strings.LastIndex(pattern, "*")
	if i < 0 || strings.ContainsRune(pattern, filepath.Separator) {
		return "", nil, fmt.Errorf("temporary entry pattern %q: want one * and no separator", pattern)
	}
	prefix, suffix := pattern[:i], pattern[i+1:]
	sweepTemp(dir, prefix, suffix)
	for range 10 {
		var random [8]byte
		rand.Read(random[:])
		path := filepath.Join(dir, prefix+hex.EncodeToString(random[:])+suffix)
		if err := create(path); errors.Is(err, fs.ErrExist) {
			continue
		} else if err != nil {
			return "", nil, err
		}
		held, err := os.Open(path)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err == nil {
			err = lockHeld(held)
		}
		if err != nil {
			if held != nil {
				held.Close()
			}
			os.RemoveAll(path)
			return "", nil, fmt.Errorf("hold %s: %w", path, err)
		}
		if sameFile(path, held) {
			return path, held, nil
		}
		held.Close()
	}
	return "", nil, fmt.Errorf("make a temporary entry %s in %s: no free name, or removed as soon as made", pattern, dir)
}

// sweepTemp removes the entries of dir named prefix, 16 hexadecimal
// digits and suffix that no live process holds. Entries it cannot open
// (another user's) are left alone.
func sweepTemp(dir, prefix, suffix string) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range entries {
		if !isTempName(e.Name(), prefix, suffix) {
			continue
		}
		path := filepath.Join(dir, e.Name())
		f, err := os.Open(path)
		if err != nil {
			continue
		}
		// Removed while locked, so that its maker, if it was just made,
		// finds it gone once it gets the lock.
		if tryLock(f) && sameFile(path, f) {
			os.RemoveAll(path)
		}
		f.Close()
	}
}

// isTempName reports whether name is prefix, 16 lower-case hexadecimal
// digits, then suffix.
func isTempName(name, prefix, suffix string) bool {
	mid, ok := strings.CutPrefix(name, prefix)
	if !ok {
		return false
	}
	if mid, ok = strings.CutSuffix(mid, suffix); !ok || len(mid) != 16 {
		return false
	}
	for _, r := range mid {
		if (r < '0' || r > '9') && (r < 'a' || r > 'f') {
			return false
		}
	}
	return true
}

// sameFile reports whether path still names the file f has open.
func sameFile(path string, f *os.File) bool {
	a, err1 := os.Lstat(path)
	b, err2 := f.Stat()
	return err1 == nil && err2 == nil && os.SameFile(a, b)
}
