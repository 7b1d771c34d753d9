package canonical

import (
	"math/rand/v2"
	"testing"
)

// TestSkipSafe checks the word-at-a-time skip against jsonSafe, byte by
// byte, on strings of safe bytes with one byte of every value at every
// place, and on random bytes.
func TestSkipSafe(t *testing.T) {
	naive := func(data []byte, i int) int {
		for ; i < len(data); i++ {
			if !jsonSafe[data[i]] {
				return i
			}
		}
		return i
	}
	check := func(data []byte, from int) {
		t.Helper()
		got, want := skipSafe(data, from), naive(data, from)
		// skipSafe stops at the word holding the first unsafe byte, or
		// where fewer than 8 bytes are left: never past it.
		if got > want || want-got >= 8 && got+8 <= len(data) {
			t.Fatalf("skipSafe(%q, %d) = %d, the first unsafe byte is at %d", data, from, got, want)
		}
	}
	base := []byte("customer 5d41402abc4b2a76b9719d911017c592 and more")
	for c := range 256 {
		for at := range base {
			data := append([]byte(nil), base...)
			data[at] = byte(c)
			for from := range 9 {
				check(data, from)
			}
		}
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range 100000 {
		data := make([]byte, r.IntN(40))
		for i := range data {
			data[i] = byte(0x20 + r.IntN(0x60)) // mostly safe
			if r.IntN(30) == 0 {
				data[i] = byte(r.IntN(256))
			}
		}
		check(data, 0)
	}
}
