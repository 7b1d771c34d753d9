// Package ulid makes lowercase ULIDs: identifiers that sort by the time
// they were made, as siphon's base slot names do.
package ulid

import (
	"crypto/rand"
	"encoding/binary"
	"strings"
	"time"
)

// Alphabet is Crockford's base32, lower case: no i, l, o or u.
const Alphabet = "0123456789abcdefghjkmnpqrstvwxyz"

// Pattern matches a ULID, for regular expressions.
const Pattern = "[0-9a-hjkmnp-tv-z]{26}"

// New returns a ULID for now: 48 bits of Unix milliseconds then 80 random
// bits, as 26 characters of Alphabet.
func New(now time.Time) string {
	var b [16]byte
	binary.BigEndian.PutUint64(b[:8], uint64(now.UnixMilli())<<16)
	rand.Read(b[6:])
	hi, lo := binary.BigEndian.Uint64(b[:8]), binary.BigEndian.Uint64(b[8:])
	var out [26]byte
	for i := 25; i >= 0; i-- {
		out[i] = Alphabet[lo&31]
		lo = lo>>5 | hi<<59
		hi >>= 5
	}
	return string(out[:])
}

// Time returns the time the ULID id carries, and false when id is no ULID.
func Time(id string) (time.Time, bool) {
	if len(id) != 26 {
		return time.Time{}, false
	}
	var ms uint64
	for i := range 10 { // 50 bits: two zero bits and the 48-bit time
		v := strings.IndexByte(Alphabet, id[i])
		if v < 0 {
			return time.Time{}, false
		}
		ms = ms<<5 | uint64(v)
	}
	return time.UnixMilli(int64(ms)).UTC(), true
}
