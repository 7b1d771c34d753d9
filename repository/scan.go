package repository

// What the manifest says of an incremental is read off its JSONL as it is
// uploaded: the header, the tables, the transactions' commit times and
// the schema changes. Only those lines are parsed; the others (rows,
// changes) are skipped at the speed of a newline search.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"time"

	"github.com/siphondb/siphon/canonical"
)

// maxScannedLine bounds the lines the scanner parses; a longer table
// record (thousands of columns) is left out of the manifest's tables.
const maxScannedLine = 8 << 20

// jsonlHeader is what the scanner reads of a JSONL header.
type jsonlHeader struct {
	Kind          canonical.Kind     `json:"kind"`
	Start         canonical.Position `json:"position"`
	SystemID      string             `json:"system_id"`
	Timeline      uint32             `json:"timeline"`
	Slot          string             `json:"slot"`
	ServerVersion string             `json:"server_version"`
	Created       time.Time          `json:"created"`
	Previous      string             `json:"previous"`
	KeyID         string             `json:"key"`
}

// jsonlScanner watches a JSONL stream go by.
type jsonlScanner struct {
	// checkHeader, when set, vets the header as soon as it is read; its
	// error stops the stream.
	checkHeader func(jsonlHeader) error

	header    *jsonlHeader
	tables    []canonical.TableName
	seen      map[canonical.TableName]bool
	tx, ddl   int64
	first     time.Time
	last      time.Time
	line      []byte
	lineStart bool // at the start of a line
	keep      bool // the line is one the scanner parses
	decided   bool // keep is decided for the line
	err       error
}

func newJSONLScanner(check func(jsonlHeader) error) *jsonlScanner {
	return &jsonlScanner{checkHeader: check, seen: map[canonical.TableName]bool{}, lineStart: true}
}

var scannedPrefixes = [][]byte{[]byte(`{"t":"header"`), []byte(`{"t":"table"`), []byte(`{"t":"commit"`), []byte(`{"t":"ddl"`)}

const decidePrefix = 14 // len(`{"t":"header"`) and then some

// Write takes the next bytes of the stream.
func (s *jsonlScanner) Write(p []byte) (int, error) {
	if s.err != nil {
		return 0, s.err
	}
	n := len(p)
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		part := p
		if i >= 0 {
			part = p[:i]
		}
		s.take(part)
		if i < 0 {
			break
		}
		if err := s.endLine(); err != nil {
			s.err = err
			return 0, err
		}
		p = p[i+1:]
	}
	return n, nil
}

// take adds part of the current line.
func (s *jsonlScanner) take(part []byte) {
	if s.decided && !s.keep {
		return
	}
	if !s.decided {
		s.line = append(s.line, part...)
		if len(s.line) < decidePrefix {
			return
		}
		s.decide()
		if !s.keep {
			s.line = s.line[:0]
		}
		return
	}
	if len(s.line)+len(part) > maxScannedLine {
		s.keep, s.line = false, s.line[:0]
		return
	}
	s.line = append(s.line, part...)
}

func (s *jsonlScanner) decide() {
	s.decided = true
	for _, pre := range scannedPrefixes {
		if bytes.HasPrefix(s.line, pre) {
			s.keep = true
			return
		}
	}
}

// endLine parses the line just ended, if it is one the scanner keeps.
func (s *jsonlScanner) endLine() error {
	if !s.decided {
		s.decide()
	}
	line := s.line
	keep := s.keep
	s.line, s.decided, s.keep = s.line[:0], false, false
	if !keep {
		return nil
	}
	var rec struct {
		T          string    `json:"t"`
		Schema     string    `json:"schema"`
		Name       string    `json:"name"`
		CommitTime time.Time `json:"commit_time"`
	}
	switch {
	case bytes.HasPrefix(line, scannedPrefixes[0]):
		if s.header != nil {
			return nil
		}
		var h jsonlHeader
		if err := json.Unmarshal(line, &h); err != nil {
			return fmt.Errorf("the stream's header does not decode: %w", err)
		}
		s.header = &h
		if s.checkHeader != nil {
			return s.checkHeader(h)
		}
	case bytes.HasPrefix(line, scannedPrefixes[3]):
		s.ddl++
	default:
		if err := json.Unmarshal(line, &rec); err != nil {
			return nil // the decoder, not the scanner, judges records
		}
		if rec.T == "table" {
			t := canonical.TableName{Schema: rec.Schema, Name: rec.Name}
			if !s.seen[t] {
				s.seen[t] = true
				s.tables = append(s.tables, t)
			}
			return nil
		}
		s.tx++
		if s.first.IsZero() {
			s.first = rec.CommitTime
		}
		s.last = rec.CommitTime
	}
	return nil
}

// tapWriter writes to the scanner, then to the object.
type tapWriter struct {
	scan *jsonlScanner
	obj  *objectWriter
}

func (t tapWriter) Write(p []byte) (int, error) {
	if _, err := t.scan.Write(p); err != nil {
		return 0, err
	}
	return t.obj.Write(p)
}
