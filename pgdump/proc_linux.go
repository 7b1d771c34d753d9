package pgdump

import (
	"runtime"
	"syscall"
)

// setParentDeathSignal makes the kernel kill the program if this process
// dies without stopping it (a crash, SIGKILL), so no orphan keeps
// dumping.
func setParentDeathSignal(attr *syscall.SysProcAttr) { attr.Pdeathsig = syscall.SIGKILL }

// lockThread pins the calling goroutine to its OS thread while a program
// runs: the parent-death signal fires when the thread that started the
// program exits, and a locked thread is not retired under it.
func lockThread() (unlock func()) {
	runtime.LockOSThread()
	return runtime.UnlockOSThread
}
