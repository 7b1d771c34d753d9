package canonical

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

var (
	testTime   = time.Date(2026, 11, 30, 5, 0, 0, 123456000, time.UTC)
	testHeader = Header{
		Kind:          KindChanges,
		Engine:        EnginePostgres,
		Start:         0x16B3748,
		End:           0x16B9000,
		SystemID:      "7301234567890123456",
		Timeline:      1,
		Slot:          "siphon",
		ServerVersion: "15.18",
		Created:       time.Date(2026, 11, 30, 5, 0, 0, 0, time.UTC),
		Checked:       true, // as the Decoder reads what an Encoder wrote
	}
)

// testTable returns a small table: id bigint (PK), body text, note text.
func testTable() *Table {
	return &Table{
		Schema: "public",
		Name:   "t",
		Columns: []Column{
			{Name: "id", Type: "bigint", TypeOID: 20},
			{Name: "body", Type: "text", TypeOID: 25, Nullable: true},
			{Name: "note", Type: "text", TypeOID: 25, Nullable: true},
		},
		PrimaryKey:      []string{"id"},
		IdentityKey:     []string{"id"},
		ReplicaIdentity: IdentityDefault,
	}
}

// encode runs write against a fresh Encoder after writing the header and
// returns the bytes written.
func encode(t testing.TB, h Header, write func(e *Encoder)) []byte {
	t.Helper()
	var buf bytes.Buffer
	e := NewEncoder(&buf)
	require.NoError(t, e.WriteHeader(h))
	write(e)
	require.NoError(t, e.Flush())
	return buf.Bytes()
}

// decodeAll reads a whole stream; err is the first error other than io.EOF.
func decodeAll(data []byte) (Header, []Record, error) {
	d := NewDecoder(bytes.NewReader(data))
	h, err := d.Header()
	if err != nil {
		return h, nil, err
	}
	var recs []Record
	for {
		r, err := d.Next()
		if errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
			return h, recs, nil
		}
		if err != nil {
			return h, recs, err
		}
		recs = append(recs, r)
	}
}

// lines joins JSONL lines, each followed by a newline.
func lines(ls ...string) []byte { return []byte(strings.Join(ls, "\n") + "\n") }

const (
	changesHeaderLine  = `{"t":"header","format":"siphon.jsonl","version":1,"kind":"changes","position":"0/1"}`
	snapshotHeaderLine = `{"t":"header","format":"siphon.jsonl","version":1,"kind":"snapshot","position":"0/1"}`
	tableLine          = `{"t":"table","schema":"public","name":"t","columns":[{"name":"id","type":"bigint","nullable":false},{"name":"body","type":"text","nullable":true}]}`
	beginLine          = `{"t":"begin","xid":7,"position":"0/10","commit_time":"2026-11-30T05:00:00Z"}`
	commitLine         = `{"t":"commit","xid":7,"position":"0/20","commit_time":"2026-11-30T05:00:00Z"}`
)
