//go:build unix

package pgdump

import (
	"errors"
	"os/exec"
	"sync"
	"syscall"
	"time"
)

// processGroup runs a program in a process group of its own, so that a
// stop reaches the workers a parallel pg_dump or pg_restore forks too.
type processGroup struct {
	cmd *exec.Cmd

	mu     sync.Mutex
	killer *time.Timer // SIGKILL after the wait delay, armed by the stop
}

// newProcessGroup prepares cmd: its own process group, SIGTERM to the
// group when the context is done, SIGKILL to the group delay later.
func newProcessGroup(cmd *exec.Cmd, delay time.Duration) *processGroup {
	g := &processGroup{cmd: cmd}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	setParentDeathSignal(cmd.SysProcAttr)
	cmd.Cancel = func() error {
		pgid := cmd.Process.Pid
		g.mu.Lock()
		g.killer = time.AfterFunc(delay, func() { syscall.Kill(-pgid, syscall.SIGKILL) })
		g.mu.Unlock()
		return signalGroup(pgid, syscall.SIGTERM)
	}
	// Past the delay, Wait also stops waiting for the output pipes.
	cmd.WaitDelay = delay
	return g
}

// sweep runs after Wait. After a stop it kills what is left of the group
// (workers that outlived the leader; the group's ID cannot have been
// reused while any member lives) and waits, briefly, for them to be gone.
func (g *processGroup) sweep() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.killer == nil {
		return
	}
	g.killer.Stop()
	pgid := g.cmd.Process.Pid
	deadline := time.Now().Add(2 * time.Second)
	for syscall.Kill(-pgid, syscall.SIGKILL) == nil && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond) // orphans are reaped by init, not by us
	}
}

// signalGroup sends sig to the process group; a group already gone is
// not an error (exec.Cmd then reports how the leader ended).
func signalGroup(pgid int, sig syscall.Signal) error {
	err := syscall.Kill(-pgid, sig)
	if errors.Is(err, syscall.ESRCH) {
		return nil
	}
	return err
}
