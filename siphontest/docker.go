package siphontest

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os/exec"
	"strings"
	"syscall"
)

// dockerImage is the image used when the server comes from a Docker engine.
const dockerImage = "postgres:16-alpine"

// launchDocker starts a PostgreSQL container through the docker command
// when it reaches a Docker engine: a published port on 127.0.0.1 only, the
// settings as -c flags, and a reaper (a shell waiting on a pipe only this
// process holds) that removes the container when this process ends,
// however it ends. It goes through the docker command rather than a
// library so that importers of siphon carry no container dependencies.
func launchDocker(ctx context.Context, cfg config) (*Server, error) {
	if _, err := exec.LookPath("docker"); err != nil {
		return nil, fmt.Errorf("no docker command: %w", err)
	}
	if out, err := docker(ctx, "version", "--format", "{{.Server.Version}}"); err != nil {
		return nil, fmt.Errorf("no Docker engine: %v: %s", err, lastLines(out, 3))
	}
	args := []string{"run", "--detach", "--rm", "--publish", "127.0.0.1::5432",
		"--env", "POSTGRES_PASSWORD=postgres", "--env", "POSTGRES_HOST_AUTH_METHOD=trust",
		dockerImage, "postgres"}
	for _, setting := range cfg.sortedSettings() {
		if !strings.HasPrefix(setting, "listen_addresses=") {
			args = append(args, "-c", setting)
		}
	}
	out, err := docker(ctx, args...)
	if err != nil {
		return nil, fmt.Errorf("start a postgres container: %v: %s", err, lastLines(out, 5))
	}
	id := strings.TrimSpace(string(out))
	remove := func() error {
		_, err := docker(context.Background(), "rm", "--force", id)
		return err
	}
	reaper, err := startContainerReaper(id)
	if err != nil {
		remove()
		return nil, err
	}
	stop := func() error {
		err := remove()
		reaper.stop()
		return err
	}
	out, err = docker(ctx, "port", id, "5432/tcp")
	if err != nil {
		stop()
		return nil, fmt.Errorf("postgres container %s: its port: %v: %s", id, err, lastLines(out, 3))
	}
	addr, err := publishedAddress(string(out))
	if err != nil {
		stop()
		return nil, fmt.Errorf("postgres container %s: %w", id, err)
	}
	dsn := "postgres://postgres:postgres@" + addr + "/postgres?sslmode=disable"
	exited := func() error {
		out, err := docker(context.Background(), "inspect", "--format", "{{.State.Running}}", id)
		if err != nil || strings.TrimSpace(string(out)) != "true" {
			return fmt.Errorf("postgres container %s stopped: %s", id, lastLines(out, 3))
		}
		return nil
	}
	if err := waitReady(ctx, dsn, cfg.settings["wal_level"], exited); err != nil {
		stop()
		return nil, fmt.Errorf("postgres container %s: %w", id, err)
	}
	return &Server{dsn: dsn, source: "docker", stop: stop}, nil
}

// docker runs the docker command with args and returns its combined
// output.
func docker(ctx context.Context, args ...string) ([]byte, error) {
	return exec.CommandContext(ctx, "docker", args...).CombinedOutput()
}

// publishedAddress reads `docker port`'s output ("127.0.0.1:49153", one
// line per address) and returns the IPv4 loopback address.
func publishedAddress(out string) (string, error) {
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		host, port, err := net.SplitHostPort(strings.TrimSpace(line))
		if err == nil && host == "127.0.0.1" && port != "" {
			return net.JoinHostPort(host, port), nil
		}
	}
	return "", fmt.Errorf("no port published on 127.0.0.1 in %q", out)
}

// containerReaper removes a container once its pipe closes.
type containerReaper struct {
	cmd  *exec.Cmd
	pipe interface{ Close() error }
}

// containerReaperScript removes the container $1 once standard input ends.
const containerReaperScript = `cat >/dev/null; docker rm --force "$1" >/dev/null 2>&1`

func startContainerReaper(id string) (*containerReaper, error) {
	cmd := exec.Command("/bin/sh", "-c", containerReaperScript, "siphontest-container-reaper", id)
	w, err := cmd.StdinPipe()
	if err != nil {
		return nil, fmt.Errorf("siphontest: %w", err)
	}
	cmd.Stdout, cmd.Stderr = &bytes.Buffer{}, &bytes.Buffer{}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // a Ctrl-C to go test must not kill it first
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("siphontest: start the container reaper: %w", err)
	}
	return &containerReaper{cmd: cmd, pipe: w}, nil
}

// stop ends the reaper (which then removes the container, again: harmless)
// and waits for it.
func (r *containerReaper) stop() {
	r.pipe.Close()
	r.cmd.Wait()
}
