package siphon_test

import (
	"fmt"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/siphondb/siphon/siphontest"
)

// childModeEnv names the environment variable that makes the test binary
// run one of childModes instead of the tests.
const childModeEnv = "SIPHON_TEST_CHILD"

// childModes are the programs the test binary runs as a child process of a
// test (a process to SIGKILL, or to measure alone), by the value of
// childModeEnv. Each test file registers its own in an init function.
var childModes = map[string]func() error{}

func TestMain(m *testing.M) {
	if mode := os.Getenv(childModeEnv); mode != "" {
		run, ok := childModes[mode]
		if !ok {
			fmt.Fprintf(os.Stderr, "no child mode %q\n", mode)
			os.Exit(2)
		}
		if err := run(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	siphontest.Main(m, siphontest.CheckLeaks())
}

// childCmd returns the test binary set up to run the child mode named
// mode, with env added to this process's environment.
func childCmd(mode string, env ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), childModeEnv+"="+mode), env...)
	return cmd
}

// runChild runs the child mode named mode to completion, with env added,
// and returns its standard output. The test fails if the child fails, or
// has written nothing for waitDeadline and a minute (a child bounds its
// own work by waitDeadline without progress); what names the child in the
// message.
func runChild(t *testing.T, what, mode string, env ...string) string {
	t.Helper()
	cmd := childCmd(mode, env...)
	var stdout, stderr lockedBuffer
	stall := newStallDeadline(waitDeadline + time.Minute)
	cmd.Stdout, cmd.Stderr = stall.writer(&stdout), stall.writer(&stderr)
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case err := <-exited:
			require.NoError(t, err, "%s\nstderr: %s", what, stderr.String())
			return stdout.String()
		case <-tick.C:
			if stall.stalled() {
				_ = cmd.Process.Kill()
				<-exited
				t.Fatalf("%s wrote nothing for %v\nstderr: %s", what, stall.bound, stderr.String())
			}
		}
	}
}
