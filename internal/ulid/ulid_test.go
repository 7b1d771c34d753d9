package ulid

import (
	"regexp"
	"testing"
	"time"
)

func TestULID(t *testing.T) {
	now := time.Date(2026, 11, 30, 5, 30, 0, 123_000_000, time.UTC)
	a, b := New(now), New(now.Add(time.Millisecond))
	if !regexp.MustCompile("^" + Pattern + "$").MatchString(a) {
		t.Fatalf("%q does not match Pattern", a)
	}
	if a == New(now) {
		t.Error("two ULIDs of one millisecond are equal: the random part is missing")
	}
	if a >= b {
		t.Errorf("%q does not sort before %q, made a millisecond later", a, b)
	}
	if got, ok := Time(a); !ok || !got.Equal(now) {
		t.Errorf("Time = %v, %v; want %v", got, ok, now)
	}
	for _, bad := range []string{"not-a-ulid-at-all-00000000", "short", ""} {
		if _, ok := Time(bad); ok {
			t.Errorf("Time(%q) accepted", bad)
		}
	}
}
