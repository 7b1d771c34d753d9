package repository

// The package's errors, in one place: sentinels for conditions without
// fields (errors.Is), typed errors for those with fields (errors.As), each
// condition matched one way only, each message saying what to do.

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/siphondb/siphon/canonical"
)

// Errors callers can branch on with errors.Is.
var (
	// ErrClosed means the Repository was closed: open it again.
	ErrClosed = errors.New("repository: used after Close")
	// ErrNilArgument means an argument a call needs is nil (a Conn, a
	// bucket); the error wrapping it names the argument.
	ErrNilArgument = errors.New("repository: a required argument is nil")
	// ErrNoChain means the repository holds no chain that can serve the
	// call: it is empty, the chain named does not exist (or was expired),
	// or no chain's base was taken at or before the target of a restore.
	// The error wrapping it says which.
	ErrNoChain = errors.New("repository: no such chain")
	// ErrNeedsKey means an object is encrypted and the repository was
	// opened without WithKey: open it with the key (or the previous key)
	// it was written with.
	ErrNeedsKey = errors.New("repository: object is encrypted: open the repository WithKey")
	// ErrUnsupportedSeek means a link reader was asked to seek somewhere
	// other than its start or its current offset: links are read from the
	// bucket as streams (siphon's RestoreChain and VerifyChain need no
	// more).
	ErrUnsupportedSeek = errors.New("repository: a link reader seeks only to its start or its current offset")
)

// OptionError reports an invalid Option given to Open or New, or an
// invalid field of a call's options struct, before anything was written.
type OptionError struct {
	Option  string // the With... function or the Options field
	Problem string // what is wrong
	Fix     string // how to fix it
}

func (e *OptionError) Error() string {
	return fmt.Sprintf("repository: %s: %s: %s", e.Option, e.Problem, e.Fix)
}

// IntegrityError reports an object of the repository whose bytes are not
// what was written: a changed byte, an object cut short, an object swapped
// with another one (of the same chain, of another chain or repository),
// or one encrypted with a key the repository does not hold. Nothing read
// from it was handed on as valid: a restore that meets one stops before
// anything of the chain is applied (see [Repository.Restore]).
type IntegrityError struct {
	// Object is the object's key, from "chains/" on (the key under the
	// repository's prefix).
	Object string
	// Problem says what did not check out.
	Problem string
}

func (e *IntegrityError) Error() string {
	return fmt.Sprintf("repository: object %s refused: %s; restore it from a copy of the bucket, or expire its chain and take a new one",
		e.Object, e.Problem)
}

// ConflictError is returned when another writer added to the same chain
// first: two writers built on the same manifest generation and the other
// one's manifest was written first. This writer's link was not added (its
// object is deleted, or removed by the next Expire) and the chain is as
// the other writer left it. Run one writer per chain; to add a link, call
// again: it continues from the chain's new last link.
type ConflictError struct {
	Chain string
	// Generation is the manifest generation both writers wrote.
	Generation int
	// Writer is the id of the writer that won, as its manifest records it
	// ("" when its manifest could not be read).
	Writer string
}

func (e *ConflictError) Error() string {
	who := "another writer"
	if e.Writer != "" {
		who = "writer " + e.Writer
	}
	return fmt.Sprintf("repository: chain %s: %s wrote manifest generation %d first; this link was not added: "+
		"run one writer per chain, and call again to continue from the chain's new last link", e.Chain, who, e.Generation)
}

// MismatchError is returned by Repository.AddLink when the incremental
// taken does not belong to the chain: another source cluster, timeline or
// slot than the chain's base, or, in a keyed repository, not authenticated
// with the repository's stream key. It is found on the incremental's
// header, before more of it is read; nothing was added to the chain.
type MismatchError struct {
	Chain string
	// What differs, for example "system identifier".
	What string
	// Want is the chain's, Got what was found.
	Want, Got string
	// Fix says what to do.
	Fix string
}

func (e *MismatchError) Error() string {
	return fmt.Sprintf("repository: chain %s: the link's %s is %q, the chain's %q: %s", e.Chain, e.What, e.Got, e.Want, e.Fix)
}

// noChain returns an error wrapping ErrNoChain that says why.
func noChain(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrNoChain, fmt.Sprintf(format, args...))
}

// errorf makes an error with the "repository: " prefix once, however many
// of this package's errors it wraps.
func errorf(format string, args ...any) error {
	err := fmt.Errorf(format, args...)
	return &prefixedError{msg: strings.ReplaceAll(err.Error(), ": repository: ", ": "), err: err}
}

// prefixedError is an error of errorf.
type prefixedError struct {
	msg string
	err error
}

func (e *prefixedError) Error() string { return e.msg }
func (e *prefixedError) Unwrap() error { return e.err }

// describeTarget prints a restore target for an error message.
func describeTarget(at time.Time, pos canonical.Position) string {
	switch {
	case !at.IsZero() && pos != 0:
		return fmt.Sprintf("time %s and position %v", at.UTC().Format(time.RFC3339Nano), pos)
	case !at.IsZero():
		return "time " + at.UTC().Format(time.RFC3339Nano)
	case pos != 0:
		return "position " + pos.String()
	}
	return "the newest chain"
}
