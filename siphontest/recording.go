package siphontest

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/siphondb/siphon/canonical"
)

// EnvRecord names the environment variable that makes [Recording] record
// its streams again from a live server. Any non-empty value does.
const EnvRecord = "SIPHON_RECORD"

// Recording returns the recorded stream in the file at path, a golden file
// committed with the tests (under testdata), for the test to replay into
// its handler with [canonical.Replay], with no server:
//
//	func TestRevenueFromRecording(t *testing.T) {
//		stream := siphontest.Recording(t, "testdata/orders.jsonl", func(w io.Writer) error {
//			dsn := siphontest.Start(t).NewDatabase(t)
//			return recordWorkload(ctx, dsn, w) // StreamChanges through a canonical.Recorder
//		})
//		revenue := NewRevenue()
//		_, err := canonical.Replay(ctx, bytes.NewReader(stream), 0, revenue.Handle)
//		...
//	}
//
// record runs only when the environment variable SIPHON_RECORD is set
// (SIPHON_RECORD=1 go test -run TestRevenueFromRecording ./...): it writes
// the stream to w, from a live server ([Start] gives one), with a
// [canonical.Recorder] or BackupIncremental. Recording checks what it
// wrote by reading it to its end with a [canonical.Decoder], and only then
// replaces the file (creating its directory), so a failed recording leaves
// the old one in place. Without SIPHON_RECORD, a missing file fails the
// test with the command that records it; record is not called, and no
// server is needed.
func Recording(tb testing.TB, path string, record func(w io.Writer) error) []byte {
	tb.Helper()
	if os.Getenv(EnvRecord) != "" {
		if err := rerecord(path, record); err != nil {
			tb.Fatalf("siphontest: record %s: %v", path, err)
		}
		tb.Logf("siphontest: recorded %s", path)
	}
	data, err := os.ReadFile(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		tb.Fatalf("siphontest: %s holds no recording yet: record it from a live server with %s=1 go test -run '^%s$'", path, EnvRecord, tb.Name())
	case err != nil:
		tb.Fatalf("siphontest: %v", err)
	}
	return data
}

// rerecord writes a new recording next to path, checks it, and renames it
// over path.
func rerecord(path string, record func(w io.Writer) error) (err error) {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, filepath.Base(path)+".*.tmp")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	if err := record(f); err != nil {
		return err
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return err
	}
	if err := check(f); err != nil {
		return fmt.Errorf("what record wrote is not a complete stream: %w", err)
	}
	if err := f.Chmod(0o644); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}

// check reads a stream to its end.
func check(r io.Reader) error {
	dec := canonical.NewDecoder(r)
	for {
		if _, err := dec.Next(); err == io.EOF {
			return nil
		} else if err != nil {
			return err
		}
	}
}
