package repository

// Manifests: what a chain holds, written last, one generation per link
// added, each generation written once (a conditional write) and never
// changed.

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/siphondb/siphon/canonical"
)

const (
	manifestFormat  = "siphon-repository-manifest"
	manifestVersion = 1
	// maxManifest bounds the manifest a reader accepts.
	maxManifest = 64 << 20
)

// manifest is one generation of a chain's manifest: the whole chain as it
// stood when the link it adds was written.
type manifest struct {
	Format     string    `json:"format"`
	Version    int       `json:"version"`
	Chain      string    `json:"chain"`
	Generation int       `json:"generation"`
	Written    time.Time `json:"written"`
	// Writer is the id of the Repository value that wrote it.
	Writer string `json:"writer"`
	// The source the chain's links come from.
	SystemID      string `json:"system_id"`
	Timeline      uint32 `json:"timeline"`
	Slot          string `json:"slot"`
	ServerVersion string `json:"server_version,omitempty"`
	// BaseSlot is the physical base slot that pins the chain's WAL on
	// the source; Expire drops it.
	BaseSlot string `json:"base_slot,omitempty"`
	// KeyID names the master key the objects were sealed with ("" when
	// the repository has none); StreamKeyID the key that authenticated the
	// canonical links.
	KeyID       string       `json:"key_id,omitempty"`
	StreamKeyID string       `json:"stream_key_id,omitempty"`
	Links       []linkRecord `json:"links"`
}

// linkRecord is one link of a chain, as its manifest records it.
type linkRecord struct {
	N      int                  `json:"n"`
	Kind   canonical.Kind       `json:"kind"`
	Body   canonical.BodyFormat `json:"body"`
	Object string               `json:"object"` // key, from "chains/" on
	// Compression is "zstd" or "" (stored as written).
	Compression string `json:"compression,omitempty"`
	Encrypted   bool   `json:"encrypted,omitempty"`
	// Start and End are where the link starts and ends on the source's
	// timeline; Link and Previous its chain identity and the previous
	// link's (siphon.ChainLink).
	Start    canonical.Position `json:"start"`
	End      canonical.Position `json:"end"`
	Link     string             `json:"link"`
	Previous string             `json:"previous,omitempty"`
	// Created is when the source's backup began (the envelope's or the
	// JSONL header's), Written when the object was complete.
	Created time.Time `json:"created"`
	Written time.Time `json:"written"`
	// Bytes is the plaintext size (a dump's body, an incremental's JSONL);
	// StoredBytes and SHA256 the object's, as stored (no SHA256 for an
	// encrypted object, whose segments authenticate it).
	Bytes       int64  `json:"bytes"`
	StoredBytes int64  `json:"stored_bytes"`
	SHA256      string `json:"sha256,omitempty"`
	// Tables the link holds (a dump's list; the tables an incremental
	// changed or described).
	Tables []canonical.TableName `json:"tables,omitempty"`
	// Transactions, SchemaChanges, FirstCommit and LastCommit describe an
	// incremental's transactions.
	Transactions  int64     `json:"transactions,omitempty"`
	SchemaChanges int64     `json:"schema_changes,omitempty"`
	FirstCommit   time.Time `json:"first_commit,omitzero"`
	LastCommit    time.Time `json:"last_commit,omitzero"`
	// StreamKeyID names the key that authenticates an incremental's JSONL
	// ("" when it is not authenticated).
	StreamKeyID string `json:"stream_key_id,omitempty"`
	// Envelope holds what a dump's envelope had around its body, which
	// the object holds alone (so that pg_restore reads it as it is).
	Envelope *envelopeRecord `json:"envelope,omitempty"`
}

// envelopeRecord is a dump's envelope without its body: the magic and
// header lines verbatim, and the trailer.
type envelopeRecord struct {
	Head    string                    `json:"head"`
	Trailer canonical.EnvelopeTrailer `json:"trailer"`
	Base    *canonical.EnvelopeBase   `json:"base,omitempty"`
}

// last returns the chain's last link.
func (m *manifest) last() *linkRecord { return &m.Links[len(m.Links)-1] }

// check verifies that a decoded manifest is one of chain id, generation
// gen, and that its links hold together.
func (m *manifest) check(id string, gen int) error {
	switch {
	case m.Format != manifestFormat:
		return fmt.Errorf("format %q, not %q", m.Format, manifestFormat)
	case m.Version != manifestVersion:
		return fmt.Errorf("format version %d; this package reads %d", m.Version, manifestVersion)
	case m.Chain != id:
		return fmt.Errorf("it says it is chain %s's (moved from another chain)", m.Chain)
	case m.Generation != gen:
		return fmt.Errorf("it says it is generation %d (moved from another generation)", m.Generation)
	case len(m.Links) != gen:
		return fmt.Errorf("generation %d lists %d links, not %d", gen, len(m.Links), gen)
	}
	for i := range m.Links {
		l := &m.Links[i]
		switch {
		case l.N != i+1:
			return fmt.Errorf("link %d is numbered %d", i+1, l.N)
		case i == 0 && l.Kind != canonical.KindDump:
			return fmt.Errorf("link 1 is a %s, not a dump", l.Kind)
		case i == 0 && l.Envelope == nil:
			return fmt.Errorf("link 1 has no envelope record")
		case i > 0 && l.Kind != canonical.KindIncremental:
			return fmt.Errorf("link %d is a %s, not an incremental", i+1, l.Kind)
		case i > 0 && (l.Start != m.Links[i-1].End || l.Previous != m.Links[i-1].Link):
			return fmt.Errorf("link %d does not continue link %d", i+1, i)
		case len(l.Object) <= len(chainPrefix(id)) || l.Object[:len(chainPrefix(id))] != chainPrefix(id):
			return fmt.Errorf("link %d's object %q is not in the chain's folder", i+1, l.Object)
		}
	}
	return nil
}

// encodeManifest returns the bytes of a manifest object of an
// unencrypted repository: the manifest, indented for people, with the
// SHA-256 of its bytes before it.
//
//	{"sha256": "<hex>",
//	 "manifest": {...}}
func encodeManifest(m *manifest) ([]byte, error) {
	body, err := json.MarshalIndent(m, " ", "  ")
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(body)
	var b bytes.Buffer
	fmt.Fprintf(&b, "{\"sha256\": %q,\n \"manifest\": ", hex.EncodeToString(sum[:]))
	b.Write(body)
	b.WriteString("}\n")
	return b.Bytes(), nil
}

// decodeManifest reads the bytes encodeManifest wrote and checks their
// SHA-256.
func decodeManifest(data []byte) (*manifest, error) {
	var wrapper struct {
		SHA256   string          `json:"sha256"`
		Manifest json.RawMessage `json:"manifest"`
	}
	if err := json.Unmarshal(data, &wrapper); err != nil {
		return nil, fmt.Errorf("it does not decode: %v", err)
	}
	sum := sha256.Sum256(wrapper.Manifest)
	if got := hex.EncodeToString(sum[:]); got != wrapper.SHA256 {
		return nil, fmt.Errorf("its SHA-256 is %s; it says %s (changed since it was written)", got, wrapper.SHA256)
	}
	var m manifest
	if err := json.Unmarshal(wrapper.Manifest, &m); err != nil {
		return nil, fmt.Errorf("it does not decode: %v", err)
	}
	return &m, nil
}

// readLimited reads r to its end, refusing more than limit bytes.
func readLimited(r io.Reader, limit int64, name string) ([]byte, error) {
	data, err := io.ReadAll(io.LimitReader(r, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > limit {
		return nil, &IntegrityError{Object: name, Problem: fmt.Sprintf("it is larger than %d bytes", limit)}
	}
	return data, nil
}
