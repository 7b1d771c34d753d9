package canonical

import (
	"errors"
	"fmt"
	"math/big"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Conversions of a Value's text to Go types. They are conveniences over the
// lossless text ([Value.Text]), for the common types, and read that text as
// PostgreSQL prints it under siphon's session settings (see [Value]). A value
// they cannot read exactly is an error, never an approximation: numeric
// NaN and Infinity are not numbers to [Value.Rat], and infinity is not a
// time to [Value.Time].

// Errors of the [Value] conversions. A [*ConversionError] wraps one of them;
// branch with [errors.Is].
var (
	// ErrNotConvertible means a present value's text is not of the type
	// asked for: "12.50" as an int64, "NaN" as a decimal, "infinity" as a
	// time.
	ErrNotConvertible = errors.New("not convertible")
	// ErrNull means the value is NULL: there is nothing to convert.
	ErrNull = errors.New("NULL value")
	// ErrUnchanged means the value is an unchanged TOAST value, which the
	// source did not send with an update (see [Unchanged]): the column
	// keeps its current value, which the change does not hold.
	ErrUnchanged = errors.New("unchanged TOAST value, not sent with the update")
)

// ConversionError is the error of a [Value] conversion that failed: it
// says which value and which type, and wraps [ErrNotConvertible], [ErrNull]
// or [ErrUnchanged].
type ConversionError struct {
	// Value is the value that was to be converted.
	Value Value
	// To names the Go type asked for: "int64", "float64", "decimal",
	// "*big.Rat", "bool" or "time.Time".
	To string
	// Err says why; it wraps one of the sentinels above.
	Err error
}

// Error names the value and the type, for example
// `canonical: convert "12.50" to int64: not convertible: not an integer`.
// A long text is cut after its first 64 bytes, with its length.
func (e *ConversionError) Error() string {
	shown := e.Value.String()
	if text, ok := e.Value.Text(); ok {
		shown = strconv.Quote(text)
		if len(text) > shownBytes {
			cut := shownBytes
			for cut > 0 && !utf8.RuneStart(text[cut]) {
				cut--
			}
			shown = strconv.Quote(text[:cut]) + "... (" + strconv.Itoa(len(text)) + " bytes)"
		}
	}
	return "canonical: convert " + shown + " to " + e.To + ": " + e.Err.Error()
}

// shownBytes is how much of a value's text a ConversionError shows.
const shownBytes = 64

// Unwrap returns Err.
func (e *ConversionError) Unwrap() error { return e.Err }

// present returns v's text, or the error for a NULL or unchanged value.
func (v Value) present(to string) (string, error) {
	switch v.state {
	case stateNull:
		return "", &ConversionError{Value: v, To: to, Err: ErrNull}
	case stateUnchanged:
		return "", &ConversionError{Value: v, To: to, Err: ErrUnchanged}
	}
	return v.text, nil
}

// notConvertible returns the ConversionError for a present value whose text
// is not of type to.
func (v Value) notConvertible(to, why string) error {
	return &ConversionError{Value: v, To: to, Err: fmt.Errorf("%w: %s", ErrNotConvertible, why)}
}

// Int64 returns the value as an int64: the text of a smallint, integer,
// bigint or oid column (or of a numeric without a fractional part). Text
// that is not a decimal integer, or one outside the int64 range, is an error
// wrapping [ErrNotConvertible].
func (v Value) Int64() (int64, error) {
	const to = "int64"
	text, err := v.present(to)
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseInt(text, 10, 64)
	if errors.Is(err, strconv.ErrRange) {
		return 0, v.notConvertible(to, "out of the int64 range")
	}
	if err != nil || text[0] == '+' {
		return 0, v.notConvertible(to, "not an integer")
	}
	return n, nil
}

// Float64 returns the value as a float64: the text of a double precision
// or real column, which siphon reads with extra_float_digits 3, so the
// float is exactly the one the source holds (NaN and ±Infinity included;
// for a real, float32 of the result is).
// The text of a numeric is rounded to the nearest float64: read numeric
// with [Value.Decimal] or [Value.Rat] to keep it exact. Text that is not a
// number, or beyond the float64 range, is an error wrapping
// [ErrNotConvertible].
func (v Value) Float64() (float64, error) {
	const to = "float64"
	text, err := v.present(to)
	if err != nil {
		return 0, err
	}
	f, err := strconv.ParseFloat(text, 64)
	switch {
	case errors.Is(err, strconv.ErrRange):
		return 0, v.notConvertible(to, "beyond the float64 range")
	case err != nil || strings.ContainsAny(text, "xX_"): // Go syntax PostgreSQL never prints
		return 0, v.notConvertible(to, "not a number")
	}
	return f, nil
}

// Decimal returns the text of a numeric (or integer) value after checking
// that it is a finite decimal number: an optional minus sign, digits, and
// optionally a point and more digits, as PostgreSQL prints numeric, with
// its scale ("12.50" stays "12.50"). Hand it to a decimal library, or use
// [Value.Rat]. NaN, Infinity and -Infinity, which a numeric may hold, are
// not decimal numbers: they are an error wrapping [ErrNotConvertible], as
// is anything else that is not a plain decimal (float text such as
// "1e+100" included: read floats with [Value.Float64]).
func (v Value) Decimal() (string, error) {
	return v.decimal("decimal")
}

func (v Value) decimal(to string) (string, error) {
	text, err := v.present(to)
	if err != nil {
		return "", err
	}
	switch text {
	case "NaN", "Infinity", "-Infinity":
		return "", v.notConvertible(to, "not a finite number")
	}
	if !isDecimal(text) {
		return "", v.notConvertible(to, "not a decimal number")
	}
	return text, nil
}

// isDecimal reports whether s is -?[0-9]+(\.[0-9]+)?.
func isDecimal(s string) bool {
	s = strings.TrimPrefix(s, "-")
	whole, frac, point := strings.Cut(s, ".")
	return digits(whole) && (!point || digits(frac))
}

// digits reports whether s is one or more ASCII digits.
func digits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return s != ""
}

// Rat returns a numeric (or integer) value as an exact rational number.
// It accepts what [Value.Decimal] accepts; NaN and ±Infinity are an error
// wrapping [ErrNotConvertible].
func (v Value) Rat() (*big.Rat, error) {
	const to = "*big.Rat"
	text, err := v.decimal(to)
	if err != nil {
		return nil, err
	}
	r, _ := new(big.Rat).SetString(text) // a decimal always parses
	return r, nil
}

// Bool returns a boolean value: PostgreSQL prints true as "t" and false as
// "f"; "true" and "false", as hand-made changes may spell them, are read
// too. Other text is an error wrapping [ErrNotConvertible].
func (v Value) Bool() (bool, error) {
	const to = "bool"
	text, err := v.present(to)
	if err != nil {
		return false, err
	}
	switch text {
	case "t", "true":
		return true, nil
	case "f", "false":
		return false, nil
	}
	return false, v.notConvertible(to, `not "t" or "f"`)
}
