package canonical

import (
	"encoding/base64"
	"strconv"
	"time"
	"unicode/utf8"
)

// jsonSafe[c] is true for the ASCII bytes that stand for themselves inside a
// JSON string. Control characters, '"' and '\\' need escapes; bytes >= 0x80
// are checked as UTF-8.
var jsonSafe = func() (t [256]bool) {
	for c := 0x20; c < utf8.RuneSelf; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

var base64Std = base64.StdEncoding

const hexLower = "0123456789abcdef"

// appendString appends s to dst as a JSON string. Valid UTF-8 is kept as it
// is (U+2028 and U+2029 included); quotes, backslashes and control characters
// are escaped, the latter as \n, \r, \t, \b, \f or \u00XX (NUL is \u0000).
// It returns the byte offset of the first invalid UTF-8 sequence in s, or -1;
// on an invalid sequence dst holds a partial string and must be discarded.
func appendString(dst []byte, s string) ([]byte, int) {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if jsonSafe[c] {
			i++
			continue
		}
		if c >= utf8.RuneSelf {
			r, size := utf8.DecodeRuneInString(s[i:])
			if r == utf8.RuneError && size == 1 {
				return dst, i
			}
			i += size
			continue
		}
		dst = append(dst, s[start:i]...)
		switch c {
		case '"', '\\':
			dst = append(dst, '\\', c)
		case '\n':
			dst = append(dst, '\\', 'n')
		case '\r':
			dst = append(dst, '\\', 'r')
		case '\t':
			dst = append(dst, '\\', 't')
		case '\b':
			dst = append(dst, '\\', 'b')
		case '\f':
			dst = append(dst, '\\', 'f')
		default:
			dst = append(dst, '\\', 'u', '0', '0', hexLower[c>>4], hexLower[c&0xF])
		}
		i++
		start = i
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"'), -1
}

// appendKey appends `,"key":` (or `"key":` right after '{'): keys are
// constants that need no escaping.
func appendKey(dst []byte, key string) []byte {
	if n := len(dst); n > 0 && dst[n-1] != '{' {
		dst = append(dst, ',')
	}
	dst = append(dst, '"')
	dst = append(dst, key...)
	return append(dst, '"', ':')
}

// appendPosition appends p in PostgreSQL's LSN notation, like
// [Position.String], without allocating.
func appendPosition(dst []byte, p Position) []byte {
	dst = appendHexUpper(dst, uint32(p>>32))
	dst = append(dst, '/')
	return appendHexUpper(dst, uint32(p))
}

func appendHexUpper(dst []byte, v uint32) []byte {
	const digits = "0123456789ABCDEF"
	var tmp [8]byte
	i := len(tmp)
	for {
		i--
		tmp[i] = digits[v&0xF]
		v >>= 4
		if v == 0 {
			break
		}
	}
	return append(dst, tmp[i:]...)
}

// appendQuotedPosition appends p as a JSON string.
func appendQuotedPosition(dst []byte, p Position) []byte {
	dst = append(dst, '"')
	dst = appendPosition(dst, p)
	return append(dst, '"')
}

// appendTime appends t as a JSON string in RFC 3339 with the fraction it
// needs, in UTC.
func appendTime(dst []byte, t time.Time) []byte {
	dst = append(dst, '"')
	dst = t.UTC().AppendFormat(dst, time.RFC3339Nano)
	return append(dst, '"')
}

// timeEncodable reports whether t has a four-digit year, which RFC 3339 needs.
func timeEncodable(t time.Time) bool {
	y := t.UTC().Year()
	return y >= 0 && y <= 9999
}

func appendUint(dst []byte, v uint64) []byte { return strconv.AppendUint(dst, v, 10) }

func appendBool(dst []byte, v bool) []byte {
	if v {
		return append(dst, "true"...)
	}
	return append(dst, "false"...)
}

// parsePositionBytes parses the LSN notation like [ParsePosition] (one to
// eight hexadecimal digits, '/', one to eight hexadecimal digits) without
// allocating.
func parsePositionBytes(b []byte) (Position, bool) {
	slash := -1
	for i, c := range b {
		if c == '/' {
			slash = i
			break
		}
	}
	if slash < 1 || slash > 8 || len(b)-slash-1 < 1 || len(b)-slash-1 > 8 {
		return 0, false
	}
	hi, ok1 := parseHex32(b[:slash])
	lo, ok2 := parseHex32(b[slash+1:])
	if !ok1 || !ok2 {
		return 0, false
	}
	return Position(uint64(hi)<<32 | uint64(lo)), true
}

func parseHex32(b []byte) (uint32, bool) {
	var v uint32
	for _, c := range b {
		var d byte
		switch {
		case c >= '0' && c <= '9':
			d = c - '0'
		case c >= 'a' && c <= 'f':
			d = c - 'a' + 10
		case c >= 'A' && c <= 'F':
			d = c - 'A' + 10
		default:
			return 0, false
		}
		v = v<<4 | uint32(d)
	}
	return v, true
}
