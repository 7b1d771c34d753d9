package canonical

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash"
)

// Authentication. A checksum (see checksum.go) finds accidents; anyone who
// can write the stream can also recompute it. A stream written with a key
// ([Encoder.SetKey]) is also authenticated: its header names the key
// ("auth":"hmac-sha256","key":"<key id>", see [KeyID]) and every
// checkpoint carries, just before its sum, a member
//
//	,"mac":"<64 lowercase hex digits>"
//
// the HMAC-SHA-256 of the stream up to and including `"mac":"` of that
// line, chained: mac(1) = HMAC(key, 32 zero bytes ‖ the bytes of the
// stream up to and including the header's `"mac":"`), and mac(i) =
// HMAC(key, mac(i-1) ‖ the bytes after checkpoint i-1's `"mac":"` up to and
// including checkpoint i's). Every byte of the stream is covered once, in
// order, so each checkpoint vouches for everything before it, as the sum
// does, but only the key holder can compute it. The sum, which comes
// after, covers the MAC too, so a reader without the key still checks the
// stream for accidents. In an authenticated stream a ddl record is a
// checkpoint too, so a reader has verified a schema change before it acts
// on it. The end record's MAC is the stream's identity ([Decoder.Link]),
// which the next link of a chain records in its header.

// authName is the algorithm an authenticated stream's header names.
const authName = "hmac-sha256"

// MinKeyBytes is the shortest key [Encoder.SetKey] and [Decoder.SetKeys]
// accept: 32 bytes, SHA-256's output, as RFC 2104 advises.
const MinKeyBytes = 32

// macKey starts the mac member in a checkpoint; macLen is its length with
// its 64 digits and closing quote.
const (
	macKey = `,"mac":"`
	macLen = len(macKey) + 2*sha256.Size + 1
)

// KeyID names a key without revealing it: the first 8 bytes of
// HMAC-SHA-256(key, "siphon key id"), as 16 lowercase hex digits. An
// authenticated stream's header carries it ([Header].KeyID), so a reader
// holding several keys (a current one and previous ones, during a
// rotation) knows which one to verify it with.
func KeyID(key []byte) string {
	m := hmac.New(sha256.New, key)
	m.Write([]byte("siphon key id"))
	return hex.EncodeToString(m.Sum(nil)[:8])
}

// checkKey refuses a key too short to authenticate with.
func checkKey(key []byte) error {
	if len(key) < MinKeyBytes {
		return fmt.Errorf("%w: a key must be at least %d bytes (it has %d): use 32 random bytes", ErrAuthentication, MinKeyBytes, len(key))
	}
	return nil
}

// macChain computes the chained MACs of a stream (see above).
type macChain struct {
	h    hash.Hash
	last [sha256.Size]byte // the last checkpoint's MAC
}

func newMACChain(key []byte) *macChain {
	m := &macChain{h: hmac.New(sha256.New, key)}
	m.h.Write(m.last[:])
	return m
}

// checkpoint adds head, the bytes up to and including a checkpoint's
// `"mac":"`, and returns the checkpoint's MAC; the chain goes on from it.
func (m *macChain) checkpoint(head []byte) []byte {
	m.h.Write(head)
	m.h.Sum(m.last[:0])
	m.h.Reset()
	m.h.Write(m.last[:])
	return m.last[:]
}

// splitMAC tells whether covered (a checkpoint line through `"sum":"`)
// carries a mac member right before its sum, and returns the part the MAC
// covers (through `"mac":"`) and the MAC's digits.
func splitMAC(covered []byte) (head, digits []byte, ok bool) {
	n := len(covered) - len(sumKey)
	if n < macLen || covered[n-1] != '"' || !bytes.Equal(covered[n-macLen:n-macLen+len(macKey)], []byte(macKey)) {
		return nil, nil, false
	}
	digits = covered[n-1-2*sha256.Size : n-1]
	if !isLowerHex(digits) {
		return nil, nil, false
	}
	return covered[:n-1-2*sha256.Size], digits, true
}

// authLink is the Link of an authenticated stream: its key id and its last
// MAC, which only the key holder could have computed, and its end.
func authLink(keyID string, mac []byte, end Position) string {
	return fmt.Sprintf("%s:%s:%s@%v", authName, keyID, mac, end)
}

// isKeyID reports whether s looks like what KeyID returns.
func isKeyID(s []byte) bool { return len(s) == 16 && isLowerHex(s) }
