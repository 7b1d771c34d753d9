package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"time"

	"github.com/siphondb/siphon/canonical"
)

// sink writes a change stream to JSONL files in a directory, starting a new
// file once the current one passes maxBytes. The files are the durable
// state: the resume Position is the last transaction they hold, so data and
// position can never disagree. A file cut by a crash is repaired on open:
// its last, incomplete transaction is dropped (the stream delivers it again).
type sink struct {
	dir      string
	maxBytes int64
	slot     string

	file  *os.File
	count *countingWriter
	enc   *canonical.Encoder
	seq   int
	inTxn bool
	// last is the end Position of the last transaction written: where to
	// resume from.
	last canonical.Position
	txns int
}

// openSink opens dir (creating it), repairs an unfinished last file, and
// returns the sink with the Position to resume from (zero for a new dir).
func openSink(dir string, maxBytes int64, slot string) (*sink, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	s := &sink{dir: dir, maxBytes: maxBytes, slot: slot}
	files, err := s.files()
	if err != nil || len(files) == 0 {
		return s, err
	}
	last := files[len(files)-1]
	fmt.Sscanf(filepath.Base(last), "changes-%06d.jsonl", &s.seq)
	s.last, err = finishFile(last)
	return s, err
}

// files lists the sink's files in order.
func (s *sink) files() ([]string, error) {
	files, err := filepath.Glob(filepath.Join(s.dir, "changes-*.jsonl"))
	sort.Strings(files)
	return files, err
}

// emit is the StreamChanges callback. It returns only once the change is
// written to the operating system (a process crash loses nothing that was
// acknowledged); files are synced to disk when they are finished.
func (s *sink) emit(ch canonical.Change) error {
	if s.file == nil {
		if err := s.open(); err != nil {
			return err
		}
	}
	if err := s.enc.WriteChange(&ch); err != nil {
		return err
	}
	switch ch.Op {
	case canonical.OpBegin:
		s.inTxn = true
	case canonical.OpCommit:
		s.inTxn = false
		s.last = ch.Position
		s.txns++
		if err := s.enc.Flush(); err != nil {
			return err
		}
		if s.count.n >= s.maxBytes {
			return s.finish()
		}
	}
	return nil
}

// open starts the next file.
func (s *sink) open() error {
	s.seq++
	f, err := os.OpenFile(filepath.Join(s.dir, fmt.Sprintf("changes-%06d.jsonl", s.seq)), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	s.file, s.count = f, &countingWriter{w: f}
	s.enc = canonical.NewEncoder(s.count)
	return s.enc.WriteHeader(canonical.Header{Kind: canonical.KindChanges, Engine: canonical.EnginePostgres,
		Start: s.last, Slot: s.slot, Created: time.Now().UTC()})
}

// finish ends the current file with its end record and syncs it.
func (s *sink) finish() error {
	err := s.enc.WriteEnd(s.last)
	if err == nil {
		err = s.file.Sync()
	}
	if cerr := s.file.Close(); err == nil {
		err = cerr
	}
	s.file = nil
	return err
}

// close stops the sink: a file stopped between transactions is finished; one
// stopped inside a transaction is left for openSink to repair.
func (s *sink) close() error {
	if s.file == nil {
		return nil
	}
	if !s.inTxn {
		return s.finish()
	}
	err := s.enc.Flush()
	s.file.Sync()
	if cerr := s.file.Close(); err == nil {
		err = cerr
	}
	s.file = nil
	return err
}

// finishFile returns the end Position of a finished file; an unfinished one
// is rewritten with its complete transactions and an end record.
func finishFile(path string) (canonical.Position, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	dec := canonical.NewDecoder(f)
	h, err := dec.Header()
	if err != nil {
		return 0, fmt.Errorf("%s: %w", path, err)
	}
	var kept []canonical.Record // the records of complete transactions
	var pending []canonical.Record
	last := h.Start
	for {
		rec, err := dec.Next()
		if err == nil && rec.Type == canonical.RecordEnd {
			return rec.Position, nil // a finished file
		}
		if errors.Is(err, canonical.ErrTruncated) {
			break // cut by a crash: keep what is complete
		}
		if err != nil {
			// Not a cut but damage or a read error: dropping the rest
			// would lose transactions already acknowledged.
			return 0, fmt.Errorf("%s: %w", path, err)
		}
		pending = append(pending, rec)
		if rec.Type == canonical.RecordChange && rec.Change.Op == canonical.OpCommit {
			kept, pending, last = append(kept, pending...), nil, rec.Change.Position
		}
	}
	return last, rewrite(path, h, kept, last)
}

// rewrite replaces path with the header, records and an end record.
func rewrite(path string, h canonical.Header, records []canonical.Record, end canonical.Position) error {
	tmp := path + ".repair"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	defer os.Remove(tmp)
	enc := canonical.NewEncoder(f)
	err = enc.WriteHeader(h)
	for _, rec := range records {
		if err == nil && rec.Type != canonical.RecordTable { // the encoder writes table records itself
			err = enc.WriteRecord(rec)
		}
	}
	if err == nil {
		err = enc.WriteEnd(end)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("repair %s: %w", path, err)
	}
	return os.Rename(tmp, path)
}

// countingWriter counts the bytes written through it.
type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}
