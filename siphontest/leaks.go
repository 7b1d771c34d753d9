package siphontest

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
)

// goroutineSet holds goroutine IDs.
type goroutineSet map[string]bool

// allStacks returns the stacks of every goroutine, as runtime.Stack
// prints them: blocks separated by blank lines, each starting with
// "goroutine <id> [<state>]:".
func allStacks() []string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return strings.Split(string(buf[:n]), "\n\n")
		}
		buf = make([]byte, 2*len(buf))
	}
}

func goroutineID(stack string) string {
	id, _, _ := strings.Cut(strings.TrimPrefix(stack, "goroutine "), " ")
	return id
}

func runningGoroutines() goroutineSet {
	set := goroutineSet{}
	for _, stack := range allStacks() {
		set[goroutineID(stack)] = true
	}
	return set
}

// harmlessFrames mark goroutines the runtime and the testing package keep
// for themselves, which may start during a run and never end.
var harmlessFrames = []string{
	"testing.(*M).",
	"testing.runFuzzing",
	"os/signal.",
	"runtime.ensureSigM",
	"runtime/trace.",
	"runtime.goexit0",
}

// leakedGoroutines describes the goroutines not in before, but the caller
// and the runtime's and testing package's own.
func leakedGoroutines(before goroutineSet) string {
	var b strings.Builder
	stacks := allStacks()
	for _, stack := range stacks[1:] { // the first is the caller's
		if before[goroutineID(stack)] || containsAny(stack, harmlessFrames) {
			continue
		}
		b.WriteString(stack)
		b.WriteString("\n\n")
	}
	return b.String()
}

func containsAny(s string, subs []string) bool {
	for _, sub := range subs {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}

// childProcesses describes this process's child processes, found by their
// parent PID in /proc/<pid>/stat; "" when there are none or no /proc.
func childProcesses() string {
	self := strconv.Itoa(os.Getpid())
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	var b strings.Builder
	for _, path := range stats {
		stat, err := os.ReadFile(path)
		if err != nil {
			continue // it exited meanwhile
		}
		// pid (comm) state ppid ...; comm may hold spaces and parentheses.
		end := bytes.LastIndexByte(stat, ')')
		if end < 0 {
			continue
		}
		fields := strings.Fields(string(stat[end+1:]))
		if len(fields) < 2 || fields[1] != self {
			continue
		}
		pid := filepath.Base(filepath.Dir(path))
		cmdline, _ := os.ReadFile(filepath.Join(filepath.Dir(path), "cmdline"))
		command := strings.TrimSpace(string(bytes.ReplaceAll(cmdline, []byte{0}, []byte{' '})))
		if command == "" {
			command = string(stat[bytes.IndexByte(stat, '(')+1 : end])
		}
		fmt.Fprintf(&b, "child process %s (state %s): %s\n", pid, fields[0], command)
	}
	return b.String()
}
