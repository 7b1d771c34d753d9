package pgdump

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"time"
)

// ExecOptions says how to find and run a program; every operation of this
// package takes them.
type ExecOptions struct {
	// Bin is the program's path, or a directory holding pg_dump and
	// pg_restore. Empty: [Find] looks on PATH and under
	// /usr/lib/postgresql/*/bin.
	Bin string
	// ServerVersion is the server's version, when known: the program chosen
	// is of the same major release or newer, and an older one is a
	// [*VersionError]. Defaults to zero: the newest program found, no check.
	ServerVersion Version
	// WaitDelay bounds how long a program may take to exit once the
	// context is done: its process group gets SIGTERM at once and SIGKILL
	// after WaitDelay. Defaults to 5s.
	WaitDelay time.Duration
	// TempDir is where the password file is written, mode 0600. On Linux
	// it is unlinked before the program starts, which inherits it open: a
	// process killed while a program runs leaves no password file.
	// Elsewhere it is removed when the program exits, and one left by a
	// process that was killed is removed by the next program run with the
	// same TempDir. Defaults to [os.TempDir].
	TempDir string
}

const (
	defaultWaitDelay = 5 * time.Second
	// StderrLimit is how much of a program's standard error is kept: the
	// last 64 KiB.
	StderrLimit = 64 << 10
)

// ExitError is the error returned when a program exits with a failure
// status or is killed by a signal it was not sent by this package.
type ExitError struct {
	// Args is the command line: the program's path, then its arguments.
	// It never holds a password.
	Args []string
	// ExitCode is the exit status, or -1 when a signal ended the program.
	ExitCode int
	// Stderr is the end of the program's standard error (the last
	// [StderrLimit] bytes), with the password, if it ever appears, masked.
	Stderr string
}

// Error names the program, its status and its first error line (the rest
// is in Stderr).
func (e *ExitError) Error() string {
	name := "program"
	if len(e.Args) > 0 {
		name = e.Args[0]
	}
	status := fmt.Sprintf("exit status %d", e.ExitCode)
	if e.ExitCode < 0 {
		status = "killed by a signal"
	}
	return fmt.Sprintf("pgdump: %s: %s: %s", name, status, stderrSummary(e.Stderr))
}

// stderrSummary picks the line that says what went wrong: the first
// "error:" line (pg_dump and pg_restore print the cause first, then
// context such as "Command was: ..."), else the last line.
func stderrSummary(stderr string) string {
	lines := strings.Split(strings.TrimSpace(stderr), "\n")
	pick := lines[len(lines)-1]
	for _, l := range lines {
		if strings.Contains(l, "error:") {
			pick = l
			break
		}
	}
	if pick == "" {
		return "no error output"
	}
	if len(pick) > 500 {
		pick = pick[:500] + "..."
	}
	if len(lines) > 1 {
		pick += " (more in ExitError.Stderr)"
	}
	return pick
}

// command is one run of a program.
type command struct {
	program Program
	args    []string
	exec    ExecOptions
	conn    *Conn     // nil: the program does not connect
	stdin   io.Reader // nil: none
	stdout  io.Writer // nil: discarded
}

// run runs c to completion: stdin is copied in from the calling goroutine,
// stdout out by a goroutine joined before run returns. When ctx is done,
// or stdout's writer fails, the process group is terminated.
func run(ctx context.Context, c command) (err error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	cmd := exec.CommandContext(ctx, c.program.Path, c.args...)
	cleanup, err := c.setEnv(cmd)
	if err != nil {
		return err
	}
	defer cleanup()
	stderr := &tailBuffer{limit: StderrLimit}
	cmd.Stderr = stderr
	group := newProcessGroup(cmd, c.waitDelay())
	stdinPipe, stdoutPipe, err := c.pipes(cmd)
	if err != nil {
		return err
	}
	unlock := lockThread()
	defer unlock()
	err = cmd.Start()
	// The program has its own copies of the files it inherits.
	for _, f := range cmd.ExtraFiles {
		f.Close()
	}
	if err != nil {
		return fmt.Errorf("pgdump: start %s: %w", c.program.Path, err)
	}
	outDone := make(chan error, 1)
	go func() { outDone <- copyOut(c.stdout, stdoutPipe, cancel) }()
	inErr := copyIn(stdinPipe, c.stdin, cancel)
	outErr := <-outDone
	waitErr := cmd.Wait()
	group.sweep()
	return c.result(ctx, waitErr, inErr, outErr, stderr)
}

// setEnv gives cmd its environment, writing a password file when the
// connection has a password (see writePassfile), and returns the function
// that releases it once the program is gone.
func (c command) setEnv(cmd *exec.Cmd) (cleanup func(), err error) {
	cleanup = func() {}
	if c.conn == nil {
		cmd.Env = Conn{}.environ("")
		return cleanup, nil
	}
	pw := c.conn.Password
	if pw == "" || strings.ContainsAny(pw, "\r\n") {
		// A password file cannot hold a line break: such a password
		// travels in PGPASSWORD, still never in argv.
		cmd.Env = c.conn.environ("")
		if pw != "" {
			cmd.Env = append(cmd.Env, "PGPASSWORD="+pw)
		}
		return cleanup, nil
	}
	dir := c.exec.TempDir
	if dir == "" {
		dir = os.TempDir()
	}
	passfile, inherit, release, err := writePassfile(dir, pw)
	if err != nil {
		return nil, fmt.Errorf("pgdump: %s: %w", c.program.Name, err)
	}
	cmd.Env = c.conn.environ(passfile)
	if inherit != nil {
		cmd.ExtraFiles = []*os.File{inherit}
	}
	return release, nil
}

func (c command) waitDelay() time.Duration {
	if c.exec.WaitDelay > 0 {
		return c.exec.WaitDelay
	}
	return defaultWaitDelay
}

// pipes connects the program's standard input and output.
func (c command) pipes(cmd *exec.Cmd) (io.WriteCloser, io.ReadCloser, error) {
	var stdin io.WriteCloser
	if c.stdin != nil {
		var err error
		if stdin, err = cmd.StdinPipe(); err != nil {
			return nil, nil, fmt.Errorf("pgdump: %s: %w", c.program.Name, err)
		}
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, nil, fmt.Errorf("pgdump: %s: %w", c.program.Name, err)
	}
	return stdin, stdout, nil
}

// writeError marks an error of the caller's writer.
type writeError struct{ err error }

func (e *writeError) Error() string { return e.err.Error() }
func (e *writeError) Unwrap() error { return e.err }

// readError marks an error of the caller's reader.
type readError struct{ err error }

func (e *readError) Error() string { return e.err.Error() }
func (e *readError) Unwrap() error { return e.err }

// copyOut copies the program's output to w (or discards it). When w fails
// it stops the program, whose later writes then fail too.
func copyOut(w io.Writer, out io.Reader, stop context.CancelCauseFunc) error {
	if w == nil {
		w = io.Discard
	}
	buf := make([]byte, 256<<10)
	for {
		n, err := out.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				werr = &writeError{werr}
				stop(werr)
				io.Copy(io.Discard, out) // until the program is gone
				return werr
			}
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// copyIn copies r to the program's input and closes it. A program that
// exits before reading everything (pg_restore --list reads the table of
// contents only) is not an error here: its exit status says how it went.
func copyIn(in io.WriteCloser, r io.Reader, stop context.CancelCauseFunc) error {
	if in == nil {
		return nil
	}
	defer in.Close()
	buf := make([]byte, 256<<10)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			if _, werr := in.Write(buf[:n]); werr != nil {
				return nil
			}
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			// Stop the program rather than let it take a cut input for a
			// whole one.
			rerr := &readError{err}
			stop(rerr)
			return rerr
		}
	}
}

// result turns what happened into run's error. A program that finished
// cleanly before a stop could matter has succeeded.
func (c command) result(ctx context.Context, waitErr, inErr, outErr error, stderr *tailBuffer) error {
	cause := context.Cause(ctx)
	var we *writeError
	var re *readError
	switch {
	case errors.As(cause, &we):
		return fmt.Errorf("pgdump: %s: write output: %w", c.program.Name, we.err)
	case errors.As(cause, &re):
		return fmt.Errorf("pgdump: %s: read input: %w", c.program.Name, re.err)
	case waitErr == nil && inErr == nil && outErr == nil:
		return nil
	case cause != nil:
		return fmt.Errorf("pgdump: %s stopped: %w", c.program.Name, cause)
	}
	var exitErr *exec.ExitError
	switch {
	case errors.As(waitErr, &exitErr):
		return &ExitError{Args: c.argv(), ExitCode: exitErr.ExitCode(), Stderr: c.scrub(stderr.String())}
	case waitErr != nil:
		return fmt.Errorf("pgdump: %s: %w", c.program.Name, waitErr)
	case inErr != nil:
		return fmt.Errorf("pgdump: %s: read input: %w", c.program.Name, inErr)
	}
	return fmt.Errorf("pgdump: %s: read output: %w", c.program.Name, outErr)
}

func (c command) argv() []string {
	argv := append([]string{c.program.Path}, c.args...)
	for i := range argv {
		argv[i] = c.scrub(argv[i])
	}
	return argv
}

// scrub masks the password wherever it appears in s.
func (c command) scrub(s string) string {
	if c.conn == nil || c.conn.Password == "" {
		return s
	}
	return strings.ReplaceAll(s, c.conn.Password, "********")
}

// tailBuffer keeps the last limit bytes written to it.
type tailBuffer struct {
	limit int
	buf   []byte
	cut   bool
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	n := len(p)
	if len(p) >= t.limit {
		t.buf = append(t.buf[:0], p[len(p)-t.limit:]...)
		t.cut = true
		return n, nil
	}
	if over := len(t.buf) + len(p) - t.limit; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
		t.cut = true
	}
	t.buf = append(t.buf, p...)
	return n, nil
}

// String returns what was kept, starting at a line boundary when the
// beginning was dropped.
func (t *tailBuffer) String() string {
	s := string(t.buf)
	if t.cut {
		if i := strings.IndexByte(s, '\n'); i >= 0 {
			s = s[i+1:]
		}
		s = "[earlier output dropped]\n" + s
	}
	return s
}
