package pgoutput

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/siphondb/siphon/canonical"
)

// frames joins messages into one fuzz input: each message is preceded by
// its length as a big-endian uint16, so one input drives a sequence of
// messages through one Decoder (relation cache and transaction state
// included).
func frames(msgs ...msg) []byte {
	var b []byte
	for _, m := range msgs {
		b = binary.BigEndian.AppendUint16(b, uint16(len(m)))
		b = append(b, m...)
	}
	return b
}

// seeds are valid message sequences, the starting points of FuzzDecode.
func seeds() map[string][]byte {
	return map[string][]byte{
		"transaction": frames(usersRel, beginMsg(0x100, t0, 7),
			insertMsg(16384, txt("1"), txt("Ann"), txt("1.50")),
			updateMsg(16384, 'K', []val{txt("1"), nil, nil}, txt("2"), unchanged, nil),
			deleteMsg(16384, 'K', txt("2"), nil, nil),
			commitMsg(0x100, 0x180, t0)),
		"full_identity": frames(
			relationMsg(5, "s", "full", 'f', col{key: true, name: "a", oid: 23, typmod: -1}, col{key: true, name: "b", oid: 25, typmod: -1}),
			beginMsg(100, t0, 9),
			updateMsg(5, 'O', []val{txt("1"), txt("x")}, txt("1"), txt("y")),
			deleteMsg(5, 'O', txt("1"), txt("y")),
			commitMsg(100, 200, t0)),
		"truncate_messages": frames(
			messageMsg(false, 0x50, "outside", []byte("hi")),
			typeMsg(90000, "public", "mood"),
			relationMsg(1, "", "pg_thing", 'n', col{name: "m", oid: 90000, typmod: -1}),
			beginMsg(300, t0, 3),
			originMsg(12, "upstream"),
			truncateMsg(3, 1),
			messageMsg(true, 0x60, "inside", []byte{0, 1, 2}),
			commitMsg(300, 360, t0)),
		"relation_change": frames(
			relationMsg(7, "public", "t", 'd', col{key: true, name: "id", oid: 23, typmod: -1}),
			beginMsg(100, t0, 1), insertMsg(7, txt("1")), commitMsg(100, 150, t0),
			relationMsg(7, "public", "t", 'd', col{key: true, name: "id", oid: 23, typmod: -1}, col{name: "note", oid: 25, typmod: -1}),
			beginMsg(200, t0, 2), insertMsg(7, txt("2"), txt("added")), commitMsg(200, 250, t0)),
	}
}

// FuzzDecode feeds arbitrary message sequences to a Decoder: it must never
// panic, every error must be a *DecodeError, and every change it returns
// must be well formed.
func FuzzDecode(f *testing.F) {
	for _, s := range seeds() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		d := NewDecoder(func(rel *Relation, _ map[uint32]TypeName) error {
			if len(rel.Columns) > 0 && rel.Columns[0].TypeOID == 0 {
				return errors.New("type 0")
			}
			return nil
		})
		for len(data) >= 2 {
			n := int(binary.BigEndian.Uint16(data))
			data = data[2:]
			if n > len(data) {
				n = len(data)
			}
			m := data[:n]
			data = data[n:]
			var ch canonical.Change
			ok, err := d.Decode(m, &ch)
			if err != nil {
				var de *DecodeError
				if !errors.As(err, &de) {
					t.Fatalf("error %v (%T) is not a *DecodeError", err, err)
				}
				if ok {
					t.Fatal("ok with an error")
				}
				continue
			}
			if ok {
				checkChange(t, &ch)
			}
		}
	})
}

func checkChange(t *testing.T, ch *canonical.Change) {
	t.Helper()
	switch ch.Op {
	case canonical.OpInsert, canonical.OpUpdate, canonical.OpDelete:
		if ch.New != nil && len(ch.New) != len(ch.Columns) || ch.Old != nil && len(ch.Old) != len(ch.Columns) {
			t.Fatalf("%v: %d new, %d old values for %d columns", ch.Op, len(ch.New), len(ch.Old), len(ch.Columns))
		}
		if (ch.Op == canonical.OpDelete) != (ch.New == nil) {
			t.Fatalf("%v: new row %v", ch.Op, ch.New)
		}
	case canonical.OpMessage:
		if ch.Message == nil {
			t.Fatal("message change without a message")
		}
	case canonical.OpBegin, canonical.OpCommit, canonical.OpTruncate:
	default:
		t.Fatalf("unexpected op %v", ch.Op)
	}
}

// TestWriteFuzzSeeds rewrites testdata/fuzz/FuzzDecode from seeds() when
// SIPHON_WRITE_FUZZ_SEEDS is set, and otherwise checks the files are there.
func TestWriteFuzzSeeds(t *testing.T) {
	dir := filepath.Join("testdata", "fuzz", "FuzzDecode")
	for name, s := range seeds() {
		path := filepath.Join(dir, name)
		content := fmt.Appendf(nil, "go test fuzz v1\n[]byte(%q)\n", s)
		if os.Getenv("SIPHON_WRITE_FUZZ_SEEDS") != "" {
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, content, 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		got, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("seed corpus file missing (run with SIPHON_WRITE_FUZZ_SEEDS=1): %v", err)
		}
		if !bytes.Equal(got, content) {
			t.Errorf("seed %s is stale: run with SIPHON_WRITE_FUZZ_SEEDS=1", name)
		}
	}
}
