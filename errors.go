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
