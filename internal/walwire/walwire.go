// Package walwire reads a logical replication session's wire: it decodes
// the walsender's messages into batches of items, answers its keepalives
// and sends status updates, in one goroutine, so the stream loop that
// consumes the batches never touches the connection.
package walwire

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/siphondb/siphon/canonical"
	"github.com/siphondb/siphon/internal/coalesce"
	"github.com/siphondb/siphon/internal/pgoutput"
)

const (
	// BatchSize is the most changes the reader hands over at once; it hands
	// over a partial batch before it waits for the socket.
	BatchSize = 64
	// BatchesInFlight bounds the batches decoded ahead of emit, so memory
	// stays bounded however large a transaction is.
	BatchesInFlight = 4
	// probeEvery is how often the reader asks the server for a keepalive
	// while the stream waits for the walsender to reach a position
	// (BackupIncremental's bound, the resume check).
	probeEvery = 200 * time.Millisecond
)

// ErrServerEndedStream is returned when the walsender ended the stream
// (CopyDone).
var ErrServerEndedStream = errors.New("the server ended the replication stream")

// ErrServerStopping is returned when the walsender is stopping (the
// server shuts down) and waits for a confirmation siphon cannot give; see
// stoppingPings.
var ErrServerStopping = errors.New("the server is shutting down")

// A stopping walsender (fast or smart shutdown) sends what it has, then
// asks for a reply again and again, right after each one, and exits only
// once the client confirms the last position it sent. PostgreSQL's own
// clients confirm it when idle; siphon confirms only transaction ends and
// heartbeats, and no heartbeat can be written while the server shuts
// down, so the walsender would hold the shutdown forever. stoppingPings
// reply requests in a row for a position past the acknowledged one, each
// within stoppingPingGap of the previous, end the stream instead: it is
// interrupted, and the walsender exits when the session closes. Outside a
// shutdown the walsender asks for a reply only after wal_sender_timeout/2
// without one, and siphon replies more often than that.
const (
	stoppingPings   = 3
	stoppingPingGap = 500 * time.Millisecond
)

// Kind says what an Item holds.
type Kind uint8

// The kinds of Item.
const (
	KindChange    Kind = iota // Change holds a decoded change
	KindKeepalive             // WALEnd holds the server's WAL end
	KindError                 // Err ended the session
	KindCaughtUp              // a catch-up read everything before WALEnd
)

// Item is what a reader hands to the stream loop, in stream order.
type Item struct {
	Kind   Kind
	Change canonical.Change
	WALEnd canonical.Position
	Err    error
}

// Config is what a Reader reads with.
type Config struct {
	Conn    *pgconn.PgConn    // the replication session, streaming
	Sock    *coalesce.Conn    // Conn's socket
	Decoder *pgoutput.Decoder // decodes the XLogData messages
	// Acked is the position the stream loop acknowledges; the reader
	// confirms it to the server in its status updates, once the
	// walsender has reached it.
	Acked *atomic.Uint64
	// Confirmed is the slot's confirmed position as the session starts:
	// the status updates confirm it until they can confirm an acknowledged
	// position (see Reader.reported).
	Confirmed canonical.Position
	// Probing, while set, has the reader ask the server for a keepalive
	// every probeEvery (the loop waits for the walsender to reach a
	// position).
	Probing     *atomic.Bool
	StatusEvery time.Duration // status update interval
	KeepAlive   time.Duration // status interval while the loop holds the reader back
}

// Reader owns the replication connection: it reads and decodes messages,
// answers keepalives and sends status updates, in one goroutine (Run). The
// stream loop never touches the connection: it takes batches from
// Batches, gives emptied ones back to Free, and publishes the acknowledged
// position through Config.Acked.
type Reader struct {
	conn        *pgconn.PgConn
	sock        *coalesce.Conn
	dec         *pgoutput.Decoder
	acked       *atomic.Uint64
	probing     *atomic.Bool
	statusEvery time.Duration
	keepAlive   time.Duration

	out  chan []Item // decoded batches, to the loop
	free chan []Item // emptied batches, back from the loop
	stop chan struct{}
	done chan struct{}

	batch      []Item
	nextStatus time.Time
	nextProbe  time.Time
	deadline   time.Time

	pings    int       // reply requests in a row past the acknowledged position
	lastPing time.Time // when the last one came

	// reached is the furthest WAL position the walsender's messages have
	// named in this session; confirmable is the position the status
	// updates confirm: the slot's at the session's start, or the last
	// acknowledged position the walsender had reached when it was read
	// (see reported).
	reached, confirmable canonical.Position

	// failed is set when the session broke or the server ended it: there
	// is no session left to confirm the final position on. Read it only
	// after done is closed.
	failed bool
}

// New returns a reader of cfg.Conn; Run starts it.
func New(cfg Config) *Reader {
	return &Reader{
		conn: cfg.Conn, sock: cfg.Sock, dec: cfg.Decoder, acked: cfg.Acked, probing: cfg.Probing,
		statusEvery: cfg.StatusEvery, keepAlive: cfg.KeepAlive, confirmable: cfg.Confirmed,
		out:  make(chan []Item, BatchesInFlight),
		free: make(chan []Item, BatchesInFlight+2),
		stop: make(chan struct{}),
		done: make(chan struct{}),
	}
}

// Batches are the decoded batches, in stream order; the last batch of a
// reader that failed ends with a KindError item.
func (w *Reader) Batches() <-chan []Item { return w.out }

// Free takes back the batches the loop emptied, for reuse.
func (w *Reader) Free() chan<- []Item { return w.free }

// Stop asks the reader to stop; a read it waits in returns at the
// connection's read deadline, which the caller sets to wake it. Stop is
// called once.
func (w *Reader) Stop() { close(w.stop) }

// Done is closed when Run returned.
func (w *Reader) Done() <-chan struct{} { return w.done }

// Acked returns the position the loop acknowledged last.
func (w *Reader) Acked() canonical.Position { return canonical.Position(w.acked.Load()) }

// Run reads until Stop or until the session fails; it closes Done.
func (w *Reader) Run() {
	defer close(w.done)
	w.batch = w.newBatch()
	// What was decoded goes to the loop before the reader waits for more:
	// batches follow what arrived together, and nothing decoded waits on
	// the network.
	w.sock.SetBeforeRead(w.flush)
	defer w.sock.SetBeforeRead(nil)
	// A first status update right away: it confirms the start position and,
	// when probing, asks for a keepalive.
	if err := w.sendStatus(w.probing.Load()); err != nil {
		w.fail(err)
		return
	}
	now := time.Now()
	w.nextStatus, w.nextProbe = now.Add(w.statusEvery), now.Add(probeEvery)
	for {
		w.armDeadline()
		select {
		case <-w.stop:
			w.sendStatus(false) // best effort: the slot learns the final position now
			return
		default:
		}
		msg, err := w.conn.ReceiveMessage(context.Background())
		if errors.Is(err, errWireStopped) {
			return
		}
		if err != nil {
			if isReadTimeout(err) {
				if err := w.timers(); err != nil {
					w.fail(err)
					return
				}
				continue
			}
			w.fail(err)
			return
		}
		switch m := msg.(type) {
		case *pgproto3.CopyData:
			err = w.copyData(m.Data)
		case *pgproto3.ErrorResponse:
			err = pgconn.ErrorResponseToPgError(m)
		case *pgproto3.CopyDone:
			err = ErrServerEndedStream
		}
		if err == errWireStopped {
			return
		}
		if err != nil {
			w.fail(err)
			return
		}
	}
}

var errWireStopped = errors.New("stopped")

// armDeadline sets the read deadline to the next timer, so a read returns
// in time to send a status update or a probe.
func (w *Reader) armDeadline() {
	d := w.nextStatus
	if w.probing.Load() && w.nextProbe.Before(d) {
		d = w.nextProbe
	}
	if !d.Equal(w.deadline) {
		w.conn.Conn().SetReadDeadline(d)
		w.deadline = d
	}
}

// timers sends the status update or probe that is due.
func (w *Reader) timers() error {
	now := time.Now()
	probe := w.probing.Load() && !now.Before(w.nextProbe)
	if probe || !now.Before(w.nextStatus) {
		if err := w.sendStatus(probe); err != nil {
			return err
		}
		w.nextStatus = now.Add(w.statusEvery)
		if probe {
			w.nextProbe = now.Add(probeEvery)
		}
	}
	w.deadline = time.Time{} // re-arm: the old deadline has passed
	return nil
}

// reported is the position the status updates confirm: the last
// position the stream loop acknowledged that the walsender has reached in
// this session, or the slot's confirmed position at the session's start
// until there is one. Only these: a position acknowledged is one a resume
// can be vouched for from (a transaction's end, a heartbeat's position),
// and the slot's own was one. Confirming the walsender's reach instead,
// when the acknowledged position lies past it (the SQL catch-up read
// ahead of it), would put the slot at a position nothing vouches for, so
// that a consumer resuming from its last transaction, behind it, would be
// refused; and a position behind the slot's, which a walsender reading
// up from the slot's restart_lsn names in its keepalives, would move the
// slot back, as a walsender takes it as it is.
//
// Why nothing past the walsender's reach: a confirmation may move the
// slot's restart_lsn, and PostgreSQL keeps a logical slot's candidate
// restart point in shared memory from one session to the next: one that a
// previous session found past the position it confirmed is taken up by
// the first confirmation that reaches its record, whether or not the
// walsender of the new session has read that far. The new walsender
// starts reading at the old restart_lsn, so a checkpoint right then
// removes WAL it is still reading ("requested WAL segment ... has already
// been removed", a stream that fails, and an incremental backup from a
// Position past the slot's). Confirming nothing past what the walsender's
// messages have named keeps the restart point behind its reading: a
// message names at most how far it has read, and the slot's confirmed
// position at the session's start is before any stale candidate's record.
func (w *Reader) reported() canonical.Position {
	if acked := canonical.Position(w.acked.Load()); acked <= w.reached {
		w.confirmable = max(w.confirmable, acked)
	}
	return w.confirmable
}

// sendStatus confirms the reported position, as write, flush and apply
// position alike (pglogrepl would otherwise fill in flush and apply from
// write).
func (w *Reader) sendStatus(reply bool) error {
	pos := pglogrepl.LSN(w.reported())
	err := pglogrepl.SendStandbyStatusUpdate(context.Background(), w.conn, pglogrepl.StandbyStatusUpdate{
		WALWritePosition: pos, WALFlushPosition: pos, WALApplyPosition: pos,
		ClientTime: time.Now(), ReplyRequested: reply,
	})
	if err != nil {
		return fmt.Errorf("send status update: %w", err)
	}
	return nil
}

func (w *Reader) copyData(data []byte) error {
	if len(data) == 0 {
		return nil
	}
	switch data[0] {
	case pglogrepl.PrimaryKeepaliveMessageByteID:
		ka, err := pglogrepl.ParsePrimaryKeepaliveMessage(data[1:])
		if err != nil {
			return err
		}
		w.reached = max(w.reached, canonical.Position(ka.ServerWALEnd))
		if ka.ReplyRequested {
			if w.stopping(canonical.Position(ka.ServerWALEnd)) {
				return ErrServerStopping
			}
			if err := w.sendStatus(false); err != nil {
				return err
			}
			w.nextStatus = time.Now().Add(w.statusEvery)
		}
		w.batch = append(w.batch, Item{Kind: KindKeepalive, WALEnd: canonical.Position(ka.ServerWALEnd)})
	case pglogrepl.XLogDataByteID:
		const header = 1 + 24 // type, WAL start, WAL end, send time
		if len(data) < header+1 {
			return fmt.Errorf("short XLogData message (%d bytes)", len(data))
		}
		w.reached = max(w.reached, canonical.Position(binary.BigEndian.Uint64(data[1+8:])))
		w.batch = append(w.batch, Item{Kind: KindChange})
		it := &w.batch[len(w.batch)-1]
		ok, err := w.dec.Decode(data[header:], &it.Change)
		if err != nil || !ok {
			w.batch = w.batch[:len(w.batch)-1]
			return err
		}
		if len(w.batch) == cap(w.batch) {
			return w.flush()
		}
	}
	return nil
}

// stopping counts a reply request for walEnd and reports whether it makes
// stoppingPings in a row (see stoppingPings).
func (w *Reader) stopping(walEnd canonical.Position) bool {
	now := time.Now()
	switch {
	case walEnd <= w.reported():
		w.pings = 0 // the reply confirms it: the walsender can exit
	case w.pings > 0 && now.Sub(w.lastPing) < stoppingPingGap:
		w.pings++
	default:
		w.pings = 1
	}
	w.lastPing = now
	return w.pings >= stoppingPings
}

// flush hands the current batch to the stream loop. While the loop is busy
// (a slow emit) it keeps sending status updates, since it cannot read the
// server's keepalives meanwhile. It returns errWireStopped when the loop asked
// the reader to stop.
func (w *Reader) flush() error {
	if len(w.batch) == 0 {
		return nil
	}
	b := w.batch
	w.batch = w.newBatch()
	select {
	case w.out <- b:
		return nil
	default:
	}
	t := time.NewTimer(w.keepAlive)
	defer t.Stop()
	for {
		select {
		case w.out <- b:
			return nil
		case <-w.stop:
			w.sendStatus(false)
			return errWireStopped
		case <-t.C:
			// A failed send shows up as a read error next.
			w.sendStatus(false)
			w.nextStatus = time.Now().Add(w.statusEvery)
			t.Reset(w.keepAlive)
		}
	}
}

// fail hands what was decoded, then err, to the stream loop.
func (w *Reader) fail(err error) {
	w.failed = true
	w.batch = append(w.batch, Item{Kind: KindError, Err: err})
	b := w.batch
	w.batch = nil
	select {
	case w.out <- b:
	case <-w.stop:
	}
}

func (w *Reader) newBatch() []Item {
	select {
	case b := <-w.free:
		return b
	default:
		return make([]Item, 0, BatchSize)
	}
}

func isReadTimeout(err error) bool {
	var netErr net.Error
	return errors.Is(err, os.ErrDeadlineExceeded) || errors.As(err, &netErr) && netErr.Timeout()
}

// confirmTimeout bounds how long a stream that ends waits for the server
// to confirm its final position (see ConfirmFinal).
const confirmTimeout = 15 * time.Second

// ErrNotConfirmed is returned when the server did not confirm the final
// position in time.
var ErrNotConfirmed = errors.New("the server did not confirm the final position")

// ConfirmFinal makes sure the walsender took in the final reported
// position (the acknowledged one, unless the walsender never reached it:
// see reported) before the session closes, once Done is closed. A status
// update on its own is only sent: a walsender that is terminated or whose
// session closes before it reads the update leaves the slot behind, which
// a loaded machine makes likely. The walsender handles its client's
// messages in order, so once it answers the CopyDone sent after the
// update (with its own CopyDone, then CommandComplete and ReadyForQuery),
// the update has been applied to the slot. A walsender in the middle of a
// large transaction answers only once it has sent it all, but it reads
// replies as it writes, so confirmed (the slot's position as the server
// shows it) ends the wait too. It returns ErrNotConfirmed when neither
// happened within confirmTimeout, or the error that broke the session.
func (w *Reader) ConfirmFinal(confirmed func(context.Context) (canonical.Position, error)) error {
	if w.failed || w.conn.IsClosed() {
		return nil // nothing to confirm on: the caller resumes from its own Position
	}
	want := w.reported()
	if err := w.sendStatus(false); err != nil {
		return err
	}
	w.conn.Frontend().Send(&pgproto3.CopyDone{})
	if err := w.conn.Frontend().Flush(); err != nil {
		return fmt.Errorf("end the replication stream: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), confirmTimeout)
	defer cancel()
	deadline, _ := ctx.Deadline()
	const recheck = 100 * time.Millisecond
	nextCheck := time.Now().Add(recheck)
	for {
		w.conn.Conn().SetReadDeadline(nextCheck)
		msg, err := w.conn.ReceiveMessage(context.Background())
		switch m := msg.(type) {
		case *pgproto3.ReadyForQuery:
			return nil
		case *pgproto3.ErrorResponse:
			return pgconn.ErrorResponseToPgError(m)
		}
		if err != nil && !isReadTimeout(err) {
			return fmt.Errorf("end the replication stream: %w", err)
		}
		if time.Now().Before(nextCheck) {
			continue // the rest of what the walsender was sending
		}
		if pos, err := confirmed(ctx); err == nil && pos >= want {
			return nil
		}
		if !time.Now().Before(deadline) {
			return ErrNotConfirmed
		}
		nextCheck = time.Now().Add(recheck)
	}
}
