package siphontest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// serverBinaries locates initdb and postgres of one PostgreSQL installation.
type serverBinaries struct {
	initdb, postgres string
}

// findServerBinaries returns the initdb and postgres of dir when dir is
// set; otherwise it looks for initdb on PATH, then under
// /usr/lib/postgresql/*/bin, newest version first.
func findServerBinaries(dir string) (serverBinaries, error) {
	if dir != "" {
		bin := serverBinaries{initdb: filepath.Join(dir, "initdb"), postgres: filepath.Join(dir, "postgres")}
		if !isExecutable(bin.initdb) || !isExecutable(bin.postgres) {
			return serverBinaries{}, fmt.Errorf("siphontest: no executable initdb and postgres in %s (WithServerBin or %s): "+
				"name the bin directory of a PostgreSQL installation", dir, EnvServerBin)
		}
		return bin, nil
	}
	if initdb, err := exec.LookPath("initdb"); err == nil {
		postgres := filepath.Join(filepath.Dir(initdb), "postgres")
		if _, err := os.Stat(postgres); err != nil {
			if postgres, err = exec.LookPath("postgres"); err != nil {
				return serverBinaries{}, fmt.Errorf("initdb found at %s but no postgres binary", initdb)
			}
		}
		return serverBinaries{initdb: initdb, postgres: postgres}, nil
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return versionOf(dirs[i]) > versionOf(dirs[j]) })
	for _, dir := range dirs {
		bin := serverBinaries{initdb: filepath.Join(dir, "initdb"), postgres: filepath.Join(dir, "postgres")}
		if isExecutable(bin.initdb) && isExecutable(bin.postgres) {
			return bin, nil
		}
	}
	return serverBinaries{}, errors.New("no initdb/postgres on PATH or under /usr/lib/postgresql/*/bin")
}

// addReleaseSettings adds to settings, unless a test set them, the
// defaults that only some releases know (an unknown setting stops the
// server): from PostgreSQL 18 on, replication origins in use have a limit
// of their own, max_active_replication_origins (10 by default; before 18,
// max_replication_slots bounds them), which siphontest raises to 64 as it
// raises max_replication_slots.
func addReleaseSettings(data string, settings map[string]string) error {
	text, err := os.ReadFile(filepath.Join(data, "PG_VERSION"))
	if err != nil {
		return fmt.Errorf("siphontest: the release of the new cluster: %w", err)
	}
	major, err := strconv.Atoi(strings.TrimSpace(string(text)))
	if err != nil {
		return fmt.Errorf("siphontest: the release of the new cluster: PG_VERSION holds %q", text)
	}
	if _, set := settings["max_active_replication_origins"]; major >= 18 && !set {
		settings["max_active_replication_origins"] = "64"
	}
	return nil
}

func versionOf(binDir string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return v
}

func isExecutable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0
}

// launchLocal runs initdb and postgres in a fresh temporary directory. A
// reaper process (a few lines of sh) holds the read end of a pipe whose write
// end only this process has: when this process exits, however it exits, the
// reaper sees end-of-file, stops the server and removes the directory.
func launchLocal(ctx context.Context, bin serverBinaries, cfg config) (srv *Server, err error) {
	dir, err := os.MkdirTemp("", "siphontest-")
	if err != nil {
		return nil, fmt.Errorf("siphontest: %w", err)
	}
	reaper, err := startReaper(dir)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	defer func() {
		if err != nil {
			reaper.stop()
		}
	}()
	cred, err := serverCredential(dir)
	if err != nil {
		return nil, err
	}
	data := filepath.Join(dir, "data")
	initdb := exec.CommandContext(ctx, bin.initdb, "-D", data, "-U", "postgres", "-A", "trust",
		"-E", "UTF8", "--locale=C", "--no-sync", "--no-instructions")
	initdb.Dir = dir
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Setpgid: true}
	if out, err := initdb.CombinedOutput(); err != nil {
		if cred != nil && errors.Is(err, fs.ErrPermission) {
			return nil, fmt.Errorf("siphontest: initdb: %w: the server runs as uid %d, which must be able to read and execute "+
				"%s, every directory above it and the libraries beside it (chmod -R a+rX)", err, cred.Uid, filepath.Dir(bin.initdb))
		}
		return nil, fmt.Errorf("siphontest: initdb: %w: %s", err, lastLines(out, 20))
	}
	if err := os.WriteFile(filepath.Join(data, "pg_hba.conf"), []byte(hbaConf), 0o600); err != nil {
		return nil, fmt.Errorf("siphontest: %w", err)
	}
	if err := addReleaseSettings(data, cfg.settings); err != nil {
		return nil, err
	}
	var certFile string
	if cfg.tls {
		var keyFile string
		if certFile, keyFile, err = writeCertificate(dir, cred); err != nil {
			return nil, err
		}
		cfg.settings["ssl"] = "on"
		cfg.settings["ssl_cert_file"] = certFile
		cfg.settings["ssl_key_file"] = keyFile
	}

	for attempt := 0; ; attempt++ {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		l := &localServer{bin: bin, cfg: cfg, dir: dir, data: data, port: port, cred: cred, reaper: reaper}
		err = l.start(ctx)
		if err == nil {
			return &Server{dsn: l.dsn(), source: "local", stop: l.close, restart: l.restart, certFile: certFile}, nil
		}
		if attempt == 2 || ctx.Err() != nil {
			return nil, err
		}
	}
}

// localServer is a postgres that siphontest runs from local binaries:
// what it takes to start it (again) and its running postmaster.
type localServer struct {
	bin    serverBinaries
	cfg    config
	dir    string // the server's own directory: data, sockets, logs
	data   string
	port   int
	cred   *syscall.Credential
	reaper *reaper

	mu     sync.Mutex
	pid    int        // the running postmaster, 0 when none
	exited chan error // delivers the running postmaster's Wait result
	closed bool
}

func (l *localServer) dsn() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", l.port)
}

// start starts the postmaster, has the reaper watch it, and waits until it
// is ready. On failure nothing is left running.
func (l *localServer) start(ctx context.Context) error {
	logPath := filepath.Join(l.dir, fmt.Sprintf("postgres-%d.log", l.port))
	// Appended to: a restarted server's log follows the previous run's.
	logFile, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("siphontest: %w", err)
	}
	defer logFile.Close()
	args := []string{"-D", l.data, "-p", strconv.Itoa(l.port), "-k", l.dir}
	for _, setting := range l.cfg.sortedSettings() {
		args = append(args, "-c", setting)
	}
	cmd := exec.Command(l.bin.postgres, args...)
	cmd.Dir = l.dir
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: l.cred, Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("siphontest: start postgres: %w", err)
	}
	if err := l.reaper.watch(cmd.Process.Pid); err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		return err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	exitErr := func() error {
		select {
		case err := <-exited:
			exited <- err
			log, _ := os.ReadFile(logPath)
			return fmt.Errorf("postgres exited (%v): %s", err, lastLines(log, 20))
		default:
			return nil
		}
	}
	if err := waitReady(ctx, l.dsn(), l.cfg.settings["wal_level"], exitErr); err != nil {
		l.reaper.unwatch(cmd.Process.Pid, exited)
		return fmt.Errorf("siphontest: %w", err)
	}
	l.pid, l.exited = cmd.Process.Pid, exited
	return nil
}

// restart stops the postmaster with a fast shutdown (SIGINT), as pg_ctl
// restart -m fast does, and starts it again on the same port.
func (l *localServer) restart(ctx context.Context) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return errors.New("siphontest: restart: the server is closed")
	}
	if l.pid != 0 {
		if err := syscall.Kill(l.pid, syscall.SIGINT); err != nil {
			return fmt.Errorf("siphontest: restart: fast shutdown: %w", err)
		}
		select {
		case <-l.exited:
		case <-ctx.Done():
			return fmt.Errorf("siphontest: restart: waiting for the fast shutdown: %w", ctx.Err())
		}
		if err := l.reaper.forget(l.pid); err != nil {
			return err
		}
		l.pid, l.exited = 0, nil
	}
	if err := l.start(ctx); err != nil {
		return fmt.Errorf("siphontest: restart on port %d: %w", l.port, err)
	}
	return nil
}

// close has the reaper stop the server and remove its directory.
func (l *localServer) close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed = true
	if l.exited == nil { // a failed restart left nothing running
		l.reaper.stop()
		return nil
	}
	return l.reaper.stopAndWait(l.exited)
}

// serverCredential returns the unprivileged user to run the server as when
// this process is root (PostgreSQL refuses root), and hands dir to it.
func serverCredential(dir string) (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	var uid, gid int
	found := false
	for _, name := range []string{"postgres", "nobody"} {
		u, err := user.Lookup(name)
		if err != nil {
			continue
		}
		uid, _ = strconv.Atoi(u.Uid)
		gid, _ = strconv.Atoi(u.Gid)
		found = true
		break
	}
	if !found {
		return nil, errors.New("siphontest: running as root and no unprivileged user (postgres or nobody) to run the server as")
	}
	if err := os.Chown(dir, uid, gid); err != nil {
		return nil, fmt.Errorf("siphontest: %w", err)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("siphontest: find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func lastLines(b []byte, n int) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.TrimSpace([]byte(strings.Join(lines, "\n"))))
}

// hbaConf lets the superuser in without a password and makes every other
// role authenticate, so tests can check how passwords are handled.
const hbaConf = `local all all trust
host all postgres 127.0.0.1/32 trust
host replication postgres 127.0.0.1/32 trust
host all all 127.0.0.1/32 scram-sha-256
host replication all 127.0.0.1/32 scram-sha-256
`

// stopTimeout bounds a server's fast shutdown before the reaper kills it.
const stopTimeout = 10 * time.Second
