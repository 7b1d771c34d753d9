package siphon

import (
	"fmt"
	"io"
	"strings"

	"github.com/siphondb/siphon/canonical"
)

// Authentication of canonical streams (see SECURITY.md): the Conn writes its
// streams with its key (WithStreamKey), and a call that reads streams runs
// the schema changes only of those authenticated with one of its keys,
// unless the call's ApplyOptions say otherwise.

// newEncoder returns an Encoder for a stream the Conn writes: authenticated
// with its current key, when it has one.
func (o *options) newEncoder(w io.Writer) *canonical.Encoder {
	enc := canonical.NewEncoder(w)
	if len(o.streamKeys) > 0 {
		// Connect validated the key's length, the only way SetKey fails
		// before a header.
		_ = enc.SetKey(o.streamKeys[0])
	}
	return enc
}

// streamRules are what one call that reads canonical streams checks them
// with: the keys that authenticate them, and what it accepts beyond
// checked streams whose schema changes those keys authenticate.
type streamRules struct {
	keys [][]byte
	// unchecked accepts streams without checksums
	// (ApplyOptions.Unchecked).
	unchecked bool
	// unauthenticatedDDL runs the schema changes of streams no key
	// authenticates (ApplyOptions.UnauthenticatedSchemaChanges).
	unauthenticatedDDL bool
}

// rules returns the stream rules of a call of c with opt.
func (c *Conn) rules(opt ApplyOptions) streamRules {
	return streamRules{keys: c.opts.streamKeys, unchecked: opt.Unchecked, unauthenticatedDDL: opt.UnauthenticatedSchemaChanges}
}

// newDecoder returns a Decoder that verifies streams authenticated with
// any of the keys.
func (r streamRules) newDecoder(rd io.Reader) *canonical.Decoder {
	d := canonical.NewDecoder(rd)
	d.SetKeys(r.keys...)
	return d
}

// keyIDs names the keys, for messages.
func (r streamRules) keyIDs() string {
	if len(r.keys) == 0 {
		return "none"
	}
	ids := make([]string, len(r.keys))
	for i, k := range r.keys {
		ids[i] = canonical.KeyID(k)
	}
	return strings.Join(ids, ", ")
}

// checkSchemaChange refuses a DDL record read by d, unless d's stream is
// authenticated with one of the keys (d verified the record before
// returning it: in an authenticated stream a ddl record is a checkpoint)
// or the rules take unauthenticated schema changes.
func (r streamRules) checkSchemaChange(d *canonical.Decoder, rec canonical.Record) error {
	if rec.Type != canonical.RecordChange || rec.Change.Op != canonical.OpDDL || d.Authenticated() || r.unauthenticatedDDL {
		return nil
	}
	h, _ := d.Header()
	why := "the stream is not authenticated"
	if h.KeyID != "" {
		why = fmt.Sprintf("the stream is authenticated with key %s, which is not among the Conn's keys (%s)", h.KeyID, r.keyIDs())
	}
	return fmt.Errorf("the schema change of the source transaction at %v: %s: %w", rec.Change.Position, why, ErrUnauthenticatedSchemaChange)
}
