package siphontest_test

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/siphondb/siphon/canonical"
	"github.com/siphondb/siphon/siphontest"
)

// fatalTB is a testing.TB whose Fatalf records the message and ends the
// goroutine, as testing's does.
type fatalTB struct {
	testing.TB
	fatal string
}

func (f *fatalTB) Helper()             {}
func (f *fatalTB) Logf(string, ...any) {}
func (f *fatalTB) Fatalf(format string, args ...any) {
	f.fatal = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// recordingFails runs Recording with a fatalTB and returns what it failed
// with ("" when it did not).
func recordingFails(t *testing.T, path string, record func(io.Writer) error) string {
	tb := &fatalTB{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		siphontest.Recording(tb, path, record)
	}()
	<-done
	return tb.fatal
}

// recordOne records one hand-made transaction.
func recordOne(total string) func(io.Writer) error {
	return func(w io.Writer) error {
		rec := canonical.NewRecorder(w, 0x100)
		cols := []canonical.Column{{Name: "total", Type: "numeric"}}
		for _, ch := range []canonical.Change{
			{Op: canonical.OpBegin, XID: 7, Position: 0x200},
			{Op: canonical.OpInsert, XID: 7, Position: 0x200, Schema: "shop", Table: "orders", Columns: cols, New: canonical.Row{canonical.Text(total)}},
			{Op: canonical.OpCommit, XID: 7, Position: 0x230},
		} {
			if err := rec.Emit(ch); err != nil {
				return err
			}
		}
		return rec.Close()
	}
}

func TestRecordingRecordsOnlyWhenAsked(t *testing.T) {
	path := filepath.Join(t.TempDir(), "testdata", "orders.jsonl")
	t.Setenv(siphontest.EnvRecord, "")
	msg := recordingFails(t, path, func(io.Writer) error { panic("record runs only with SIPHON_RECORD") })
	assert.Contains(t, msg, "holds no recording yet: record it from a live server with SIPHON_RECORD=1 go test -run '^TestRecordingRecordsOnlyWhenAsked$'")

	t.Setenv(siphontest.EnvRecord, "1")
	first := siphontest.Recording(t, path, recordOne("10.50"))
	onDisk, err := os.ReadFile(path)
	require.NoError(t, err, "the directory is created")
	assert.Equal(t, onDisk, first)
	assert.Contains(t, string(first), `"new":["10.50"]`)

	t.Setenv(siphontest.EnvRecord, "")
	again := siphontest.Recording(t, path, func(io.Writer) error { panic("record runs only with SIPHON_RECORD") })
	assert.Equal(t, first, again, "the committed recording, with no server")

	t.Setenv(siphontest.EnvRecord, "1")
	assert.Equal(t, string(first), string(siphontest.Recording(t, path, recordOne("10.50"))), "recording again")
}

func TestRecordingKeepsTheOldFileWhenRecordingFails(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "orders.jsonl")
	t.Setenv(siphontest.EnvRecord, "1")
	old := siphontest.Recording(t, path, recordOne("10.50"))

	msg := recordingFails(t, path, func(io.Writer) error { return errors.New("no server") })
	assert.Equal(t, "siphontest: record "+path+": no server", msg)

	cut := func(w io.Writer) error { // a stream without its end record
		enc := canonical.NewEncoder(w)
		if err := enc.WriteHeader(canonical.Header{Kind: canonical.KindChanges}); err != nil {
			return err
		}
		return enc.Flush()
	}
	msg = recordingFails(t, path, cut)
	assert.Contains(t, msg, "what record wrote is not a complete stream: canonical: line 2: stream ends without an end record")

	data, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, old, data, "the old recording stays")
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	assert.Len(t, entries, 1, "no temporary file left behind")
}
