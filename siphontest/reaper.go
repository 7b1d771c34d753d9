package siphontest

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"time"
)

// reaperScript waits for end-of-file on its standard input (this process is
// gone, or Close was called), then stops every server process whose pid it
// was given (immediate shutdown: the data is throwaway; then SIGKILL to the process group after
// stopTimeout) and removes the directory. Lines "+pid" and "-pid" add and
// remove a pid to watch.
const reaperScript = `dir="$1"; limit="$2"; pids=""
while read -r line; do
  case "$line" in
    +*) pids="$pids ${line#+}" ;;
    -*) p="${line#-}"; pids=$(echo "$pids" | tr ' ' '\n' | grep -vx "$p" | tr '\n' ' ') ;;
  esac
done
for p in $pids; do kill -QUIT "$p" 2>/dev/null; done
i=0
for p in $pids; do
  while kill -0 "$p" 2>/dev/null; do
    i=$((i+1))
    if [ "$i" -ge "$limit" ]; then kill -KILL -- "-$p" 2>/dev/null; kill -KILL "$p" 2>/dev/null; break; fi
    sleep 0.1
  done
done
rm -rf "$dir"
`

// reaper is the handle on the reaper process.
type reaper struct {
	cmd  *exec.Cmd
	pipe *os.File
}

func startReaper(dir string) (*reaper, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("siphontest: %w", err)
	}
	limit := strconv.Itoa(int(stopTimeout / (100 * time.Millisecond)))
	cmd := exec.Command("/bin/sh", "-c", reaperScript, "siphontest-reaper", dir, limit)
	cmd.Stdin = r
	// Its own process group: a Ctrl-C aimed at go test must not kill the
	// reaper before it has cleaned up.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		r.Close()
		w.Close()
		return nil, fmt.Errorf("siphontest: start reaper: %w", err)
	}
	r.Close()
	return &reaper{cmd: cmd, pipe: w}, nil
}

func (r *reaper) watch(pid int) error {
	if _, err := fmt.Fprintf(r.pipe, "+%d\n", pid); err != nil {
		return fmt.Errorf("siphontest: reaper: %w", err)
	}
	return nil
}

// forget stops watching pid, a server process that has exited and been
// waited for: its pid may be reused by another process, which the reaper
// must not signal.
func (r *reaper) forget(pid int) error {
	if _, err := fmt.Fprintf(r.pipe, "-%d\n", pid); err != nil {
		return fmt.Errorf("siphontest: reaper: %w", err)
	}
	return nil
}

// unwatch stops a server that failed to become ready and forgets it.
func (r *reaper) unwatch(pid int, exited chan error) {
	syscall.Kill(-pid, syscall.SIGKILL)
	<-exited
	r.forget(pid)
}

// stopAndWait closes the pipe so the reaper stops the server, reaps the
// server process (exited delivers its Wait result) and waits for the reaper
// to remove the directory.
func (r *reaper) stopAndWait(exited chan error) error {
	r.pipe.Close()
	<-exited
	if err := r.cmd.Wait(); err != nil {
		return fmt.Errorf("siphontest: reaper: %w", err)
	}
	return nil
}

// stop ends a reaper that watches no running server.
func (r *reaper) stop() {
	r.pipe.Close()
	r.cmd.Wait()
}
