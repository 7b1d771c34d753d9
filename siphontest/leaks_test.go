//go:build linux

package siphontest_test

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// leakChildEnv makes TestLeakChild leak what it names: "goroutine" or
// "child".
const leakChildEnv = "SIPHONTEST_LEAK"

// TestCheckLeaks runs this test binary again, with CheckLeaks, on a test
// that passes but leaks: the run must fail and name what was left.
func TestCheckLeaks(t *testing.T) {
	t.Parallel()
	for leak, want := range map[string]string{
		"goroutine": "siphontest_test.leakGoroutine",
		"child":     "child process",
	} {
		t.Run(leak, func(t *testing.T) {
			t.Parallel()
			cmd := exec.Command(os.Args[0], "-test.run=^TestLeakChild$", "-test.v")
			cmd.Env = append(os.Environ(), leakChildEnv+"="+leak)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			began := time.Now()
			err := cmd.Run()
			var exit *exec.ExitError
			require.True(t, errors.As(err, &exit), "the leaking run must fail, got %v\n%s", err, stderr.String())
			assert.Equal(t, 1, exit.ExitCode())
			assert.Contains(t, stderr.String(), "the tests passed but left behind")
			assert.Contains(t, stderr.String(), want)
			assert.Less(t, time.Since(began), 3*time.Minute, "Main waits 10 s, then gives up: it does not wait forever")
		})
	}
}

// TestLeakChild is TestCheckLeaks's child: with leakChildEnv set it passes
// but leaves a goroutine or a child process behind; without, it does
// nothing.
func TestLeakChild(t *testing.T) {
	switch os.Getenv(leakChildEnv) {
	case "goroutine":
		go leakGoroutine()
	case "child":
		// The kernel ends it when this process exits.
		sleep := exec.Command("sleep", "60")
		sleep.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		require.NoError(t, sleep.Start())
	}
}

func leakGoroutine() { select {} }
