//go:build unix && !linux

package pgdump

import "syscall"

// setParentDeathSignal does nothing: only Linux has a parent-death signal.
func setParentDeathSignal(*syscall.SysProcAttr) {}

func lockThread() (unlock func()) { return func() {} }
