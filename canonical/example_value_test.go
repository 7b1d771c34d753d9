package canonical_test

import (
	"errors"
	"fmt"
	"math/big"
	"time"

	"github.com/siphondb/siphon/canonical"
)

// Read the old and new values of an update as Go types. The text stays
// the lossless form; the conversions refuse what they cannot read exactly.
func ExampleChange_OldValue() {
	ch := canonical.Change{
		Op:      canonical.OpUpdate,
		Columns: []canonical.Column{{Name: "id", Type: "bigint"}, {Name: "total", Type: "numeric(12,2)"}, {Name: "paid_at", Type: "timestamp with time zone"}},
		New:     canonical.Row{canonical.Text("9007199254740993"), canonical.Text("12.00"), canonical.Text("2026-11-30 05:00:00.123456+00")},
		Old:     canonical.Row{canonical.Text("9007199254740993"), canonical.Text("10.50"), canonical.Null()},
	}
	id, _ := ch.Value("id")
	n, _ := id.Int64()
	now, _ := ch.Value("total")
	was, _ := ch.OldValue("total")
	after, _ := now.Rat()
	before, _ := was.Rat()
	fmt.Println("order", n, "total up by", new(big.Rat).Sub(after, before).FloatString(2))

	paidAt, _ := ch.Value("paid_at")
	at, _ := paidAt.Time()
	fmt.Println("paid at", at.Format(time.RFC3339Nano))
	wasPaid, _ := ch.OldValue("paid_at")
	_, err := wasPaid.Time()
	fmt.Println(errors.Is(err, canonical.ErrNull), err)

	_, err = canonical.Text("NaN").Decimal()
	fmt.Println(errors.Is(err, canonical.ErrNotConvertible), err)
	// Output:
	// order 9007199254740993 total up by 1.50
	// paid at 2026-11-30T05:00:00.123456Z
	// true canonical: convert NULL to time.Time: NULL value
	// true canonical: convert "NaN" to decimal: not convertible: not a finite number
}
