package canonical

import (
	"crypto/hmac"
	"encoding/hex"
	"fmt"
)

// SetKeys gives the Decoder the keys it verifies authenticated streams
// with (see [Encoder.SetKey]): the one whose [KeyID] the header names is
// used, so a reader can hold its current key and the previous ones. It
// must be called before the header is read; keys shorter than
// [MinKeyBytes] are ignored, as they can authenticate nothing. The Decoder
// keeps no reference to the keys' bytes after the header.
//
// With the key the header names, every checkpoint's MAC is verified as it
// is read (a mismatch is an error wrapping [ErrAuthentication]), and
// [Decoder.Authenticated] reports true. Without it the stream is read as a
// checked one: its checksums are verified, its MACs are not.
func (d *Decoder) SetKeys(keys ...[]byte) {
	d.keys = d.keys[:0]
	for _, k := range keys {
		if checkKey(k) == nil {
			d.keys = append(d.keys, k)
		}
	}
}

// Authenticated reports whether the stream is authenticated with one of
// the Decoder's keys (see [Decoder.SetKeys]): its header names one, whose
// MACs the Decoder verifies. Every record Next has returned then comes
// from the key holder, up to the last checkpoint: a transaction's changes
// once its commit is returned, a ddl record as soon as it is returned
// (each is a checkpoint). It is false before the header is read, and for a
// stream that is not authenticated or names a key the Decoder lacks
// ([Header].KeyID says which).
func (d *Decoder) Authenticated() bool { return d.haveHeader && d.mac != nil }

// checkAuthMembers checks the header's authentication members (as the
// fields scanned them).
func (d *Decoder) checkAuthMembers() error {
	f := &d.f
	named, keyed := f.seen&fAuth.bit() != 0, f.seen&fKey.bit() != 0
	switch {
	case !named && !keyed:
		return nil
	case named != keyed:
		return fmt.Errorf("%w: the header has %q without %q: it was changed", ErrAuthentication, map[bool]string{true: "auth", false: "key"}[named], map[bool]string{true: "key", false: "auth"}[named])
	case string(f.auth) != authName:
		return fmt.Errorf("%w: auth %q, want %q", ErrAuthentication, truncateText(f.auth), authName)
	case !isKeyID(f.key):
		return fmt.Errorf("%w: key %q is not a key id (16 lowercase hex digits)", ErrAuthentication, truncateText(f.key))
	case !d.summed:
		return fmt.Errorf("%w: the header names a key but carries no checksum: it was changed", ErrAuthentication)
	}
	return nil
}

// authenticateHeader verifies the header line's MAC, once the header
// (and so the key it names) is read; checksum saw the line before.
func (d *Decoder) authenticateHeader(line []byte) error {
	id := d.header.KeyID
	switch {
	case id == "" && d.macAt < 0:
		return nil
	case id == "":
		return d.fail(fmt.Errorf("%w: the header carries a MAC but names no key: it was changed", ErrAuthentication), "header")
	case d.macAt < 0:
		return d.fail(fmt.Errorf("%w: the header names key %s but carries no MAC", ErrAuthentication, id), "header")
	}
	for _, k := range d.keys {
		if KeyID(k) == id {
			d.mac = newMACChain(k)
			break
		}
	}
	d.keys = nil
	if err := d.authenticate(line); err != nil {
		return err
	}
	d.feedMAC(line[d.macAt:])
	return nil
}

// authenticate verifies the MAC of the checkpoint line, whose head ends at
// d.macAt, when the Decoder holds the key; it keeps the MAC's digits for
// the stream's Link either way.
func (d *Decoder) authenticate(line []byte) error {
	digits := line[d.macAt : d.macAt+len(d.lastMAC)]
	if d.mac != nil {
		var want [32]byte
		if _, err := hex.Decode(want[:], digits); err != nil || !hmac.Equal(d.mac.checkpoint(line[:d.macAt]), want[:]) {
			since := "its start"
			if d.lastMACLine > 0 {
				since = fmt.Sprintf("line %d, its last checkpoint that authenticated", d.lastMACLine)
			}
			return d.fail(fmt.Errorf("%w: the stream was changed after %s by someone without key %s", ErrAuthentication, since, d.header.KeyID), "")
		}
	}
	copy(d.lastMAC[:], digits)
	d.lastMACLine = d.lineNo
	return nil
}

// feedMAC adds the bytes of a line after those a checkpoint took, and its
// newline, to the MAC chain.
func (d *Decoder) feedMAC(rest []byte) {
	if d.mac == nil {
		return
	}
	d.mac.h.Write(rest)
	if !d.cut {
		d.mac.h.Write(newline)
	}
}
