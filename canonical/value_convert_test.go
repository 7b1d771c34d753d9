package canonical_test

import (
	"errors"
	"math"
	"math/big"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/siphondb/siphon/canonical"
)

// convertCase is one text and what a conversion makes of it: want, or an
// error wrapping ErrNotConvertible when bad.
type convertCase[T any] struct {
	text string
	want T
	bad  bool
}

func checkConversion[T any](t *testing.T, to string, convert func(canonical.Value) (T, error), cases []convertCase[T]) {
	t.Helper()
	for _, tc := range cases {
		got, err := convert(canonical.Text(tc.text))
		if tc.bad {
			require.ErrorIs(t, err, canonical.ErrNotConvertible, "%q", tc.text)
			var ce *canonical.ConversionError
			require.ErrorAs(t, err, &ce, "%q", tc.text)
			assert.Equal(t, to, ce.To)
			assert.Contains(t, err.Error(), `"`+tc.text+`"`, "the error quotes the text")
			continue
		}
		require.NoError(t, err, "%q", tc.text)
		assert.Equal(t, tc.want, got, "%q", tc.text)
	}
	for _, v := range []canonical.Value{canonical.Null(), canonical.Unchanged()} {
		_, err := convert(v)
		assert.NotErrorIs(t, err, canonical.ErrNotConvertible, "%v is an error of its own kind", v)
		assert.Equal(t, v.IsNull(), errors.Is(err, canonical.ErrNull), "%v", v)
		assert.Equal(t, v.IsUnchanged(), errors.Is(err, canonical.ErrUnchanged), "%v", v)
	}
}

func TestValueInt64(t *testing.T) {
	checkConversion(t, "int64", canonical.Value.Int64, []convertCase[int64]{
		{text: "0", want: 0},
		{text: "-32768", want: -32768},
		{text: "9007199254740993", want: 9007199254740993}, // beyond 2^53: a float64 would round it
		{text: "9223372036854775807", want: math.MaxInt64},
		{text: "-9223372036854775808", want: math.MinInt64},
		{text: "4294967295", want: 4294967295}, // the largest oid
		{text: "9223372036854775808", bad: true},
		{text: "12.00", bad: true},
		{text: "NaN", bad: true},
		{text: "+1", bad: true},
		{text: " 1", bad: true},
		{text: "", bad: true},
		{text: "1e3", bad: true},
	})
}

func TestValueFloat64(t *testing.T) {
	checkConversion(t, "float64", canonical.Value.Float64, []convertCase[float64]{
		{text: "0.1", want: 0.1},
		{text: "-0", want: math.Copysign(0, -1)},
		{text: "1.7976931348623157e+308", want: math.MaxFloat64},
		{text: "5e-324", want: math.SmallestNonzeroFloat64},
		{text: "3.4028235e+38", want: 3.4028235e+38}, // a real's text
		{text: "Infinity", want: math.Inf(1)},
		{text: "-Infinity", want: math.Inf(-1)},
		{text: "1e400", bad: true},
		{text: "0x10", bad: true},
		{text: "one", bad: true},
		{text: "", bad: true},
	})
	maxReal, err := canonical.Text("3.4028235e+38").Float64()
	require.NoError(t, err)
	assert.Equal(t, float32(math.MaxFloat32), float32(maxReal), "a real's text rounds back to its float32 exactly")
	nan, err := canonical.Text("NaN").Float64()
	require.NoError(t, err)
	assert.True(t, math.IsNaN(nan), "a float's NaN is a float64 NaN")
}

func TestValueDecimalAndRat(t *testing.T) {
	decimals := []convertCase[string]{
		{text: "0", want: "0"},
		{text: "12.50", want: "12.50"},
		{text: "-0.000000000000000000000001", want: "-0.000000000000000000000001"},
		{text: "123456789012345678901234567890.123456789012345678901234567890", want: "123456789012345678901234567890.123456789012345678901234567890"},
		{text: "NaN", bad: true},
		{text: "Infinity", bad: true},
		{text: "-Infinity", bad: true},
		{text: "1e+100", bad: true},
		{text: "3/4", bad: true},
		{text: "1.", bad: true},
		{text: ".5", bad: true},
		{text: "-", bad: true},
		{text: "$1.00", bad: true},
		{text: "", bad: true},
	}
	checkConversion(t, "decimal", canonical.Value.Decimal, decimals)

	rats := make([]convertCase[*big.Rat], len(decimals))
	for i, d := range decimals {
		rats[i] = convertCase[*big.Rat]{text: d.text, bad: d.bad}
		if !d.bad {
			rats[i].want, _ = new(big.Rat).SetString(d.want)
		}
	}
	checkConversion(t, "*big.Rat", canonical.Value.Rat, rats)

	tenth, err := canonical.Text("0.10").Rat()
	require.NoError(t, err)
	assert.Equal(t, "1/10", tenth.String(), "exact, not the float nearest to 0.1")
}

func TestValueBool(t *testing.T) {
	checkConversion(t, "bool", canonical.Value.Bool, []convertCase[bool]{
		{text: "t", want: true},
		{text: "f", want: false},
		{text: "true", want: true},
		{text: "false", want: false},
		{text: "yes", bad: true},
		{text: "T", bad: true},
		{text: "1", bad: true},
		{text: "", bad: true},
	})
}

func TestValueTime(t *testing.T) {
	utc := func(y int, mo time.Month, d, h, mi, s, ns int) time.Time {
		return time.Date(y, mo, d, h, mi, s, ns, time.UTC)
	}
	checkConversion(t, "time.Time", canonical.Value.Time, []convertCase[time.Time]{
		// timestamp with time zone, under TimeZone UTC
		{text: "2026-11-30 05:00:00.123456+00", want: utc(2026, 11, 30, 5, 0, 0, 123456000)},
		{text: "2026-11-30 05:00:00+00", want: utc(2026, 11, 30, 5, 0, 0, 0)},
		{text: "1999-12-31 23:59:59.999999+00", want: utc(1999, 12, 31, 23, 59, 59, 999999000)},
		{text: "2026-11-30 10:30:00+05:30", want: utc(2026, 11, 30, 5, 0, 0, 0)},
		{text: "2026-11-29 23:00:00-06", want: utc(2026, 11, 30, 5, 0, 0, 0)},
		{text: "1850-01-01 00:00:00+00:09:21", want: utc(1849, 12, 31, 23, 50, 39, 0)},
		{text: "4713-01-01 00:00:00+00 BC", want: utc(-4712, 1, 1, 0, 0, 0, 0)},
		// timestamp without time zone: its wall clock, as UTC
		{text: "2026-11-30 05:00:00.000001", want: utc(2026, 11, 30, 5, 0, 0, 1000)},
		{text: "294276-12-31 23:59:59.999999", want: utc(294276, 12, 31, 23, 59, 59, 999999000)},
		{text: "4713-01-01 00:00:00 BC", want: utc(-4712, 1, 1, 0, 0, 0, 0)},
		// date: its midnight
		{text: "2026-11-30", want: utc(2026, 11, 30, 0, 0, 0, 0)},
		{text: "0001-01-01 BC", want: utc(0, 1, 1, 0, 0, 0, 0)},
		{text: "5874897-12-31", want: utc(5874897, 12, 31, 0, 0, 0, 0)},
		{text: "2024-02-29", want: utc(2024, 2, 29, 0, 0, 0, 0)},
		// not a finite time, or not a timestamp at all
		{text: "infinity", bad: true},
		{text: "-infinity", bad: true},
		{text: "2026-02-30", bad: true},
		{text: "2026-13-01", bad: true},
		{text: "2026-11-30 24:00:00", bad: true},
		{text: "2026-11-30T05:00:00Z", bad: true},
		{text: "2026-11-30 05:00", bad: true},
		{text: "23:59:59.999999", bad: true},
		{text: "1 year 2 mons", bad: true},
		{text: "26-11-30", bad: true},
		{text: "2026-11-30 05:00:00+", bad: true},
		{text: "2026-11-30 05:00:00.", bad: true},
		{text: "", bad: true},
	})
}

func TestConversionErrorSaysWhatAndWhy(t *testing.T) {
	_, err := canonical.Text("12.50").Int64()
	assert.EqualError(t, err, `canonical: convert "12.50" to int64: not convertible: not an integer`)
	_, err = canonical.Text("NaN").Rat()
	assert.EqualError(t, err, `canonical: convert "NaN" to *big.Rat: not convertible: not a finite number`)
	_, err = canonical.Null().Time()
	assert.EqualError(t, err, `canonical: convert NULL to time.Time: NULL value`)
	_, err = canonical.Text("a" + strings.Repeat("é", 40)).Int64()
	assert.EqualError(t, err, `canonical: convert "a`+strings.Repeat("é", 31)+`"... (81 bytes) to int64: not convertible: not an integer`,
		"a long text is cut, at a character boundary")
	_, err = canonical.Unchanged().Bool()
	assert.EqualError(t, err, `canonical: convert (unchanged) to bool: unchanged TOAST value, not sent with the update`)
}

func TestChangeOldValue(t *testing.T) {
	cols := []canonical.Column{{Name: "id"}, {Name: "total"}}
	update := canonical.Change{Op: canonical.OpUpdate, Columns: cols,
		New: canonical.Row{canonical.Text("1"), canonical.Text("12.00")},
		Old: canonical.Row{canonical.Text("1"), canonical.Text("10.50")}}
	old, ok := update.OldValue("total")
	require.True(t, ok)
	assert.Equal(t, canonical.Text("10.50"), old)
	cur, _ := update.Value("total")
	assert.Equal(t, canonical.Text("12.00"), cur, "Value reads the new row of an update")
	_, ok = update.OldValue("missing")
	assert.False(t, ok, "no such column")

	insert := canonical.Change{Op: canonical.OpInsert, Columns: cols, New: update.New}
	_, ok = insert.OldValue("total")
	assert.False(t, ok, "an insert has no old row")

	del := canonical.Change{Op: canonical.OpDelete, Columns: cols, Old: canonical.Row{canonical.Text("1"), canonical.Null()}}
	old, ok = del.OldValue("total")
	require.True(t, ok)
	assert.True(t, old.IsNull(), "under REPLICA IDENTITY DEFAULT a delete's other columns are NULL")
}
