package canonical

import (
	"errors"
	"fmt"
	"io"
)

// Recorder records a change stream as it is delivered, to replay it later
// with [Replay]: it writes the changes given to [Recorder.Emit] as a
// checked JSONL stream of kind [KindChanges] (with an [Encoder]), which
// [Recorder.Close] ends with the end record.
//
// Emit has the shape of StreamChanges' callback, so a live stream is
// recorded with StreamChanges(ctx, from, rec.Emit), or, to record what a
// handler receives while it runs, with StreamChanges(ctx, from,
// rec.Tee(handler.Handle)). Hand-made changes are recorded by calling Emit
// with them; their Positions must then be set as a stream's are (see
// [Change]): each transaction's commit after its begin, no transaction
// before the end of the one recorded before it.
//
// A transaction is recorded when its [OpCommit] is: the Recorder keeps the
// changes of the transaction in progress until then, and drops them if the
// transaction ends without one (the stream stopped, the handler failed), so
// the recording always ends at the last transaction handled, the Position
// StreamChanges returns, which is also the recording's end Position. A
// Recorder may therefore span several StreamChanges calls that each resume
// from the Position of the last OpCommit: a transaction cut short is
// delivered again whole. Because a transaction is held in memory, record
// very large transactions with BackupIncremental instead, which streams
// them; a snapshot is recorded as a snapshot stream (EmitCanonical), since
// changes and rows do not mix in one stream.
//
// The end record is written by Close: a process that dies before leaves a
// recording that reads as cut short ([ErrTruncated]) after its last
// complete transaction. Errors are final: after one, Emit and Close return
// it. A Recorder is not safe for concurrent use.
type Recorder struct {
	enc     *Encoder
	from    Position
	end     Position // the end of the last transaction recorded; from before
	tx      []Change // the transaction in progress, from its OpBegin
	inTx    bool
	started bool // header written
	closed  bool
	err     error
}

// NewRecorder returns a Recorder that writes to w a recording of the stream
// that continues from: the from given to StreamChanges, zero when it is
// not known (a zero from, hand-made changes). It is the recording's start,
// before which [Replay] refuses to resume. The Recorder writes nothing
// before the first transaction or Close.
func NewRecorder(w io.Writer, from Position) *Recorder {
	return &Recorder{enc: NewEncoder(w), from: from, end: from}
}

// SetKey makes the recording authenticated with key, as
// [Encoder.SetKey] does; it must be called before the first Emit.
func (r *Recorder) SetKey(key []byte) error { return r.enc.SetKey(key) }

// errRecorderClosed is returned by Emit after Close.
var errRecorderClosed = errors.New("canonical: record: the Recorder is closed")

// Emit records ch (see [Recorder]). It returns an error, and records
// nothing more, when ch does not fit the stream: an OpCommit with no
// transaction in progress, a row change outside one, Positions that go
// back; or when writing fails.
func (r *Recorder) Emit(ch Change) error {
	switch {
	case r.err != nil:
		return r.err
	case r.closed:
		return errRecorderClosed
	}
	if err := r.emit(ch); err != nil {
		r.err = err
		return err
	}
	return nil
}

func (r *Recorder) emit(ch Change) error {
	switch {
	case ch.Op == OpBegin:
		if ch.Position < r.end {
			return recordError(ch, fmt.Errorf("%w: the transaction commits at %v, before the end %v of what was recorded before it", ErrOrder, ch.Position, r.end))
		}
		clear(r.tx) // a transaction in progress was cut short: drop it
		r.tx, r.inTx = append(r.tx[:0], ch), true
		return nil
	case r.inTx && ch.Op == OpCommit:
		return r.commit(ch)
	case r.inTx:
		r.tx = append(r.tx, ch)
		return nil
	case ch.Op == OpMessage && (ch.Message == nil || !ch.Message.Transactional):
		if ch.Position < r.end {
			return recordError(ch, fmt.Errorf("%w: the message is at %v, before the end %v of what was recorded before it", ErrOrder, ch.Position, r.end))
		}
		if err := r.start(); err != nil {
			return err
		}
		return r.enc.WriteChange(&ch)
	}
	return recordError(ch, fmt.Errorf("%w: %v with no transaction in progress (no OpBegin)", ErrOrder, ch.Op))
}

// commit writes the transaction in progress, ended by commit.
func (r *Recorder) commit(commit Change) error {
	if begin := r.tx[0].Position; commit.Position <= begin {
		return recordError(commit, fmt.Errorf("%w: the commit's Position %v is not after %v, the commit LSN its begin announced", ErrInvalidRecord, commit.Position, begin))
	}
	if err := r.start(); err != nil {
		return err
	}
	for i := range r.tx {
		if err := r.enc.WriteChange(&r.tx[i]); err != nil {
			return err
		}
	}
	if err := r.enc.WriteChange(&commit); err != nil {
		return err
	}
	r.end = commit.Position
	clear(r.tx) // the rows may be large: let them go
	r.tx, r.inTx = r.tx[:0], false
	return nil
}

// start writes the header, once.
func (r *Recorder) start() error {
	if r.started {
		return nil
	}
	if err := r.enc.WriteHeader(Header{Kind: KindChanges, Start: r.from}); err != nil {
		return err
	}
	r.started = true
	return nil
}

// recordError is the error for a change that does not fit the stream.
func recordError(ch Change, err error) error {
	return &EncodeError{Record: ch.Op.String(), Table: ch.TableName(), Err: err}
}

// Tee returns an emit function that calls emit with each change and
// records it once emit returned nil: the handler receives exactly what the
// stream delivers, and the recording holds what it handled. An error of
// emit is returned as it is; an error of the Recorder stops the stream too
// (the handler has seen the change, the recording has not).
func (r *Recorder) Tee(emit func(Change) error) func(Change) error {
	return func(ch Change) error {
		if err := emit(ch); err != nil {
			return err
		}
		return r.Emit(ch)
	}
}

// Close drops a transaction still in progress, writes the end record (the
// end of the last transaction recorded, or the start Position when there
// was none) and flushes. It does not close the writer. It is safe to call
// more than once and returns the first call's result.
func (r *Recorder) Close() error {
	if r.closed || r.err != nil {
		return r.err
	}
	r.closed = true
	r.tx, r.inTx = nil, false
	if err := r.start(); err != nil {
		r.err = err
		return err
	}
	if err := r.enc.WriteEnd(r.end); err != nil {
		r.err = err
	}
	return r.err
}
