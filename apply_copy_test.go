package siphon

import (
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/siphondb/siphon/canonical"
)

// TestAppendCopyRow checks COPY's text format against the escapes done one
// by one, on values with every byte at every place and on random bytes:
// the word-at-a-time skip of plainPrefix must never pass a byte that
// needs an escape.
func TestAppendCopyRow(t *testing.T) {
	escape := strings.NewReplacer(`\`, `\\`, "\n", `\n`, "\r", `\r`, "\t", `\t`)
	check := func(values ...string) {
		t.Helper()
		row := canonical.Row{canonical.Null()}
		want := `\N`
		for _, v := range values {
			row = append(row, canonical.Text(v))
			want += "\t" + escape.Replace(v)
		}
		got, err := appendCopyRow(nil, row)
		if err != nil || string(got) != want+"\n" {
			t.Fatalf("appendCopyRow(%q) = %q, %v; want %q", values, got, err, want+"\n")
		}
	}
	base := "customer 5d41402abc4b2a76b9719d911017c592"
	for c := range 256 {
		for at := range base {
			check(base[:at]+string([]byte{byte(c)})+base[at+1:], base)
		}
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range 100000 {
		b := make([]byte, r.IntN(40))
		for i := range b {
			b[i] = byte(0x20 + r.IntN(0x60))
			if r.IntN(20) == 0 {
				b[i] = byte(r.IntN(256))
			}
		}
		check(string(b))
	}
}
