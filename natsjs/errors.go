package natsjs

import (
	"fmt"

	"github.com/siphondb/siphon/canonical"
)

// StreamMismatchError reports a stream a [Publisher] must not publish to:
// it is missing, does not capture exactly the prefix's subjects, or holds
// messages of another source (another database or slot), whose order and
// positions the Publisher cannot continue. Give each slot a stream of its
// own.
type StreamMismatchError struct {
	Stream  string
	Problem string
}

func (e *StreamMismatchError) Error() string {
	return fmt.Sprintf("natsjs: stream %q: %s", e.Stream, e.Problem)
}

// MessageTooLargeError reports a change whose message is larger than the
// NATS server accepts (its max_payload): raise max_payload, or keep such
// rows out of the publication.
type MessageTooLargeError struct {
	Subject string
	// Commit is the transaction's commit Position.
	Commit canonical.Position
	Size   int
	Max    int64
}

func (e *MessageTooLargeError) Error() string {
	return fmt.Sprintf("natsjs: the message for %s in the transaction committed at %v is %d bytes; the server takes at most %d (max_payload)",
		e.Subject, e.Commit, e.Size, e.Max)
}

// MessageError reports a message [Consume] cannot read, or one out of its
// place: a transaction's messages that are not followed by its commit
// marker, a message missing or repeated within a transaction. A stream
// written by a [Publisher] holds none.
type MessageError struct {
	Sequence uint64 // the message's stream sequence
	Subject  string
	Err      error
}

func (e *MessageError) Error() string {
	return fmt.Sprintf("natsjs: stream message %d (%s): %v", e.Sequence, e.Subject, e.Err)
}

func (e *MessageError) Unwrap() error { return e.Err }

// HistoryGapError reports that a stream no longer holds every transaction
// after the Position a consumer resumes from: its retention (MaxAge,
// MaxMsgs, MaxBytes) or a purge removed transactions the consumer has not
// seen. [Consume] refuses rather than skip them. The way out is a new
// snapshot of the source, or a stream that keeps its history longer than
// consumers stay away.
type HistoryGapError struct {
	Stream string
	After  canonical.Position
	// Oldest is the commit Position of the oldest transaction the stream
	// holds (whole or in part).
	Oldest canonical.Position
}

func (e *HistoryGapError) Error() string {
	return fmt.Sprintf("natsjs: stream %q no longer holds every transaction after %v (its oldest was committed at %v): the ones in between were removed; start from a new snapshot",
		e.Stream, e.After, e.Oldest)
}

// publishError reports that JetStream did not do what the Publisher
// asked: a message not acknowledged in time, refused, or stored at another
// sequence than expected; the stream not readable. It is retryable:
// [Publisher.Run] starts over from what the stream holds.
type publishError struct {
	op  string
	err error
}

func (e *publishError) Error() string { return fmt.Sprintf("natsjs: %s: %v", e.op, e.err) }

func (e *publishError) Unwrap() error { return e.err }
