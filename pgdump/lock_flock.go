//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package pgdump

import (
	"os"
	"syscall"
)

// lockHeld takes f's exclusive lock, waiting for a sweep that holds it.
// The lock lasts until f is closed, or this process dies.
func lockHeld(f *os.File) error {
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX)
		if err != syscall.EINTR {
			return err
		}
	}
}

// tryLock takes f's exclusive lock if no one holds it.
func tryLock(f *os.File) bool {
	return syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) == nil
}
