package canonical_test

import (
	"fmt"

	"github.com/siphondb/siphon/canonical"
)

// Parse, print and compare positions.
func ExampleParsePosition() {
	committed, err := canonical.ParsePosition("16/B374D848")
	if err != nil {
		fmt.Println(err)
		return
	}
	resume, _ := canonical.ParsePosition("16/b374d800")
	fmt.Println(committed, uint64(committed))
	fmt.Println(resume, committed.Compare(resume))

	_, err = canonical.ParsePosition("16-B374D848")
	fmt.Println(err)
	// Output:
	// 16/B374D848 97500059720
	// 16/B374D800 1
	// invalid position: "16-B374D848" is not of the form XXXXXXXX/XXXXXXXX
}
