package canonical

// Value is one column value in canonical form.
//
// A present value is the text the source's type output function prints for
// it, under fixed session settings (DateStyle ISO, TimeZone UTC,
// IntervalStyle postgres, extra_float_digits 3, bytea_output hex,
// lc_monetary C). That text is lossless for every type, built-in or
// user-defined, and the target's input function rebuilds the exact value
// from it. A snapshot row and the same row from the change stream hold equal
// Values.
//
// A Value is in one of three states, which are never confused: NULL, an
// unchanged TOAST value that the stream did not send, and present text (which
// may be empty). The zero Value is NULL.
type Value struct {
	text  string
	state valueState
}

type valueState uint8

const (
	stateNull valueState = iota
	statePresent
	stateUnchanged
)

// Text returns a present Value holding s.
func Text(s string) Value { return Value{text: s, state: statePresent} }

// Null returns the NULL Value.
func Null() Value { return Value{} }

// Unchanged returns the Value that stands for an unchanged TOASTed column
// whose content the source did not send with an update.
func Unchanged() Value { return Value{state: stateUnchanged} }

// IsNull reports whether v is NULL.
func (v Value) IsNull() bool { return v.state == stateNull }

// IsUnchanged reports whether v stands for an unchanged TOAST value.
func (v Value) IsUnchanged() bool { return v.state == stateUnchanged }

// Text returns the value's text and true when v is present; "" and false
// when it is NULL or unchanged.
func (v Value) Text() (string, bool) { return v.text, v.state == statePresent }

// String returns the text of a present value, "NULL" for NULL and
// "(unchanged)" for an unchanged TOAST value; for display only.
func (v Value) String() string {
	switch v.state {
	case statePresent:
		return v.text
	case stateUnchanged:
		return "(unchanged)"
	}
	return "NULL"
}

// Row holds a row's values in the order of its table's columns.
type Row []Value
