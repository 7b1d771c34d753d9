package canonical

import (
	"strings"
	"time"
)

// Time returns a timestamptz, timestamp or date value as a time.Time in
// UTC, read from the text PostgreSQL prints under siphon's session
// settings (DateStyle ISO, TimeZone UTC):
//
//	timestamp with time zone   "2026-11-30 05:00:00.123456+00"   that instant
//	timestamp                  "2026-11-30 05:00:00.123456"      that wall clock, as UTC
//	date                       "2026-11-30"                      its midnight, as UTC
//
// Years before 1 AD ("0044-03-15 BC") become Go's astronomical years (1 BC
// is year 0); years after 9999 are read too. infinity and -infinity, which
// these types may hold, are not times: they are an error wrapping
// [ErrNotConvertible], as is other text (a time of day, an interval).
func (v Value) Time() (time.Time, error) {
	const to = "time.Time"
	text, err := v.present(to)
	if err != nil {
		return time.Time{}, err
	}
	if text == "infinity" || text == "-infinity" {
		return time.Time{}, v.notConvertible(to, "not a finite time")
	}
	t, ok := parseISOTime(text)
	if !ok {
		return time.Time{}, v.notConvertible(to, "not a timestamp or date in ISO format")
	}
	return t, nil
}

// parseISOTime parses "Y-MM-DD[ HH:MM:SS[.fraction][±HH[:MM[:SS]]]][ BC]".
func parseISOTime(s string) (time.Time, bool) {
	s, bc := strings.CutSuffix(s, " BC")
	p := timeParser{s: s}
	year := p.number(4, 9)
	month := p.after('-', 2)
	day := p.after('-', 2)
	var hour, minute, sec, nsec, offset int
	if p.skip(' ') {
		hour, minute, sec = p.number(2, 2), p.after(':', 2), p.after(':', 2)
		if p.skip('.') {
			nsec = p.fraction()
		}
		offset = p.offset()
	}
	if p.bad || p.s != "" || month < 1 || month > 12 || hour > 23 || minute > 59 || sec > 59 {
		return time.Time{}, false
	}
	if bc {
		year = 1 - year
	}
	t := time.Date(year, time.Month(month), day, hour, minute, sec, nsec, time.UTC)
	if t.Day() != day { // February 30th and the like
		return time.Time{}, false
	}
	return t.Add(-time.Duration(offset) * time.Second), true
}

// timeParser reads the fields of a timestamp's text from the front of s;
// bad turns true at the first field that is not there.
type timeParser struct {
	s   string
	bad bool
}

// skip consumes c if s starts with it.
func (p *timeParser) skip(c byte) bool {
	if p.s != "" && p.s[0] == c {
		p.s = p.s[1:]
		return true
	}
	return false
}

// after reads separator sep, then a number of exactly n digits.
func (p *timeParser) after(sep byte, n int) int {
	if !p.skip(sep) {
		p.bad = true
		return 0
	}
	return p.number(n, n)
}

// number reads a number of lo to hi digits.
func (p *timeParser) number(lo, hi int) int {
	n, i := 0, 0
	for ; i < len(p.s) && i < hi && p.s[i] >= '0' && p.s[i] <= '9'; i++ {
		n = n*10 + int(p.s[i]-'0')
	}
	if i < lo {
		p.bad = true
	}
	p.s = p.s[i:]
	return n
}

// fraction reads the digits of a fraction of a second (up to nanoseconds)
// and returns it in nanoseconds.
func (p *timeParser) fraction() int {
	before := len(p.s)
	n := p.number(1, 9)
	for i := before - len(p.s); i < 9; i++ {
		n *= 10
	}
	return n
}

// offset reads an optional UTC offset ±HH[:MM[:SS]] and returns it in
// seconds east of UTC.
func (p *timeParser) offset() int {
	sign := 1
	switch {
	case p.skip('+'):
	case p.skip('-'):
		sign = -1
	default:
		return 0
	}
	secs := p.number(2, 2) * 3600
	if p.s != "" && p.s[0] == ':' {
		secs += p.after(':', 2) * 60
		if p.s != "" && p.s[0] == ':' {
			secs += p.after(':', 2)
		}
	}
	return sign * secs
}
