package siphon

// Bounds of the apply's units, for tests: a stream of more than
// MaxUnitChangesForTest changes commits a unit before its end, and a
// transaction of more than MaxTapeBytesForTest bytes of values is not
// kept for a second attempt.
const (
	MaxUnitChangesForTest = maxUnitChanges
	MaxTapeBytesForTest   = maxTapeBytes
)
