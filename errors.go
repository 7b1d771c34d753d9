package siphon

import "errors"

// Errors of the Conn itself that callers can branch on with errors.Is.
var (
	// ErrClosed means the Conn was closed: make a new one with Connect.
	ErrClosed = errors.New("siphon: the Conn is closed")
	// ErrAlreadyStreaming means the Conn is streaming its slot already
	// (StreamChanges, BackupIncremental or Replicate): a slot is read by
	// one stream at a time; wait for that one to return, or use a Conn
	// with another slot.
	ErrAlreadyStreaming = errors.New("siphon: this Conn is already streaming its slot")
	// ErrNilCallback means a callback argument is nil.
	ErrNilCallback = errors.New("siphon: the callback is nil")
)

// Retryable reports whether err says the operation may succeed when it is
// tried again as it was, with nothing to fix first: the connection broke
// ([*StreamInterruptedError], a network error, a server shutting down or
// out of connections for now), or another session holds what it needs for
// now ([ErrSlotInUse], [ErrApplyInProgress], a [*SlotBlockedError]).
// Errors that need a change first (a [*ResumeGapError], a
// [*SchemaChangeError], a [*SchemaIncompatibleError], an [*OptionError],
// a checksum error...) are not retryable, nor is a cancelled ctx.
func Retryable(err error) bool {
	var blocked *SlotBlockedError
	switch {
	case err == nil:
		return false
	case errors.Is(err, ErrStreamInterrupted), errors.Is(err, ErrSlotInUse), errors.Is(err, ErrApplyInProgress),
		errors.As(err, &blocked):
		return true
	}
	return isInterruption(err)
}
