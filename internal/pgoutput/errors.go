package pgoutput

import (
	"errors"
	"fmt"

	"github.com/siphondb/siphon/canonical"
)

// Errors a [DecodeError] wraps, for errors.Is.
var (
	// ErrTruncated means a message ended before a field it announced.
	ErrTruncated = errors.New("message truncated")
	// ErrTrailingBytes means a message has bytes after its last field.
	ErrTrailingBytes = errors.New("unexpected bytes after the message")
	// ErrUnknownMessage means the message type is not one of protocol
	// version 1 (streaming and two-phase messages are never requested).
	ErrUnknownMessage = errors.New("unknown message type")
	// ErrUnknownRelation means a change names a relation id no Relation
	// message described.
	ErrUnknownRelation = errors.New("change for a relation not described by a Relation message")
	// ErrOutOfOrder means a message came where the protocol does not allow
	// it: a row change outside a transaction, a Begin inside one, a Commit
	// without Begin.
	ErrOutOfOrder = errors.New("message out of transaction order")
	// ErrInvalidTuple means a tuple's kind byte ('N', 'K', 'O') or a
	// column's kind byte ('n', 'u', 't') is not valid.
	ErrInvalidTuple = errors.New("invalid tuple data")
	// ErrColumnCount means a tuple has another number of columns than its
	// relation.
	ErrColumnCount = errors.New("tuple column count differs from its relation")
	// ErrBinaryValue means a value came in binary format, which siphon never
	// requests.
	ErrBinaryValue = errors.New("binary value in a text-mode stream")
)

// DecodeError reports a pgoutput message that could not be decoded.
type DecodeError struct {
	Type   byte // the message type byte, 0 for an empty message
	Offset int  // where in the message decoding stopped
	Err    error
}

func (e *DecodeError) Error() string {
	if e.Type == 0 {
		return fmt.Sprintf("pgoutput: %v", e.Err)
	}
	return fmt.Sprintf("pgoutput: message %q at byte %d: %v", e.Type, e.Offset, e.Err)
}

func (e *DecodeError) Unwrap() error { return e.Err }

// ResolveError reports that a [Resolver] could not complete a relation.
type ResolveError struct {
	Relation canonical.TableName
	Err      error
}

func (e *ResolveError) Error() string {
	return fmt.Sprintf("resolve column types of %s: %v", e.Relation, e.Err)
}

func (e *ResolveError) Unwrap() error { return e.Err }
