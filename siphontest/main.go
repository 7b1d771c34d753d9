package siphontest

import (
	"fmt"
	"os"
	"testing"
)

// Main runs the tests of m, stops the shared server, and exits with the
// tests' exit code. Use it from TestMain when the server must be gone before
// the test binary exits; without it the reaper stops the server right after.
func Main(m *testing.M) {
	code := m.Run()
	if shared.server != nil {
		if err := shared.server.Close(); err != nil {
			fmt.Fprintln(os.Stderr, err)
		}
	}
	os.Exit(code)
}
