package natsjs

import (
	"errors"
	"fmt"
	"strings"

	"github.com/siphondb/siphon/canonical"
)

// DefaultPrefix is the subject prefix when a [Config] or [ConsumeConfig]
// names none.
const DefaultPrefix = "siphon"

// The subjects a stream's messages are published on, after the prefix:
// a table's changes on two tokens (its schema and name, see [SubjectToken]),
// siphon's own on one, so that no table can collide with them.
const (
	// commitToken is the subject token of the commit markers.
	commitToken = "commit"
	// messageToken is the subject token of transactional logical decoding
	// messages.
	messageToken = "message"
	// ddlToken is the subject token of schema changes.
	ddlToken = "ddl"
)

// ErrInvalidToken is wrapped by [ParseSubjectToken]'s errors.
var ErrInvalidToken = errors.New("natsjs: not a subject token written by SubjectToken")

// SubjectToken returns name as a NATS subject token that stands for it and
// nothing else: ASCII letters, digits, '-' and '_' stand for themselves and
// every other byte, '%' included, is written as '%' and two upper-case
// hexadecimal digits (the bytes of its UTF-8 encoding, as in a URL). So a
// token never holds '.', '*', '>' or white space, whatever the name, and
// [ParseSubjectToken] gives the name back. For example "order items" is
// "order%20items", "ça" is "%C3%A7a" and "a.b" is "a%2Eb".
func SubjectToken(name string) string {
	n := 0
	for i := 0; i < len(name); i++ {
		if !tokenSafe(name[i]) {
			n++
		}
	}
	if n == 0 {
		return name
	}
	const hex = "0123456789ABCDEF"
	var b strings.Builder
	b.Grow(len(name) + 2*n)
	for i := 0; i < len(name); i++ {
		c := name[i]
		if tokenSafe(c) {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('%')
		b.WriteByte(hex[c>>4])
		b.WriteByte(hex[c&0xF])
	}
	return b.String()
}

// tokenSafe reports whether c stands for itself in a subject token.
func tokenSafe(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_'
}

// ParseSubjectToken returns the name [SubjectToken] wrote as token. A token
// it cannot have written (another byte, a '%' not followed by two
// upper-case hexadecimal digits, an escape of a byte that stands for
// itself) is an error wrapping [ErrInvalidToken].
func ParseSubjectToken(token string) (string, error) {
	if !strings.Contains(token, "%") {
		for i := 0; i < len(token); i++ {
			if !tokenSafe(token[i]) {
				return "", fmt.Errorf("%w: %q holds %q at byte %d", ErrInvalidToken, token, token[i], i)
			}
		}
		return token, nil
	}
	b := make([]byte, 0, len(token))
	for i := 0; i < len(token); i++ {
		c := token[i]
		switch {
		case tokenSafe(c):
			b = append(b, c)
		case c == '%' && i+2 < len(token) && upperHex(token[i+1]) >= 0 && upperHex(token[i+2]) >= 0:
			v := byte(upperHex(token[i+1])<<4 | upperHex(token[i+2]))
			if tokenSafe(v) {
				return "", fmt.Errorf("%w: %q escapes %q, which stands for itself", ErrInvalidToken, token, v)
			}
			b = append(b, v)
			i += 2
		default:
			return "", fmt.Errorf("%w: %q holds %q at byte %d", ErrInvalidToken, token, c, i)
		}
	}
	return string(b), nil
}

// upperHex returns the value of an upper-case hexadecimal digit, or -1.
func upperHex(c byte) int {
	switch {
	case '0' <= c && c <= '9':
		return int(c - '0')
	case 'A' <= c && c <= 'F':
		return int(c-'A') + 10
	}
	return -1
}

// TableSubject returns the subject a table's changes are published on:
// prefix, then the schema's and the table's [SubjectToken]. A prefix of ""
// means [DefaultPrefix].
func TableSubject(prefix string, table canonical.TableName) string {
	return orDefault(prefix) + "." + SubjectToken(table.Schema) + "." + SubjectToken(table.Name)
}

// ParseTableSubject returns the table a subject written by [TableSubject]
// with this prefix stands for.
func ParseTableSubject(prefix, subject string) (canonical.TableName, error) {
	rest, ok := strings.CutPrefix(subject, orDefault(prefix)+".")
	schema, name, two := strings.Cut(rest, ".")
	if !ok || !two || strings.Contains(name, ".") {
		return canonical.TableName{}, fmt.Errorf("%w: %q is not a table subject under %q", ErrInvalidToken, subject, orDefault(prefix))
	}
	s, err := ParseSubjectToken(schema)
	if err != nil {
		return canonical.TableName{}, err
	}
	n, err := ParseSubjectToken(name)
	if err != nil {
		return canonical.TableName{}, err
	}
	return canonical.TableName{Schema: s, Name: n}, nil
}

// CommitSubject returns the subject of the commit markers under prefix
// ("" means [DefaultPrefix]): one message per transaction, after its
// changes.
func CommitSubject(prefix string) string { return orDefault(prefix) + "." + commitToken }

// MessageSubject returns the subject of transactional logical decoding
// messages (pg_logical_emit_message) under prefix ("" means
// [DefaultPrefix]).
func MessageSubject(prefix string) string { return orDefault(prefix) + "." + messageToken }

// DDLSubject returns the subject of schema changes ([canonical.OpDDL])
// under prefix ("" means [DefaultPrefix]): a consumer that keeps a copy
// of tables applies them at their place, before the table's next changes.
func DDLSubject(prefix string) string { return orDefault(prefix) + "." + ddlToken }

// orDefault returns prefix, or DefaultPrefix for "".
func orDefault(prefix string) string {
	if prefix == "" {
		return DefaultPrefix
	}
	return prefix
}
