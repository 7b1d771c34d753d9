package siphontest

import (
	"fmt"
	"os"
	"testing"
	"time"
)

// Main runs the tests of m, stops the shared server, and exits with the
// tests' exit code. Use it from TestMain when the server must be gone before
// the test binary exits; without it the reaper stops the server right after.
//
// With [CheckLeaks], a run whose tests passed fails when they left
// goroutines running or child processes behind.
func Main(m *testing.M, opts ...MainOption) {
	var cfg mainConfig
	for _, opt := range opts {
		opt(&cfg)
	}
	var before goroutineSet
	if cfg.checkLeaks {
		before = runningGoroutines()
	}
	code := m.Run()
	if shared.server != nil {
		if err := shared.server.Close(); err != nil {
			fmt.Fprintln(os.Stderr, err)
		}
	}
	if cfg.checkLeaks && code == 0 {
		if leaks := awaitNoLeaks(before, leakGrace); leaks != "" {
			fmt.Fprintf(os.Stderr, "siphontest: the tests passed but left behind:\n%s", leaks)
			code = 1
		}
	}
	os.Exit(code)
}

// MainOption changes what [Main] does.
type MainOption func(*mainConfig)

type mainConfig struct {
	checkLeaks bool
}

// CheckLeaks makes [Main] fail a run whose tests passed when, after the
// tests and the shared server's shutdown, goroutines that started during
// the run are still running, or the test binary has child processes left
// (running, or exited and never waited for). Main waits up to 10 s for
// them to end, then prints each leaked goroutine's stack and each child's
// PID and command. Children are found through /proc; where there is none,
// only goroutines are checked.
func CheckLeaks() MainOption { return func(c *mainConfig) { c.checkLeaks = true } }

// leakGrace is how long Main waits for goroutines and child processes to
// end: connections close and processes exit asynchronously.
const leakGrace = 10 * time.Second

// awaitNoLeaks polls until no goroutine outside before is running and no
// child process is left, or grace has passed; it returns what is left,
// described, or "".
func awaitNoLeaks(before goroutineSet, grace time.Duration) string {
	deadline := time.Now().Add(grace)
	for {
		leaks := leakedGoroutines(before) + childProcesses()
		if leaks == "" || time.Now().After(deadline) {
			return leaks
		}
		time.Sleep(50 * time.Millisecond)
	}
}
