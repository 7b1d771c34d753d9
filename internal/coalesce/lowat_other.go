//go:build !linux

package coalesce

// lowWaterSupported: elsewhere only the larger reads apply.
const lowWaterSupported = false

func setLowWater(uintptr, int) error { return nil }
