//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package pgdump

import "os"

// lockHeld does nothing: without flock, nothing is swept.
func lockHeld(*os.File) error { return nil }

// tryLock reports false: without flock, no maker can be known gone.
func tryLock(*os.File) bool { return false }
