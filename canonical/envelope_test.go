package canonical

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"math/rand/v2"
	"strings"
	"testing"
	"testing/iotest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func envTestHeader() EnvelopeHeader {
	return EnvelopeHeader{
		Kind: KindDump, Body: BodyPgDumpCustom, Engine: EnginePostgres, ServerVersion: "15.4", Tool: "pg_dump 15.4",
		SystemID: "7301234567890123456", Timeline: 1, Slot: "siphon", Start: 0x16B374D848, End: 0x16B374D848,
		Base:    &EnvelopeBase{Slot: "siphon_01hq", WALStart: 0x16B3000000},
		Tables:  []TableName{{"public", "t"}, {"Odd Schema", `Mixed "Case" ü`}},
		Created: time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC),
	}
}

// envelope writes body in an envelope with chunks of chunk bytes.
func envWrite(t testing.TB, h EnvelopeHeader, body []byte, chunk int) []byte {
	t.Helper()
	var out bytes.Buffer
	w, err := NewEnvelopeWriter(&out, h)
	require.NoError(t, err)
	if chunk > 0 {
		w.chunk = chunk
	}
	// Write in uneven pieces, as a pipe would deliver them.
	for rest := body; len(rest) > 0; {
		n := min(len(rest), 1+len(rest)%13)
		_, err := w.Write(rest[:n])
		require.NoError(t, err)
		rest = rest[n:]
	}
	require.NoError(t, w.Close())
	return out.Bytes()
}

// readEnvelope reads a whole envelope; body holds what Read returned
// before any error.
func envRead(data []byte) (h EnvelopeHeader, body []byte, t EnvelopeTrailer, err error) {
	r := NewEnvelopeReader(bytes.NewReader(data))
	if h, err = r.Header(); err != nil {
		return h, nil, t, err
	}
	body, err = io.ReadAll(r)
	if err != nil {
		return h, body, t, err
	}
	t, err = r.Trailer()
	return h, body, t, err
}

func envRandomBody(n int) []byte {
	b := make([]byte, n)
	r := rand.New(rand.NewPCG(uint64(n), 7))
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func TestEnvelopeRoundTrip(t *testing.T) {
	t.Parallel()
	for _, n := range []int{0, 1, 6, 7, 8, 50, 3*envelopeChunk + 5} {
		for _, chunk := range []int{7, 0} {
			body := envRandomBody(n)
			data := envWrite(t, envTestHeader(), body, chunk)
			h, got, tr, err := envRead(data)
			require.NoError(t, err, "n=%d chunk=%d", n, chunk)
			assert.Equal(t, envTestHeader(), h)
			assert.Equal(t, body, append([]byte{}, got...), "n=%d", n)
			sum := sha256.Sum256(body)
			assert.Equal(t, hex.EncodeToString(sum[:]), tr.BodySHA256)
			assert.Equal(t, int64(n), tr.BodyBytes)
			assert.Len(t, tr.Link(), 64)
		}
	}
	data := envWrite(t, envTestHeader(), []byte("abc"), 0)
	assert.True(t, bytes.HasPrefix(data, []byte("siphon-envelope/1\n{")), "a magic line a human can read with head -1")
}

func TestEnvelopeLinkChangesWithHeaderOrBody(t *testing.T) {
	t.Parallel()
	link := func(h EnvelopeHeader, body string) string {
		_, _, tr, err := envRead(envWrite(t, h, []byte(body), 0))
		require.NoError(t, err)
		return tr.Link()
	}
	base := link(envTestHeader(), "body")
	assert.Equal(t, base, link(envTestHeader(), "body"), "deterministic")
	assert.NotEqual(t, base, link(envTestHeader(), "Body"))
	h := envTestHeader()
	h.Start++
	h.End++
	assert.NotEqual(t, base, link(h, "body"))
}

func TestEnvelopeEndAndBaseInTrailer(t *testing.T) {
	t.Parallel()
	h := envTestHeader()
	h.Kind, h.Body, h.End = KindIncremental, BodyJSONL, 0
	var out bytes.Buffer
	w, err := NewEnvelopeWriter(&out, h)
	require.NoError(t, err)
	_, err = w.Write([]byte("{}\n"))
	require.NoError(t, err)
	w.SetEnd(h.Start + 100)
	w.SetBaseWALEnd(h.Start + 200)
	require.NoError(t, w.Close())
	require.NoError(t, w.Close(), "Close twice does nothing")
	_, err = w.Write([]byte("more"))
	assert.Error(t, err, "no body after Close")

	_, _, tr, err := envRead(out.Bytes())
	require.NoError(t, err)
	assert.Equal(t, h.Start+100, tr.End)
	assert.Equal(t, h.Start+200, tr.BaseWALEnd)
	assert.Equal(t, w.Trailer(), tr)
}

// TestEnvelopeDetectsEveryFlippedByte flips each byte of a small
// envelope, in three ways: reading must fail, never hand on a changed body
// byte, and never report the body whole.
func TestEnvelopeDetectsEveryFlippedByte(t *testing.T) {
	t.Parallel()
	body := envRandomBody(40)
	data := envWrite(t, envTestHeader(), body, 16)
	for i := range data {
		for _, mask := range []byte{0x01, 0x80, 0xff} {
			bad := bytes.Clone(data)
			bad[i] ^= mask
			_, got, _, err := envRead(bad)
			var envErr *EnvelopeError
			require.ErrorAs(t, err, &envErr, "byte %d ^ %#x went unnoticed", i, mask)
			assert.True(t, bytes.HasPrefix(body, got), "byte %d ^ %#x: only verified chunks are handed on", i, mask)
			assert.LessOrEqual(t, envErr.Offset, int64(len(data)))
		}
	}
}

func TestEnvelopeCorruptChunkNamesItsOffset(t *testing.T) {
	t.Parallel()
	body := envRandomBody(100)
	data := envWrite(t, envTestHeader(), body, 16)
	r := NewEnvelopeReader(bytes.NewReader(data))
	_, err := r.Header()
	require.NoError(t, err)
	start := r.BodyOffset()
	// The third chunk's data starts 2*(4+16+4)+4 bytes into the body.
	bad := bytes.Clone(data)
	bad[start+2*24+4+5] ^= 0x10
	_, got, _, err := envRead(bad)
	var envErr *EnvelopeError
	require.ErrorAs(t, err, &envErr)
	assert.ErrorIs(t, err, ErrEnvelopeCorrupt)
	assert.Equal(t, start+2*24, envErr.Offset, "the offset of the chunk that fails")
	assert.Contains(t, envErr.Problem, "body bytes 32 to 47")
	assert.Equal(t, body[:32], got, "the two good chunks before it were handed on")
}

func TestEnvelopeDetectsEveryCut(t *testing.T) {
	t.Parallel()
	data := envWrite(t, envTestHeader(), envRandomBody(40), 16)
	for cut := 0; cut < len(data); cut++ {
		_, _, _, err := envRead(data[:cut])
		require.ErrorIs(t, err, ErrEnvelopeTruncated, "cut at %d", cut)
		assert.ErrorIs(t, err, io.ErrUnexpectedEOF)
		var envErr *EnvelopeError
		require.ErrorAs(t, err, &envErr)
		assert.LessOrEqual(t, envErr.Offset, int64(cut))
	}
}

func TestEnvelopeRefusesWhatIsNotOne(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		data    string
		problem string
	}{
		{"PGDMP\x01\x0e\x00\x04\x08\x01\x01", "bare pg_dump archive"},
		{`{"type":"header","format":"siphon.jsonl"}` + "\n", "bare JSONL"},
		{"\x00\x01garbage garbage garbage", `"\x00\x01garbage`},
		{"siphon-envelope/x\n{}\n", "format version number"},
	} {
		_, _, _, err := envRead([]byte(tc.data))
		require.ErrorIs(t, err, ErrNotEnvelope, tc.data)
		assert.Contains(t, err.Error(), tc.problem)
		var envErr *EnvelopeError
		require.ErrorAs(t, err, &envErr)
		assert.Zero(t, envErr.Offset)
	}
	_, _, _, err := envRead(nil)
	assert.ErrorIs(t, err, ErrEnvelopeTruncated, "an empty stream is cut at byte 0")
}

func TestEnvelopeRefusesOtherVersions(t *testing.T) {
	t.Parallel()
	data := envWrite(t, envTestHeader(), []byte("body"), 0)
	for _, v := range []string{"2", "0", "10"} {
		bad := append([]byte("siphon-envelope/"+v), data[len("siphon-envelope/1"):]...)
		_, _, _, err := envRead(bad)
		require.ErrorIs(t, err, ErrUnsupportedVersion)
		assert.Contains(t, err.Error(), "envelope format version "+v+"; this siphon reads version 1")
	}
}

func TestEnvelopeHeaderIsChecked(t *testing.T) {
	t.Parallel()
	for _, mutate := range []func(*EnvelopeHeader){
		func(h *EnvelopeHeader) { h.Kind = "changes" },
		func(h *EnvelopeHeader) { h.Kind = "" },
		func(h *EnvelopeHeader) { h.Body = BodyJSONL },
		func(h *EnvelopeHeader) { h.Kind = KindSnapshot },
		func(h *EnvelopeHeader) { h.Engine = "" },
		func(h *EnvelopeHeader) { h.End = h.Start - 1 },
	} {
		h := envTestHeader()
		mutate(&h)
		_, err := NewEnvelopeWriter(io.Discard, h)
		assert.ErrorIs(t, err, ErrEnvelopeHeader)
	}
	_, _, _, err := envRead([]byte("siphon-envelope/1\n{\"kind\":\"tarball\",\"body\":\"jsonl\",\"engine\":\"x\"}\n"))
	assert.ErrorIs(t, err, ErrEnvelopeHeader)
	assert.Contains(t, err.Error(), `unknown kind "tarball"`)
	_, _, _, err = envRead([]byte("siphon-envelope/1\n{\"kind\":\"dump\",,}\n"))
	var envErr *EnvelopeError
	require.ErrorAs(t, err, &envErr)
	assert.Equal(t, int64(len("siphon-envelope/1\n{\"kind\":\"dump\",")), envErr.Offset, "the byte where the JSON breaks")
}

func TestEnvelopeRefusesDataAfterTrailer(t *testing.T) {
	t.Parallel()
	data := envWrite(t, envTestHeader(), []byte("body"), 0)
	_, _, _, err := envRead(append(bytes.Clone(data), 'x'))
	var envErr *EnvelopeError
	require.ErrorAs(t, err, &envErr)
	assert.ErrorIs(t, err, ErrEnvelopeCorrupt)
	assert.Equal(t, int64(len(data)), envErr.Offset)
}

func TestEnvelopeReaderPassesOnReadErrors(t *testing.T) {
	t.Parallel()
	data := envWrite(t, envTestHeader(), envRandomBody(100), 0)
	boom := errors.New("connection reset")
	r := NewEnvelopeReader(io.MultiReader(bytes.NewReader(data[:60]), iotest.ErrReader(boom)))
	_, err := io.ReadAll(r)
	require.ErrorIs(t, err, boom)
	var envErr *EnvelopeError
	assert.False(t, errors.As(err, &envErr), "not the envelope's fault")
}

// TestEnvelopeStreams checks that neither side holds the body: the reader
// gets the first chunk while the writer has not finished.
func TestEnvelopeStreams(t *testing.T) {
	t.Parallel()
	pr, pw := io.Pipe()
	firstRead := make(chan struct{})
	writeDone := make(chan error, 1)
	go func() {
		w, err := NewEnvelopeWriter(pw, envTestHeader())
		if err == nil {
			_, err = w.Write(envRandomBody(envelopeChunk + 1)) // one whole chunk goes out
		}
		if err == nil {
			<-firstRead
			_, err = w.Write(envRandomBody(10))
		}
		if err == nil {
			err = w.Close()
		}
		pw.CloseWithError(err)
		writeDone <- err
	}()
	r := NewEnvelopeReader(pr)
	buf := make([]byte, 100)
	_, err := io.ReadFull(r, buf)
	require.NoError(t, err)
	close(firstRead)
	rest, err := io.ReadAll(r)
	require.NoError(t, err)
	assert.Len(t, rest, envelopeChunk+1+10-100)
	require.NoError(t, <-writeDone)
}

func TestEnvelopeErrorMessage(t *testing.T) {
	t.Parallel()
	err := &EnvelopeError{Offset: 1234, Problem: "the stream ends where a chunk length was expected", Err: ErrEnvelopeTruncated}
	assert.Equal(t, "canonical: envelope, byte 1234: the stream ends where a chunk length was expected: envelope cut short: unexpected EOF", err.Error())
	assert.True(t, strings.HasPrefix(err.Error(), "canonical: envelope, byte "))
}

// FuzzEnvelopeReader feeds arbitrary bytes to the reader: it must not
// panic or hang, and whenever it reports a body whole, that body must
// match the trailer.
func FuzzEnvelopeReader(f *testing.F) {
	valid := envWrite(f, envTestHeader(), envRandomBody(40), 16)
	f.Add(valid)
	f.Add(valid[:len(valid)/2])
	f.Add([]byte("siphon-envelope/1\n{}\n"))
	f.Add([]byte("PGDMP"))
	f.Fuzz(func(t *testing.T, data []byte) {
		r := NewEnvelopeReader(bytes.NewReader(data))
		if _, err := r.Header(); err != nil {
			return
		}
		body, err := io.ReadAll(r)
		if err != nil {
			var envErr *EnvelopeError
			if !errors.As(err, &envErr) {
				t.Fatalf("a bytes.Reader cannot fail: %v", err)
			}
			return
		}
		tr, err := r.Trailer()
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(body)
		if tr.BodySHA256 != hex.EncodeToString(sum[:]) || tr.BodyBytes != int64(len(body)) {
			t.Fatalf("reported whole, but the body does not match the trailer")
		}
	})
}
