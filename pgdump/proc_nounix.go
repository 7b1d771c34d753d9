//go:build !unix

package pgdump

import (
	"os/exec"
	"time"
)

// processGroup on systems without process groups: the stop kills the
// program itself.
type processGroup struct{}

func newProcessGroup(cmd *exec.Cmd, delay time.Duration) *processGroup {
	cmd.WaitDelay = delay
	return &processGroup{}
}

func (*processGroup) sweep() {}

func lockThread() (unlock func()) { return func() {} }
