package copytext

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"math/big"
	"strconv"
)

// This file turns the send format of float4, float8, numeric, date,
// timestamp and timestamptz into the exact text their output functions print
// under siphon's session settings (extra_float_digits 3, DateStyle ISO,
// TimeZone UTC). TestSnapshotValuesMatchServerText checks edge cases and
// many random values of each against the server.

// appendFloat prints a float the way float4out and float8out do with
// extra_float_digits > 0 (PostgreSQL's Ryu): the shortest text that reads
// back exactly, in fixed notation for decimal exponents from -4 up to (not
// including) 6 for float4 and 15 for float8, in exponent notation with at
// least two exponent digits otherwise.
//
// PostgreSQL's Ryu never prints a number that lies exactly halfway between
// the float and a neighbour (it does not trust every platform's input to
// round such a tie to even), where Go's shortest may: then one more digit at
// a time until the text is strictly closer to the float.
func appendFloat(dst []byte, k Kind, src []byte) ([]byte, error) {
	var (
		f        float64
		bits     = 64
		fixedMax = 15
		tieAbove = float64(1 << 53) // no tie has few enough digits below
	)
	switch {
	case k == Float4 && len(src) == 4:
		f, bits, fixedMax, tieAbove = float64(math.Float32frombits(binary.BigEndian.Uint32(src))), 32, 6, 1<<24
	case k == Float8 && len(src) == 8:
		f = math.Float64frombits(binary.BigEndian.Uint64(src))
	default:
		return dst, fmt.Errorf("unexpected binary float of %d bytes", len(src))
	}
	switch {
	case math.IsNaN(f):
		return append(dst, "NaN"...), nil
	case math.IsInf(f, 1):
		return append(dst, "Infinity"...), nil
	case math.IsInf(f, -1):
		return append(dst, "-Infinity"...), nil
	}
	start := len(dst)
	dst = strconv.AppendFloat(dst, f, 'e', -1, bits)
	if math.Abs(f) >= tieAbove {
		digits := bytes.IndexByte(dst[start:], 'e') - 1 // without the point
		if f < 0 {
			digits-- // nor the sign
		}
		for digits < 17 && isTie(dst[start:], f, bits) {
			digits++
			dst = strconv.AppendFloat(dst[:start], f, 'e', digits-1, bits)
		}
	}
	return toFixed(dst, start, fixedMax), nil
}

// toFixed rewrites the exponent notation at dst[start:] ("-d.ddde+XX") in
// fixed notation when its exponent is from -4 up to (not including)
// fixedMax, with the same digits.
func toFixed(dst []byte, start, fixedMax int) []byte {
	num := dst[start:]
	e := bytes.IndexByte(num, 'e')
	exp := 0
	for _, c := range num[e+2:] {
		exp = exp*10 + int(c-'0')
	}
	if num[e+1] == '-' {
		exp = -exp
	}
	if exp < -4 || exp >= fixedMax {
		return dst
	}
	var buf [32]byte
	digits := buf[:0]
	sign := num[0] == '-'
	for _, c := range num[:e] {
		if c >= '0' && c <= '9' {
			digits = append(digits, c)
		}
	}
	dst = dst[:start]
	if sign {
		dst = append(dst, '-')
	}
	switch {
	case exp < 0:
		dst = append(dst, "0."...)
		for range -exp - 1 {
			dst = append(dst, '0')
		}
		return append(dst, digits...)
	case len(digits) <= exp+1:
		dst = append(dst, digits...)
		for range exp + 1 - len(digits) {
			dst = append(dst, '0')
		}
		return dst
	default:
		dst = append(dst, digits[:exp+1]...)
		return append(append(dst, '.'), digits[exp+1:]...)
	}
}

// isTie reports whether the decimal text is exactly halfway between f and
// its neighbour on that side.
func isTie(text []byte, f float64, bits int) bool {
	var d, v, n big.Rat
	if _, ok := d.SetString(string(text)); !ok {
		return false
	}
	v.SetFloat64(f)
	cmp := d.Cmp(&v)
	if cmp == 0 {
		return false
	}
	toward := math.Inf(cmp)
	neighbour := math.Nextafter(f, toward)
	if bits == 32 {
		neighbour = float64(math.Nextafter32(float32(f), float32(toward)))
	}
	if math.IsInf(neighbour, 0) {
		return false
	}
	n.SetFloat64(neighbour)
	n.Add(&n, &v)
	n.Quo(&n, big.NewRat(2, 1))
	return d.Cmp(&n) == 0
}

// Numeric sign words of the send format.
const (
	numericPos  = 0x0000
	numericNeg  = 0x4000
	numericNaN  = 0xC000
	numericPInf = 0xD000
	numericNInf = 0xF000
)

// appendNumeric prints a numeric as numeric_out does: base-10000 digit
// groups around the decimal point, exactly dscale fraction digits.
func appendNumeric(dst []byte, src []byte) ([]byte, error) {
	if len(src) < 8 {
		return dst, fmt.Errorf("unexpected binary numeric of %d bytes", len(src))
	}
	ndigits := int(int16(binary.BigEndian.Uint16(src)))
	weight := int(int16(binary.BigEndian.Uint16(src[2:])))
	sign := binary.BigEndian.Uint16(src[4:])
	dscale := int(int16(binary.BigEndian.Uint16(src[6:])))
	if ndigits < 0 || dscale < 0 || len(src) != 8+2*ndigits {
		return dst, fmt.Errorf("malformed binary numeric")
	}
	switch sign {
	case numericNaN:
		return append(dst, "NaN"...), nil
	case numericPInf:
		return append(dst, "Infinity"...), nil
	case numericNInf:
		return append(dst, "-Infinity"...), nil
	case numericNeg:
		dst = append(dst, '-')
	case numericPos:
	default:
		return dst, fmt.Errorf("binary numeric with sign %#x", sign)
	}
	digit := func(d int) int {
		if d < 0 || d >= ndigits {
			return 0
		}
		return int(binary.BigEndian.Uint16(src[8+2*d:]))
	}
	d := 0
	if weight < 0 {
		d = weight + 1
		dst = append(dst, '0')
	} else {
		for ; d <= weight; d++ {
			g := digit(d)
			if d == 0 {
				dst = strconv.AppendInt(dst, int64(g), 10)
				continue
			}
			dst = append(dst, byte('0'+g/1000), byte('0'+g/100%10), byte('0'+g/10%10), byte('0'+g%10))
		}
	}
	if dscale > 0 {
		dst = append(dst, '.')
		end := len(dst) + dscale
		for i := 0; i < dscale; i, d = i+4, d+1 {
			g := digit(d)
			dst = append(dst, byte('0'+g/1000), byte('0'+g/100%10), byte('0'+g/10%10), byte('0'+g%10))
		}
		dst = dst[:end]
	}
	return dst, nil
}

// Days between 1970-01-01 and 2000-01-01, PostgreSQL's epoch for dates and
// timestamps.
const pgEpochDays = 10957

// appendDate prints a date as date_out does with DateStyle ISO.
func appendDate(dst []byte, src []byte) ([]byte, error) {
	if len(src) != 4 {
		return dst, fmt.Errorf("unexpected binary date of %d bytes", len(src))
	}
	days := int32(binary.BigEndian.Uint32(src))
	switch days {
	case math.MinInt32:
		return append(dst, "-infinity"...), nil
	case math.MaxInt32:
		return append(dst, "infinity"...), nil
	}
	y, m, d := civilFromDays(int64(days) + pgEpochDays)
	dst = appendYMD(dst, y, m, d)
	if y <= 0 {
		dst = append(dst, " BC"...)
	}
	return dst, nil
}

// appendTimestamp prints a timestamp as timestamp_out does with DateStyle
// ISO, or a timestamptz as timestamptz_out does with TimeZone UTC.
func appendTimestamp(dst []byte, src []byte, tz bool) ([]byte, error) {
	if len(src) != 8 {
		return dst, fmt.Errorf("unexpected binary timestamp of %d bytes", len(src))
	}
	us := int64(binary.BigEndian.Uint64(src))
	switch us {
	case math.MinInt64:
		return append(dst, "-infinity"...), nil
	case math.MaxInt64:
		return append(dst, "infinity"...), nil
	}
	const usPerDay = 86_400_000_000
	days := us / usPerDay
	if us%usPerDay < 0 {
		days--
	}
	tod := us - days*usPerDay
	y, m, d := civilFromDays(days + pgEpochDays)
	dst = append(appendYMD(dst, y, m, d), ' ')
	sec := tod / 1_000_000
	dst = append2(dst, int(sec/3600))
	dst = append2(append(dst, ':'), int(sec/60%60))
	dst = append2(append(dst, ':'), int(sec%60))
	if frac := tod % 1_000_000; frac != 0 {
		dst = append(dst, '.')
		for div := int64(100_000); div > 0 && frac != 0; div /= 10 {
			dst = append(dst, byte('0'+frac/div))
			frac %= div
		}
	}
	if tz {
		dst = append(dst, "+00"...)
	}
	if y <= 0 {
		dst = append(dst, " BC"...)
	}
	return dst, nil
}

// appendYMD prints a proleptic Gregorian date as PostgreSQL's ISO style
// does: the year zero-padded to four digits (1 BC is year 0, printed as 1),
// then month and day.
func appendYMD(dst []byte, y int64, m, d int) []byte {
	if y <= 0 {
		y = 1 - y
	}
	for div := int64(1000); div > 1 && y < div; div /= 10 {
		dst = append(dst, '0')
	}
	dst = strconv.AppendInt(dst, y, 10)
	dst = append2(append(dst, '-'), m)
	return append2(append(dst, '-'), d)
}

func append2(dst []byte, n int) []byte { return append(dst, byte('0'+n/10), byte('0'+n%10)) }

// civilFromDays converts days since 1970-01-01 to a proleptic Gregorian
// date with astronomical years (0 is 1 BC), after Howard Hinnant's
// days_from_civil inverse.
func civilFromDays(z int64) (year int64, month, day int) {
	z += 719468
	era := z / 146097
	if z%146097 < 0 {
		era--
	}
	doe := z - era*146097
	yoe := (doe - doe/1460 + doe/36524 - doe/146096) / 365
	doy := doe - (365*yoe + yoe/4 - yoe/100)
	mp := (5*doy + 2) / 153
	day = int(doy - (153*mp+2)/5 + 1)
	month = int(mp + 3)
	if mp >= 10 {
		month = int(mp - 9)
	}
	year = yoe + era*400
	if month <= 2 {
		year++
	}
	return year, month, day
}
