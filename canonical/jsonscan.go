package canonical

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"unicode/utf8"
)

// maxDepth bounds the nesting of unknown values the scanner skips, so a
// hostile line cannot exhaust the stack.
const maxDepth = 1000

// scanner reads the JSON of one line. It is strict: it accepts exactly RFC
// 8259 JSON, rejects invalid UTF-8 and escaped lone surrogates rather than
// replacing them, and reports errors as *colError with the byte offset.
type scanner struct {
	data []byte
	pos  int
	// scratch receives unescaped strings that cannot be returned as slices of
	// data. It is only appended to while a line is decoded, so slices of it
	// stay valid until reset.
	scratch []byte
}

func (s *scanner) reset(line []byte) {
	s.data = line
	s.pos = 0
	s.scratch = s.scratch[:0]
}

func (s *scanner) errAt(off int, sentinel error, format string, args ...any) error {
	return &colError{off: off, err: fmt.Errorf("%w: "+format, append([]any{sentinel}, args...)...)}
}

func (s *scanner) syntax(format string, args ...any) error {
	return s.errAt(s.pos, ErrSyntax, format, args...)
}

// unexpected describes the byte at the current position for an error.
func (s *scanner) unexpected(want string) error {
	if s.pos >= len(s.data) {
		return s.syntax("unexpected end of line, want %s", want)
	}
	return s.syntax("unexpected %q, want %s", s.data[s.pos], want)
}

func (s *scanner) ws() {
	for s.pos < len(s.data) {
		switch c := s.data[s.pos]; {
		case c > ' ':
			return
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			s.pos++
		default:
			return
		}
	}
}

// peek returns the next non-blank byte, or 0 at the end of the line.
func (s *scanner) peek() byte {
	s.ws()
	if s.pos < len(s.data) {
		return s.data[s.pos]
	}
	return 0
}

func (s *scanner) expect(c byte) error {
	if s.peek() != c {
		return s.unexpected(fmt.Sprintf("%q", c))
	}
	s.pos++
	return nil
}

// end checks that nothing but blanks follows the record.
func (s *scanner) end() error {
	if s.peek() != 0 || s.pos < len(s.data) {
		return s.syntax("data after the record's closing brace")
	}
	return nil
}

// next moves to the next member of an object or element of an array. first
// says whether the opening bracket was just read; it returns false at the
// closing bracket.
func (s *scanner) next(first *bool, closing byte) (bool, error) {
	c := s.peek()
	if c == closing {
		s.pos++
		return false, nil
	}
	if *first {
		*first = false
		return true, nil
	}
	if c != ',' {
		return false, s.unexpected(fmt.Sprintf("',' or %q", closing))
	}
	s.pos++
	if c := s.peek(); c == closing {
		return false, s.syntax("trailing comma")
	}
	return true, nil
}

// key reads an object member's key and the colon after it. The returned
// slice is valid until the scanner is reset.
func (s *scanner) key() ([]byte, error) {
	if s.peek() != '"' {
		return nil, s.unexpected("a string key")
	}
	k, err := s.stringBytes()
	if err != nil {
		return nil, err
	}
	if err := s.expect(':'); err != nil {
		return nil, err
	}
	return k, nil
}

// isString reports whether the next value is a string.
func (s *scanner) isString() bool { return s.peek() == '"' }

func (s *scanner) literal(lit string) error {
	if len(s.data)-s.pos < len(lit) || string(s.data[s.pos:s.pos+len(lit)]) != lit {
		return s.syntax("bad literal, want %s", lit)
	}
	s.pos += len(lit)
	return nil
}

// skipSafe returns the index of the first byte at or after data[i] that
// is not jsonSafe, or where fewer than 8 bytes are left: it tests 8 bytes
// at a time (SWAR), so the string loops below look at most bytes of a
// string as words. A word is safe when none of its bytes is below 0x20, a
// quote, a backslash or at or above 0x80.
func skipSafe(data []byte, i int) int {
	const (
		ones  = 0x0101010101010101
		highs = 0x8080808080808080
	)
	for i+8 <= len(data) {
		w := binary.LittleEndian.Uint64(data[i:])
		quote, backslash := w^(ones*'"'), w^(ones*'\\')
		// A byte's high bit is set in x-ones*n &^ x when the byte is below
		// n (n at most 0x80), for at least one such byte of the word.
		unsafe := (w-ones*0x20)&^w | (quote-ones)&^quote | (backslash-ones)&^backslash | w
		if unsafe&highs != 0 {
			return i
		}
		i += 8
	}
	return i
}

// stringRaw reads a string and returns its content between the quotes,
// checked: no raw control characters, valid UTF-8, valid escapes (surrogates
// paired). escaped says whether the content holds escapes (see unescape).
func (s *scanner) stringRaw() (raw []byte, escaped bool, err error) {
	if s.peek() != '"' {
		return nil, false, s.unexpected("a string")
	}
	start := s.pos + 1
	data := s.data
	i := start
	for {
		i = skipSafe(data, i)
		for i < len(data) && jsonSafe[data[i]] {
			i++
		}
		if i >= len(data) {
			s.pos = i
			return nil, false, s.syntax("unterminated string")
		}
		c := data[i]
		switch {
		case c == '"':
			s.pos = i + 1
			return data[start:i], escaped, nil
		case c == '\\':
			escaped = true
			n, err := s.checkEscape(i)
			if err != nil {
				return nil, false, err
			}
			i += n
		case c < 0x20:
			return nil, false, s.errAt(i, ErrSyntax, "raw control character %#02x in a string (JSON needs \\u%04x)", c, c)
		default:
			r, size := utf8.DecodeRune(data[i:])
			if r == utf8.RuneError && size == 1 {
				return nil, false, s.errAt(i, ErrInvalidUTF8, "byte %#02x in a string", c)
			}
			i += size
		}
	}
}

// checkEscape checks the escape at data[i] (a backslash) and returns its
// length.
func (s *scanner) checkEscape(i int) (int, error) {
	data := s.data
	if i+1 >= len(data) {
		return 0, s.errAt(i, ErrSyntax, "unterminated escape")
	}
	switch data[i+1] {
	case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
		return 2, nil
	case 'u':
	default:
		return 0, s.errAt(i, ErrSyntax, "bad escape \\%c", data[i+1])
	}
	r, ok := hex4(data, i+2)
	if !ok {
		return 0, s.errAt(i, ErrSyntax, "bad \\u escape")
	}
	switch {
	case r >= 0xD800 && r < 0xDC00:
		if i+7 < len(data) && data[i+6] == '\\' && data[i+7] == 'u' {
			if lo, ok := hex4(data, i+8); ok && lo >= 0xDC00 && lo < 0xE000 {
				return 12, nil
			}
		}
		return 0, s.errAt(i, ErrInvalidUTF8, "unpaired surrogate \\u%04x", r)
	case r >= 0xDC00 && r < 0xE000:
		return 0, s.errAt(i, ErrInvalidUTF8, "unpaired surrogate \\u%04x", r)
	}
	return 6, nil
}

// hex4 reads four hexadecimal digits at data[i:].
func hex4(data []byte, i int) (rune, bool) {
	if i+4 > len(data) {
		return 0, false
	}
	v, ok := parseHex32(data[i : i+4])
	return rune(v), ok
}

// unescape appends the decoded content of raw, which stringRaw checked.
func unescape(dst, raw []byte) []byte {
	for i := 0; i < len(raw); {
		c := raw[i]
		if c != '\\' {
			j := bytes.IndexByte(raw[i:], '\\')
			if j < 0 {
				return append(dst, raw[i:]...)
			}
			dst = append(dst, raw[i:i+j]...)
			i += j
			continue
		}
		switch e := raw[i+1]; e {
		case 'b':
			dst = append(dst, '\b')
		case 'f':
			dst = append(dst, '\f')
		case 'n':
			dst = append(dst, '\n')
		case 'r':
			dst = append(dst, '\r')
		case 't':
			dst = append(dst, '\t')
		case 'u':
			r, _ := hex4(raw, i+2)
			if r >= 0xD800 && r < 0xDC00 {
				lo, _ := hex4(raw, i+8)
				r = 0x10000 + (r-0xD800)<<10 + (lo - 0xDC00)
				i += 6
			}
			dst = utf8.AppendRune(dst, r)
			i += 6
			continue
		default: // '"', '\\', '/'
			dst = append(dst, e)
		}
		i += 2
	}
	return dst
}

// stringBytes reads a string and returns its decoded content: a slice of the
// line when it has no escapes, of the scratch buffer otherwise. Valid until
// the scanner is reset.
func (s *scanner) stringBytes() ([]byte, error) {
	raw, escaped, err := s.stringRaw()
	if err != nil || !escaped {
		return raw, err
	}
	start := len(s.scratch)
	s.scratch = unescape(s.scratch, raw)
	return s.scratch[start:len(s.scratch):len(s.scratch)], nil
}

// appendString reads a string and appends its decoded content to dst, in
// one pass (the hot path of value decoding).
func (s *scanner) appendString(dst []byte) ([]byte, error) {
	if s.peek() != '"' {
		return dst, s.unexpected("a string")
	}
	data := s.data
	i := s.pos + 1
	start := i
	for {
		i = skipSafe(data, i)
		for i < len(data) && jsonSafe[data[i]] {
			i++
		}
		if i >= len(data) {
			s.pos = i
			return dst, s.syntax("unterminated string")
		}
		c := data[i]
		switch {
		case c == '"':
			s.pos = i + 1
			return append(dst, data[start:i]...), nil
		case c == '\\':
			n, err := s.checkEscape(i)
			if err != nil {
				return dst, err
			}
			dst = unescape(append(dst, data[start:i]...), data[i:i+n])
			i += n
			start = i
		case c < 0x20:
			return dst, s.errAt(i, ErrSyntax, "raw control character %#02x in a string (JSON needs \\u%04x)", c, c)
		default:
			r, size := utf8.DecodeRune(data[i:])
			if r == utf8.RuneError && size == 1 {
				return dst, s.errAt(i, ErrInvalidUTF8, "byte %#02x in a string", c)
			}
			i += size
		}
	}
}

// number reads a JSON number and returns its text.
func (s *scanner) number() ([]byte, error) {
	s.ws()
	data := s.data
	start := s.pos
	i := start
	if i < len(data) && data[i] == '-' {
		i++
	}
	switch {
	case i < len(data) && data[i] == '0':
		i++
	case i < len(data) && data[i] >= '1' && data[i] <= '9':
		for i < len(data) && data[i] >= '0' && data[i] <= '9' {
			i++
		}
	default:
		s.pos = i
		return nil, s.unexpected("a number")
	}
	if i < len(data) && data[i] == '.' {
		i++
		d := i
		for i < len(data) && data[i] >= '0' && data[i] <= '9' {
			i++
		}
		if i == d {
			s.pos = i
			return nil, s.syntax("bad number: no digit after '.'")
		}
	}
	if i < len(data) && (data[i] == 'e' || data[i] == 'E') {
		i++
		if i < len(data) && (data[i] == '+' || data[i] == '-') {
			i++
		}
		d := i
		for i < len(data) && data[i] >= '0' && data[i] <= '9' {
			i++
		}
		if i == d {
			s.pos = i
			return nil, s.syntax("bad number: no digit in exponent")
		}
	}
	s.pos = i
	return data[start:i], nil
}

// uint reads a JSON number that must be an unsigned integer of at most bits
// bits.
func (s *scanner) uint(bits int) (uint64, error) {
	start := s.pos
	num, err := s.number()
	if err != nil {
		return 0, err
	}
	var v uint64
	limit := uint64(1)<<bits - 1
	for _, c := range num {
		if c < '0' || c > '9' {
			return 0, s.errAt(start, ErrInvalidRecord, "%s is not an unsigned integer", num)
		}
		d := uint64(c - '0')
		if v > (limit-d)/10 {
			return 0, s.errAt(start, ErrInvalidRecord, "%s does not fit in %d bits", num, bits)
		}
		v = v*10 + d
	}
	return v, nil
}

// boolean reads true or false.
func (s *scanner) boolean() (bool, error) {
	switch s.peek() {
	case 't':
		return true, s.literal("true")
	case 'f':
		return false, s.literal("false")
	}
	return false, s.unexpected("true or false")
}

// skip reads and discards any JSON value.
func (s *scanner) skip(depth int) error {
	if depth > maxDepth {
		return s.syntax("nested deeper than %d", maxDepth)
	}
	switch c := s.peek(); c {
	case '"':
		_, _, err := s.stringRaw()
		return err
	case '{', '[':
		s.pos++
		closing := byte('}')
		if c == '[' {
			closing = ']'
		}
		first := true
		for {
			more, err := s.next(&first, closing)
			if err != nil || !more {
				return err
			}
			if c == '{' {
				if _, err := s.key(); err != nil {
					return err
				}
			}
			if err := s.skip(depth + 1); err != nil {
				return err
			}
		}
	case 't':
		return s.literal("true")
	case 'f':
		return s.literal("false")
	case 'n':
		return s.literal("null")
	case '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
		_, err := s.number()
		return err
	}
	return s.unexpected("a value")
}
