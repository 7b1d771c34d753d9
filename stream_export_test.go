package siphon

import (
	"context"

	"github.com/siphondb/siphon/canonical"
)

// What the external tests of the stream need from the inside.

// CatchUpForTest tunes the SQL catch-up of a Conn's streams (see
// catchUpSettings and the catchUp... constants in stream_sql.go).
type CatchUpForTest struct {
	// StartAt is the least backlog (bytes of WAL) that starts a catch-up;
	// 0 makes every stream with a backlog start with one, negative none.
	StartAt int64
	// SwitchAt: once the catch-up read what was there when it started, it
	// switches to the walsender when less WAL than this is left; 0 means
	// the default.
	SwitchAt int64
	// MinChunk and MaxChunk bound a chunk's WAL (0: the defaults);
	// RedecodeRatio 0 makes every chunk MinChunk long.
	MinChunk, MaxChunk, RedecodeRatio int64
	// Workers is the number of sessions reading chunks (0: the default).
	Workers int
}

// SetCatchUpForTest sets c's catch-up tuning; call it before streaming.
func (c *Conn) SetCatchUpForTest(t CatchUpForTest) {
	d := catchUpSettings{}.orDefaults()
	d.startAt, d.redecodeRatio = t.StartAt, t.RedecodeRatio
	for _, f := range []struct{ to, from *int64 }{{&d.switchAt, &t.SwitchAt}, {&d.minChunk, &t.MinChunk}, {&d.maxChunk, &t.MaxChunk}} {
		if *f.from > 0 {
			*f.to = *f.from
		}
	}
	if t.MinChunk > 0 {
		d.leftShare = 0 // every chunk at least MinChunk, as the test says
	}
	if t.Workers > 0 {
		d.workers = t.Workers
	}
	c.catchUpTuning = d
}

// NoCatchUpForTest makes c's streams read through the walsender only.
func (c *Conn) NoCatchUpForTest() { c.catchUpTuning = catchUpSettings{set: true, startAt: -1} }

// CatchUpRedecodeRatioForTest is the default of CatchUpForTest.RedecodeRatio.
const CatchUpRedecodeRatioForTest = catchUpRedecodeRatio

// CatchUpSlotPrefixForTest starts the names of the catch-up's copies of the slot.
const CatchUpSlotPrefixForTest = catchUpSlotPrefix

// AdvanceSlotForTest moves c's slot to pos as the catch-up does.
func (c *Conn) AdvanceSlotForTest(ctx context.Context, pos canonical.Position) error {
	return c.advanceSlot(ctx, pos)
}
