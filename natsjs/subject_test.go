package natsjs_test

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/siphondb/siphon/canonical"
	"github.com/siphondb/siphon/natsjs"
)

// validToken reports whether token is one a NATS subject may hold and no
// wildcard: not empty, printable ASCII without '.', '*', '>' or white space.
func validToken(token string) bool {
	if token == "" {
		return false
	}
	for i := 0; i < len(token); i++ {
		c := token[i]
		if c <= ' ' || c >= utf8.RuneSelf || strings.IndexByte(".*>", c) >= 0 {
			return false
		}
	}
	return true
}

// TestSubjectTokens: any name becomes a valid token, distinct names
// distinct tokens, and each token gives its name back.
func TestSubjectTokens(t *testing.T) {
	t.Parallel()
	names := map[string]string{
		"orders":       "orders",
		"order_items":  "order_items",
		"Order-Items":  "Order-Items",
		"order items":  "order%20items",
		`"quoted"`:     "%22quoted%22",
		"a.b":          "a%2Eb",
		"*":            "%2A",
		">":            "%3E",
		"%":            "%25",
		"%41":          "%2541",
		"ça":           "%C3%A7a",
		"日本":           "%E6%97%A5%E6%9C%AC",
		"tab\there":    "tab%09here",
		"$SYS":         "%24SYS",
		"a\\b":         "a%5Cb",
		"UPPER lower1": "UPPER%20lower1",
	}
	tokens := map[string]string{}
	for name, want := range names {
		token := natsjs.SubjectToken(name)
		assert.Equal(t, want, token, "%q", name)
		assert.True(t, validToken(token), "%q gives %q", name, token)
		back, err := natsjs.ParseSubjectToken(token)
		require.NoError(t, err, "%q", token)
		assert.Equal(t, name, back)
		assert.NotContains(t, tokens, token, "%q and %q", name, tokens[token])
		tokens[token] = name
	}
}

// TestParseSubjectTokenRefuses: a token SubjectToken cannot have written
// is an error, so a token stands for one name only.
func TestParseSubjectTokenRefuses(t *testing.T) {
	t.Parallel()
	for _, token := range []string{"a b", "a.b", "ü", "%", "%4", "%zz", "%2e", "%41", "a%5f", "*"} {
		_, err := natsjs.ParseSubjectToken(token)
		assert.ErrorIs(t, err, natsjs.ErrInvalidToken, "%q", token)
	}
}

// TestTableSubjects: a table's subject is the prefix and two tokens, which
// read back as the table; commit and message subjects have one.
func TestTableSubjects(t *testing.T) {
	t.Parallel()
	odd := canonical.TableName{Schema: `My "Schema"`, Name: "ta.ble *> ü"}
	subject := natsjs.TableSubject("cdc.shop", odd)
	assert.Equal(t, "cdc.shop.My%20%22Schema%22.ta%2Eble%20%2A%3E%20%C3%BC", subject)
	back, err := natsjs.ParseTableSubject("cdc.shop", subject)
	require.NoError(t, err)
	assert.Equal(t, odd, back)

	assert.Equal(t, "siphon.public.t", natsjs.TableSubject("", canonical.TableName{Schema: "public", Name: "t"}))
	assert.Equal(t, "siphon.commit", natsjs.CommitSubject(""))
	assert.Equal(t, "cdc.message", natsjs.MessageSubject("cdc"))
	for _, s := range []string{"cdc.commit", "cdc.a.b.c", "other.a.b", "cdc.a%zz.b"} {
		_, err := natsjs.ParseTableSubject("cdc", s)
		assert.ErrorIs(t, err, natsjs.ErrInvalidToken, s)
	}
}

// FuzzSubjectToken: every name, valid UTF-8 or not, makes a valid token
// that reads back as the name.
func FuzzSubjectToken(f *testing.F) {
	for _, s := range []string{"", "a", "a.b", "%41", "ü", "\xff"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		token := natsjs.SubjectToken(name)
		if name != "" && !validToken(token) {
			t.Fatalf("%q gives %q", name, token)
		}
		back, err := natsjs.ParseSubjectToken(token)
		if err != nil || back != name {
			t.Fatalf("%q gives %q, which reads back as %q, %v", name, token, back, err)
		}
	})
}
