package siphon

import (
	"fmt"
	"io"
	"strings"

	"github.com/siphondb/siphon/canonical"
)

// Authentication of canonical streams (see SECURITY.md): the Conn writes its
// streams with its key (WithStreamKey) and runs the schema changes only of
// streams authenticated with one of its keys, unless
// WithUnauthenticatedSchemaChanges.

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

// newDecoder returns a Decoder that verifies streams authenticated with
// any of the Conn's keys.
func (o *options) newDecoder(r io.Reader) *canonical.Decoder {
	d := canonical.NewDecoder(r)
	d.SetKeys(o.streamKeys...)
	return d
}

// keyIDs names the Conn's keys, for messages.
func (o *options) keyIDs() string {
	if len(o.streamKeys) == 0 {
		return "none"
	}
	ids := make([]string, len(o.streamKeys))
	for i, k := range o.streamKeys {
		ids[i] = canonical.KeyID(k)
	}
	return strings.Join(ids, ", ")
}

// checkSchemaChange refuses a DDL record read by d, unless d's stream is
// authenticated with one of the Conn's keys (d verified the record
// before returning it: in an authenticated stream a ddl record is a
// checkpoint) or the Conn takes unauthenticated schema changes.
func (o *options) checkSchemaChange(d *canonical.Decoder, rec canonical.Record) error {
	if rec.Type != canonical.RecordChange || rec.Change.Op != canonical.OpDDL || d.Authenticated() || o.unauthenticatedDDL {
		return nil
	}
	h, _ := d.Header()
	return unauthenticatedSchemaChange(rec.Change.Position, h.KeyID, o)
}

// unauthenticatedSchemaChange is the error for a schema change at pos of a
// stream whose header names keyID ("" for none).
func unauthenticatedSchemaChange(pos canonical.Position, keyID string, o *options) error {
	why := "the stream is not authenticated"
	if keyID != "" {
		why = fmt.Sprintf("the stream is authenticated with key %s, which is not among the Conn's keys (%s)", keyID, o.keyIDs())
	}
	return fmt.Errorf("the schema change of the source transaction at %v: %s: %w", pos, why, ErrUnauthenticatedSchemaChange)
}
