package repository

import (
	"bytes"
	"crypto/rand"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/siphondb/siphon/canonical"
)

func testKeys(t *testing.T, n int) [][]byte {
	var keys [][]byte
	for range n {
		k := make([]byte, 32)
		_, err := rand.Read(k)
		require.NoError(t, err)
		keys = append(keys, k)
	}
	return keys
}

func seal(t *testing.T, kr *keyring, name string, plain []byte, writes int) []byte {
	t.Helper()
	var out bytes.Buffer
	sw, err := newSealWriter(&out, kr.current(), roleObject, name)
	require.NoError(t, err)
	step := max(1, len(plain)/max(1, writes))
	for p := plain; len(p) > 0; {
		k := min(step, len(p))
		n, err := sw.Write(p[:k])
		require.NoError(t, err)
		require.Equal(t, k, n)
		p = p[k:]
	}
	require.NoError(t, sw.Close())
	return out.Bytes()
}

func TestSealOpenRoundTrip(t *testing.T) {
	keys := testKeys(t, 2)
	kr, err := newKeyring(keys)
	require.NoError(t, err)
	const name = "chains/x/0002-incr-abcdef.jsonl.zst.enc"
	for _, size := range []int{0, 1, 1000, segmentSize - 1, segmentSize, segmentSize + 1, 3*segmentSize + 17} {
		plain := make([]byte, size)
		_, _ = rand.Read(plain)
		sealed := seal(t, kr, name, plain, 7)
		var got bytes.Buffer
		require.NoError(t, Decrypt(&got, bytes.NewReader(sealed), name, keys...), "size %d", size)
		assert.True(t, bytes.Equal(plain, got.Bytes()), "size %d", size)

		// Decrypt with the old key as a previous one: rotation.
		newKey := testKeys(t, 1)[0]
		got.Reset()
		require.NoError(t, Decrypt(&got, bytes.NewReader(sealed), name, newKey, keys[0]))
	}
}

func TestOpenRefusesTampering(t *testing.T) {
	keys := testKeys(t, 1)
	kr, err := newKeyring(keys)
	require.NoError(t, err)
	const name = "chains/a/0002-incr-abcdef.jsonl.zst.enc"
	plain := make([]byte, 2*segmentSize+100)
	_, _ = rand.Read(plain)
	sealed := seal(t, kr, name, plain, 3)
	segment := segmentSize + tagSize

	cases := map[string]func() ([]byte, string){
		"a flipped byte":            func() ([]byte, string) { b := bytes.Clone(sealed); b[encHeaderSize+segment+5] ^= 1; return b, name },
		"a flipped header byte":     func() ([]byte, string) { b := bytes.Clone(sealed); b[20] ^= 1; return b, name },
		"cut at a segment boundary": func() ([]byte, string) { return sealed[:encHeaderSize+2*segment], name },
		"cut inside a segment":      func() ([]byte, string) { return sealed[:len(sealed)-3], name },
		"moved to another name":     func() ([]byte, string) { return sealed, "chains/b/0002-incr-abcdef.jsonl.zst.enc" },
		"data after the end":        func() ([]byte, string) { return append(bytes.Clone(sealed), 0), name },
		"not encrypted":             func() ([]byte, string) { return bytes.Repeat([]byte("x"), 100), name },
	}
	for what, make := range cases {
		data, as := make()
		var got bytes.Buffer
		err := Decrypt(&got, bytes.NewReader(data), as, keys...)
		var integrity *IntegrityError
		require.True(t, errors.As(err, &integrity), "%s: %v", what, err)
		assert.Equal(t, as, integrity.Object, what)
	}

	other := testKeys(t, 1)
	err = Decrypt(io.Discard, bytes.NewReader(sealed), name, other...)
	var integrity *IntegrityError
	require.True(t, errors.As(err, &integrity))
	assert.Contains(t, integrity.Problem, "not one of this repository's keys")

	// A manifest's subkey is not a link's: a manifest cannot pass for a link.
	var m bytes.Buffer
	sw, err := newSealWriter(&m, kr.current(), roleManifest, name)
	require.NoError(t, err)
	_, _ = sw.Write([]byte("{}"))
	require.NoError(t, sw.Close())
	require.True(t, errors.As(Decrypt(io.Discard, &m, name, keys...), &integrity))
}

// TestEnvelopeFramerRebuildsTheEnvelope splits an envelope as StartChain
// does and checks that the body framed again between its head and trailer
// reads as the envelope siphon wrote, with the same Link.
func TestEnvelopeFramerRebuildsTheEnvelope(t *testing.T) {
	for _, size := range []int{0, 10, frameChunk, 3*frameChunk + 5} {
		body := make([]byte, size)
		_, _ = rand.Read(body)
		var env bytes.Buffer
		ew, err := canonical.NewEnvelopeWriter(&env, canonical.EnvelopeHeader{Kind: canonical.KindDump, Body: canonical.BodyPgDumpCustom,
			Engine: canonical.EnginePostgres, Start: 42, End: 42, Created: time.Now()})
		require.NoError(t, err)
		_, err = ew.Write(body)
		require.NoError(t, err)
		require.NoError(t, ew.Close())

		// Split as Backup writes it, in pieces of odd sizes.
		var gotBody bytes.Buffer
		es := newEnvelopeSplitter(&gotBody)
		for p := env.Bytes(); len(p) > 0; {
			k := min(len(p), 1+len(p)%7919)
			_, err := es.Write(p[:k])
			require.NoError(t, err)
			p = p[k:]
		}
		sp, err := es.split()
		require.NoError(t, err)
		require.True(t, bytes.Equal(body, gotBody.Bytes()), "size %d", size)
		require.Equal(t, ew.Trailer(), sp.trailer)

		framed := newEnvelopeFramer(bytes.NewReader(body), &envelopeRecord{Head: string(sp.head), Trailer: sp.trailer})
		er2 := canonical.NewEnvelopeReader(framed)
		again, err := io.ReadAll(er2)
		require.NoError(t, err, "size %d", size)
		assert.Equal(t, body, again)
		tr2, err := er2.Trailer()
		require.NoError(t, err)
		assert.Equal(t, ew.Trailer().Link(), tr2.Link(), "the same Link")
	}
}

// TestScannerReadsTheLinkOffTheStream feeds a JSONL stream in pieces of
// every size the scanner may meet.
func TestScannerReadsTheLinkOffTheStream(t *testing.T) {
	var buf bytes.Buffer
	enc := canonical.NewEncoder(&buf)
	require.NoError(t, enc.WriteHeader(canonical.Header{Kind: canonical.KindIncremental, Engine: canonical.EnginePostgres, Start: 10,
		SystemID: "7", Timeline: 1, Slot: "s", Created: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}))
	tbl := &canonical.Table{Schema: "public", Name: "t", Columns: []canonical.Column{{Name: "id", Type: "integer"}}, PrimaryKey: []string{"id"}}
	at := time.Date(2026, 1, 2, 3, 4, 6, 0, time.UTC)
	for i := range 3 {
		commit := at.Add(time.Duration(i) * time.Second)
		pos := canonical.Position(100 + i*10)
		require.NoError(t, enc.WriteChange(&canonical.Change{Op: canonical.OpBegin, XID: uint32(i + 1), Position: pos, CommitTime: commit}))
		require.NoError(t, enc.WriteChange(&canonical.Change{Op: canonical.OpInsert, XID: uint32(i + 1), Position: pos, CommitTime: commit,
			Schema: "public", Table: "t", Columns: tbl.Columns, New: canonical.Row{canonical.Text("1")}}))
		require.NoError(t, enc.WriteChange(&canonical.Change{Op: canonical.OpCommit, XID: uint32(i + 1), Position: pos + 5, CommitTime: commit}))
	}
	require.NoError(t, enc.WriteEnd(125))
	require.NoError(t, enc.Flush())
	stream := buf.Bytes()

	for _, piece := range []int{1, 2, 7, 13, 64, len(stream)} {
		s := newJSONLScanner(nil)
		for p := stream; len(p) > 0; {
			k := min(piece, len(p))
			_, err := s.Write(p[:k])
			require.NoError(t, err)
			p = p[k:]
		}
		require.NotNil(t, s.header, "piece %d", piece)
		assert.Equal(t, "7", s.header.SystemID)
		assert.Equal(t, canonical.Position(10), s.header.Start)
		assert.EqualValues(t, 3, s.tx, "piece %d", piece)
		assert.Equal(t, at, s.first.UTC())
		assert.Equal(t, at.Add(2*time.Second), s.last.UTC())
		assert.Equal(t, []canonical.TableName{{Schema: "public", Name: "t"}}, s.tables)
	}
}

func TestManifestChecksum(t *testing.T) {
	m := &manifest{Format: manifestFormat, Version: manifestVersion, Chain: "c", Generation: 1}
	data, err := encodeManifest(m)
	require.NoError(t, err)
	got, err := decodeManifest(data)
	require.NoError(t, err)
	assert.Equal(t, "c", got.Chain)
	i := bytes.Index(data, []byte(`"c"`))
	data[i+1] = 'd'
	_, err = decodeManifest(data)
	assert.ErrorContains(t, err, "SHA-256")
}

func TestLayoutNames(t *testing.T) {
	id := newChainID(time.Date(2026, 12, 1, 2, 0, 0, 0, time.UTC))
	assert.True(t, validChainID(id), id)
	assert.False(t, validChainID("../x"))
	gen, enc, ok := parseManifestName(baseName(manifestName(id, 12, true)))
	assert.True(t, ok)
	assert.True(t, enc)
	assert.Equal(t, 12, gen)
	assert.Equal(t, "chains/"+id+"/x", objectName("backups/chains/"+id+"/x"))
}

// TestEnvelopeSplitterRefusesDamage checks the splitter's checks of the
// framing.
func TestEnvelopeSplitterRefusesDamage(t *testing.T) {
	var env bytes.Buffer
	ew, err := canonical.NewEnvelopeWriter(&env, canonical.EnvelopeHeader{Kind: canonical.KindDump, Body: canonical.BodyPgDumpCustom,
		Engine: canonical.EnginePostgres, Start: 42, End: 42})
	require.NoError(t, err)
	_, _ = ew.Write(bytes.Repeat([]byte("body"), 1000))
	require.NoError(t, ew.Close())
	data := env.Bytes()
	headEnd := bytes.IndexByte(data[bytes.IndexByte(data, '\n')+1:], '\n') + bytes.IndexByte(data, '\n') + 2
	for what, bad := range map[string][]byte{
		"a flipped body byte":  flipAt(data, headEnd+10),
		"a flipped trailer":    flipAt(data, len(data)-5),
		"cut short":            data[:len(data)-10],
		"data after it":        append(bytes.Clone(data), 'x'),
		"a snapshot, not dump": bytes.Replace(bytes.Clone(data), []byte(`"kind":"dump"`), []byte(`"kind":"snapshot"`), 1),
	} {
		es := newEnvelopeSplitter(io.Discard)
		_, werr := es.Write(bad)
		_, serr := es.split()
		assert.Error(t, errors.Join(werr, serr), what)
	}
}

func flipAt(data []byte, i int) []byte {
	b := bytes.Clone(data)
	b[i] ^= 1
	return b
}
