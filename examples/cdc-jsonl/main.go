// Command cdc-jsonl embeds change capture in a service: it streams a
// database's committed changes into JSONL files rotated by size, and resumes
// exactly where it stopped after a restart (the files themselves hold the
// resume Position). SIGINT or SIGTERM stops it gracefully.
//
//	go run ./examples/cdc-jsonl                      # demo on an embedded PostgreSQL
//	SIPHON_DSN=postgres://... go run ./examples/cdc-jsonl -dir ./changes -duration 0
//
// With SIPHON_DSN unset it starts an embedded throwaway PostgreSQL, writes a
// small workload, and shows a restart in the middle: the first run is
// stopped, the second resumes, and every row arrives exactly once.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/siphondb/siphon"
	"github.com/siphondb/siphon/canonical"
)

type config struct {
	dir      string
	maxBytes int64
	slot     string
	duration time.Duration
}

func main() {
	var cfg config
	flag.StringVar(&cfg.dir, "dir", "", "directory for the JSONL files (default: a new temporary directory)")
	flag.Int64Var(&cfg.maxBytes, "max-bytes", 64<<10, "start a new file once the current one passes this size")
	flag.StringVar(&cfg.slot, "slot", "cdc_jsonl", "replication slot name")
	flag.DurationVar(&cfg.duration, "duration", 0, "with SIPHON_DSN: stop after this long (0: run until SIGINT/SIGTERM)")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	if dsn := os.Getenv("SIPHON_DSN"); dsn != "" {
		err = capture(ctx, dsn, cfg, os.Stdout)
	} else {
		// The demo takes seconds; this bounds it on a slow machine. Its
		// test calls demo without it: the test binary's timeout bounds a
		// hang there, and a busy machine is no hang.
		demoCtx, cancel := context.WithTimeout(ctx, time.Minute)
		err = demo(demoCtx, cfg, os.Stdout)
		cancel()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "cdc-jsonl:", err)
		os.Exit(1)
	}
}

// capture streams dsn's changes into cfg.dir until ctx ends (or
// cfg.duration passes), resuming from the files already there.
func capture(ctx context.Context, dsn string, cfg config, out io.Writer) error {
	if cfg.duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, cfg.duration)
		defer cancel()
	}
	return runOnce(ctx, dsn, cfg, out, nil)
}

// runOnce is one life of the service: open the sink, stream until ctx ends,
// close the sink. stopWhen, if set, is asked after each change whether to
// stop.
func runOnce(ctx context.Context, dsn string, cfg config, out io.Writer, stopWhen func(canonical.Change) bool) error {
	s, err := openSink(cfg.dir, cfg.maxBytes, cfg.slot)
	if err != nil {
		return err
	}
	c, err := siphon.Connect(ctx, dsn, siphon.WithSlot(cfg.slot))
	if err != nil {
		return err
	}
	defer c.Close()
	from := s.last
	fmt.Fprintf(out, "streaming from %v into %s\n", from, cfg.dir)

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	acked, err := c.StreamChanges(ctx, from, func(ch canonical.Change) error {
		if err := s.emit(ch); err != nil {
			return err
		}
		if stopWhen != nil && stopWhen(ch) {
			cancel()
		}
		return nil
	})
	if cerr := s.close(); err == nil {
		err = cerr
	}
	if err != nil {
		var gap *siphon.ResumeGapError
		if errors.As(err, &gap) {
			return fmt.Errorf("%w (the files end at %v: start a new directory from a fresh snapshot)", err, s.last)
		}
		return err
	}
	fmt.Fprintf(out, "stopped: %d transactions written, files end at %v, slot acknowledged %v\n", s.txns, s.last, acked)
	return nil
}
