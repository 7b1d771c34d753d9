package sqltext

import "strings"

// tokenKind is what the lexer distinguishes: keywords and unquoted
// identifiers, semicolons, and everything else.
type tokenKind uint8

const (
	tokWord tokenKind = iota + 1
	tokSemicolon
	tokOther // a quoted identifier, a string, a number, an operator...
)

type token struct {
	kind  tokenKind
	start int // byte offset in the source
	text  string
}

// lexer walks statement text token by token, skipping white space and
// comments. Unterminated strings and comments run to the end, as the
// server would see them (and refuse them).
type lexer struct {
	src string
	pos int
}

func (lx *lexer) next() (token, bool) {
	s := lx.src
	for lx.pos < len(s) {
		c := s[lx.pos]
		switch {
		case isSpace(c):
			lx.pos++
		case c == '-' && strings.HasPrefix(s[lx.pos:], "--"):
			if nl := strings.IndexByte(s[lx.pos:], '\n'); nl >= 0 {
				lx.pos += nl + 1
			} else {
				lx.pos = len(s)
			}
		case c == '/' && strings.HasPrefix(s[lx.pos:], "/*"):
			lx.skipBlockComment()
		default:
			return lx.token(), true
		}
	}
	return token{}, false
}

// token reads the token at lx.pos, which is not white space nor a comment.
func (lx *lexer) token() token {
	s, start := lx.src, lx.pos
	c := s[start]
	tok := token{kind: tokOther, start: start}
	switch {
	case c == ';':
		lx.pos++
		tok.kind = tokSemicolon
	case c == '\'':
		lx.skipString(false)
	case (c == 'E' || c == 'e') && start+1 < len(s) && s[start+1] == '\'':
		lx.pos++
		lx.skipString(true)
	case c == '"':
		lx.skipQuoted('"')
	case c == '$' && lx.dollarTag() != "":
		lx.skipDollarString(lx.dollarTag())
	case isWordStart(c):
		lx.pos++
		for lx.pos < len(s) && isWordPart(s[lx.pos]) {
			lx.pos++
		}
		tok.kind = tokWord
	default:
		lx.pos++
	}
	tok.text = s[start:lx.pos]
	return tok
}

// skipString skips a string constant from its opening quote: two quotes
// in a row are one quote inside it, and so is a backslash and a quote in
// an escape string.
func (lx *lexer) skipString(escapes bool) {
	s := lx.src
	lx.pos++
	for lx.pos < len(s) {
		switch s[lx.pos] {
		case '\\':
			if escapes && lx.pos+1 < len(s) {
				lx.pos++
			}
		case '\'':
			if lx.pos+1 < len(s) && s[lx.pos+1] == '\'' {
				lx.pos++
			} else {
				lx.pos++
				return
			}
		}
		lx.pos++
	}
}

// skipQuoted skips a quoted identifier: a doubled quote is one inside it.
func (lx *lexer) skipQuoted(q byte) {
	s := lx.src
	lx.pos++
	for lx.pos < len(s) {
		if s[lx.pos] == q {
			if lx.pos+1 < len(s) && s[lx.pos+1] == q {
				lx.pos += 2
				continue
			}
			lx.pos++
			return
		}
		lx.pos++
	}
}

// dollarTag returns the opening $tag$ at lx.pos, or "" when there is none
// ($1 is a parameter).
func (lx *lexer) dollarTag() string {
	s := lx.src[lx.pos:]
	for i := 1; i < len(s); i++ {
		switch c := s[i]; {
		case c == '$':
			return s[:i+1]
		case i == 1 && !isWordStart(c), i > 1 && !isWordPart(c) || c == '$':
			return ""
		}
	}
	return ""
}

func (lx *lexer) skipDollarString(tag string) {
	lx.pos += len(tag)
	if end := strings.Index(lx.src[lx.pos:], tag); end >= 0 {
		lx.pos += end + len(tag)
	} else {
		lx.pos = len(lx.src)
	}
}

// skipBlockComment skips a /* comment */, which nests.
func (lx *lexer) skipBlockComment() {
	s := lx.src
	depth := 0
	for lx.pos < len(s) {
		switch {
		case strings.HasPrefix(s[lx.pos:], "/*"):
			depth++
			lx.pos += 2
		case strings.HasPrefix(s[lx.pos:], "*/"):
			depth--
			lx.pos += 2
			if depth == 0 {
				return
			}
		default:
			lx.pos++
		}
	}
}

func isSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'
}

func isWordStart(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '_' || c >= 0x80
}

func isWordPart(c byte) bool { return isWordStart(c) || c >= '0' && c <= '9' || c == '$' }
