package natsjs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/siphondb/siphon"
	"github.com/siphondb/siphon/canonical"
)

// Config configures a [Publisher].
type Config struct {
	// Stream names the JetStream stream the changes go to. It must exist,
	// capture exactly Prefix+".>" (see [StreamConfig]) and hold this
	// slot's messages only. Required.
	Stream string
	// Prefix is the first token (or tokens) of every subject. Defaults to
	// [DefaultPrefix].
	Prefix string
	// Slot is the replication slot to read the changes through; it is
	// given to siphon.Connect with siphon.WithSlot. Required.
	Slot string
	// From is where to start when the stream holds none of the slot's
	// messages yet, for example the Position of the snapshot the stream
	// continues. Defaults to zero: where the slot stands (a missing slot
	// is created where the server's WAL stands).
	From canonical.Position
	// MaxChangesPerMessage lets a message hold up to this many changes:
	// consecutive changes of one transaction on one subject (the rows a
	// statement writes to one table, say) travel together. JetStream's
	// work, and most of a Publisher's, goes by the message, so large
	// transactions publish several times faster. A run of changes is split
	// where a message would pass the largest the server and the stream
	// take (max_payload, MaxMsgSize). Schema changes and commit markers are
	// always messages of their own. [Consume] reads such a message as the
	// changes it holds; code that reads the messages itself must know
	// their form (see [HeaderChanges] and the package documentation), so
	// upgrade consumers before Publishers. A good value is 1000.
	// Defaults to 1: a message per change.
	MaxChangesPerMessage int
	// MaxPending bounds the messages published and not yet acknowledged
	// by JetStream, and so the memory a transaction takes however large
	// it is. Defaults to 1024.
	MaxPending int
	// MaxPendingBytes bounds the bytes of those messages. Defaults to
	// 8 MiB.
	MaxPendingBytes int
	// AckWait is how long to wait for JetStream to acknowledge a message
	// before starting over. Defaults to 10 s.
	AckWait time.Duration
	// MaxRetryWait is the longest pause between attempts after a failure
	// (NATS unreachable, a stream without a leader, a broken replication
	// connection); pauses start at 100 ms and double. Defaults to 5 s.
	MaxRetryWait time.Duration
	// Logger receives state changes (started, resumed, retrying), never a
	// line per change. Defaults to a logger that passes warnings and
	// errors to [slog.Default] and drops the rest.
	Logger *slog.Logger
	// Key signs each schema change message (see [HeaderMAC]), so that
	// consumers holding it ([ConsumeConfig].Keys) run only the schema
	// changes this Publisher published. At least 32 random bytes, kept
	// from those who may publish on the stream's subjects. Defaults to
	// none: schema change messages are unsigned, and [Consume] refuses
	// them unless [ConsumeConfig].UnauthenticatedSchemaChanges.
	Key []byte
}

// The defaults of Config.
const (
	defaultMaxPending      = 1024
	defaultMaxPendingBytes = 8 << 20
	defaultAckWait         = 10 * time.Second
	defaultMaxRetryWait    = 5 * time.Second
	minRetryWait           = 100 * time.Millisecond
)

// Publisher publishes a slot's change stream to a JetStream stream: one
// message per change on its table's subject (or per run of changes, see
// [Config].MaxChangesPerMessage), a commit marker after each
// transaction, the slot acknowledged only once JetStream has stored every
// message of the transaction. See the package documentation for the
// messages and the guarantees.
type Publisher struct {
	cfg Config
	nc  *nats.Conn
	js  jetstream.JetStream
	log *slog.Logger
}

// NewPublisher returns a Publisher that publishes through nc as cfg says.
// It checks cfg and fills in its defaults; nothing is sent until
// [Publisher.Run].
func NewPublisher(nc *nats.Conn, cfg Config) (*Publisher, error) {
	if nc == nil {
		return nil, errors.New("natsjs: new publisher: the NATS connection is nil")
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	// A JetStream context of its own: its pending acknowledgements are the
	// Publisher's alone, and time out rather than pile up.
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(cfg.MaxPending+1),
		jetstream.WithPublishAsyncTimeout(cfg.AckWait))
	if err != nil {
		return nil, fmt.Errorf("natsjs: new publisher: %w", err)
	}
	return &Publisher{cfg: cfg, nc: nc, js: js, log: cfg.Logger.With("stream", cfg.Stream, "slot", cfg.Slot)}, nil
}

// validate checks c and sets its defaults.
func (c *Config) validate() error {
	fail := func(format string, args ...any) error {
		return fmt.Errorf("natsjs: new publisher: "+format, args...)
	}
	c.Prefix = orDefault(c.Prefix)
	switch {
	case c.Stream == "":
		return fail("Config.Stream is empty: name the stream to publish to")
	case c.Slot == "":
		return fail("Config.Slot is empty: name the replication slot to read")
	case c.MaxPending < 0 || c.MaxPendingBytes < 0 || c.AckWait < 0 || c.MaxRetryWait < 0 || c.MaxChangesPerMessage < 0:
		return fail("a negative limit in Config: leave it zero for the default")
	}
	if err := checkPrefix(c.Prefix); err != nil {
		return fail("Config.Prefix: %w", err)
	}
	if c.Key != nil && len(c.Key) < canonical.MinKeyBytes {
		return fail("Config.Key has %d bytes: use at least %d random bytes", len(c.Key), canonical.MinKeyBytes)
	}
	if c.MaxChangesPerMessage == 0 {
		c.MaxChangesPerMessage = 1
	}
	if c.MaxPending == 0 {
		c.MaxPending = defaultMaxPending
	}
	if c.MaxPendingBytes == 0 {
		c.MaxPendingBytes = defaultMaxPendingBytes
	}
	if c.AckWait == 0 {
		c.AckWait = defaultAckWait
	}
	if c.MaxRetryWait == 0 {
		c.MaxRetryWait = defaultMaxRetryWait
	}
	if c.Logger == nil {
		c.Logger = slog.New(warnAndAbove{})
	}
	return nil
}

// checkPrefix checks that prefix is one or more subject tokens without
// wildcards.
func checkPrefix(prefix string) error {
	for _, token := range strings.Split(prefix, ".") {
		if token == "" || strings.ContainsAny(token, "*> \t\r\n") {
			return fmt.Errorf("%q is not a subject prefix (tokens separated by '.', none empty, no '*', '>' or white space)", prefix)
		}
	}
	return nil
}

// Run streams the slot's changes from dsn into the stream until ctx is
// cancelled, then returns the end Position of the last transaction the
// stream holds, and nil. opts go to siphon.Connect (WithTables,
// WithPublication, ...), with siphon.WithSlot(Config.Slot) last.
//
// Run resumes from what the stream holds, not from a position kept
// elsewhere: after the last transaction whose commit marker it holds, and
// when the stream ends inside a transaction (a publisher stopped half way
// through), without publishing again the messages the stream has. When
// publishing fails (NATS unreachable, a stream without a leader, a message
// not acknowledged within AckWait) or the replication connection breaks,
// Run waits a moment and starts over the same way; the slot was not
// acknowledged past what JetStream stored, so nothing is lost. Run returns
// an error for what starting over cannot mend: a stream that does not fit
// ([*StreamMismatchError]), a slot that cannot resume
// ([*siphon.ResumeGapError]), a change too large for NATS
// ([*MessageTooLargeError]), a failed connection to the database. A
// Publisher runs one Run at a time.
func (p *Publisher) Run(ctx context.Context, dsn string, opts ...siphon.Option) (canonical.Position, error) {
	c, err := siphon.Connect(ctx, dsn, append(opts, siphon.WithSlot(p.cfg.Slot))...)
	if err != nil {
		return 0, fmt.Errorf("natsjs: run: %w", err)
	}
	defer c.Close()
	// Read through siphon's sessions, whose search_path the database's
	// owner cannot set.
	systemID, err := c.SystemID(ctx)
	if err != nil {
		return 0, fmt.Errorf("natsjs: run: %w", err)
	}
	var held canonical.Position
	wait := minRetryWait
	for {
		a := p.newAttempt(ctx, systemID)
		err := a.run(c)
		if a.last != 0 {
			held = a.last
		}
		if ctx.Err() != nil {
			return p.settled(held, systemID), nil
		}
		if !retryable(err) {
			return held, err
		}
		if a.published > 0 {
			wait = minRetryWait
		}
		p.log.Warn("natsjs: publishing stopped; starting over from what the stream holds", "err", err, "in", wait)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return p.settled(held, systemID), nil
		case <-t.C:
		}
		wait = min(2*wait, p.cfg.MaxRetryWait)
	}
}

// settled returns what the stream holds when Run stops: held, the last
// transaction whose acknowledgements Run saw, or the stream's last commit
// marker when that is further (a Run stopped while acknowledgements were
// in flight did not see those of messages JetStream stored). It asks the
// stream for at most AckWait; a stream it cannot read leaves held.
func (p *Publisher) settled(held canonical.Position, systemID string) canonical.Position {
	ctx, cancel := context.WithTimeout(context.Background(), p.cfg.AckWait)
	defer cancel()
	// Messages the client is to send again (JetStream did not answer them)
	// are settled first.
	select {
	case <-p.js.PublishAsyncComplete():
	case <-ctx.Done():
	}
	if inStream, err := p.newAttempt(ctx, systemID).resume(); err == nil && inStream > held {
		return inStream
	}
	return held
}

// retryable reports whether starting over may mend err: a failure to
// publish or to read the stream, a broken replication connection, a slot
// still held by a stopped session.
func retryable(err error) bool {
	var pe *publishError
	return errors.As(err, &pe) || errors.As(err, new(*siphon.StreamInterruptedError)) || errors.Is(err, siphon.ErrSlotInUse)
}

// StreamConfig returns a stream configuration fit for a [Publisher] with
// this prefix ("" means [DefaultPrefix]): the subjects Prefix+".>", file
// storage, and JetStream's defaults otherwise (a two-minute duplicate
// window, no limits). Set Replicas, limits and placement on it as needed
// before creating the stream. Leave AllowDirect off on a stream of several
// replicas: a Publisher reads the stream's last messages to resume, and a
// direct get may be answered by a replica that lags behind the leader.
func StreamConfig(name, prefix string) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:     name,
		Subjects: []string{orDefault(prefix) + ".>"},
		Storage:  jetstream.FileStorage,
	}
}
