package siphon

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"time"

	"go.opentelemetry.io/otel/metric"

	"github.com/siphondb/siphon/canonical"
	"github.com/siphondb/siphon/pgdump"
)

// Option configures a [Conn]. Options are checked by [Connect], which returns
// an [*OptionError] saying how to fix an invalid one.
type Option func(*options)

// options holds every setting of a Conn. Defaults live in defaultOptions.
type options struct {
	logger         *slog.Logger
	slot           string
	publication    string
	tables         []string
	slotRetry      SlotRetry
	statusInterval time.Duration
	heartbeat      time.Duration
	progress       func(Progress)
	copySessions   int
	localOnly      bool // WithLocalChangesOnly
	failover       bool // WithFailoverSlot
	// triggersOnApply: apply as an ordinary session (WithTriggersOnApply).
	triggersOnApply bool
	// keyless is what happens to tables without a usable replica
	// identity; keylessChosen tells WithKeylessTables was given.
	keyless       KeylessTables
	keylessChosen bool
	// noSchemaCapture: do not install the capture of schema changes.
	noSchemaCapture bool
	// partitionRoots: publish partitions under their roots
	// (WithPartitionRoots).
	partitionRoots bool
	// trustedSchemaRoles are the source roles whose
	// schema changes apply runs; roleDependentSchemaChanges lets it run
	// statements whose meaning depends on who runs them.
	trustedSchemaRoles         []string
	roleDependentSchemaChanges bool
	// source is set by the options only a source needs.
	source bool

	// Authentication.
	// streamKeys are WithStreamKey's keys, the current one first (nil:
	// none); streamKeyProblem what is wrong with them, if anything.
	streamKeys       [][]byte
	streamKeyProblem string

	meterProvider metric.MeterProvider
}

func defaultOptions() options {
	return options{
		logger:         slog.New(warnAndAbove{}),
		slot:           "siphon",
		publication:    "siphon",
		slotRetry:      SlotRetry{LockTimeout: 59 * time.Second, MaxBlocked: 30 * time.Minute, RetryDelay: time.Second},
		statusInterval: 10 * time.Second,
		copySessions:   4,
	}
}

// SlotRetry bounds how long creating a replication slot may wait for the
// transactions that block it (see [Conn.CurrentPosition]).
type SlotRetry struct {
	// LockTimeout bounds one attempt to create the slot. Defaults to 59s.
	LockTimeout time.Duration
	// MaxBlocked bounds all attempts together; past it the creation fails
	// with a [*SlotBlockedError] naming the blocking sessions. Defaults to 30m.
	MaxBlocked time.Duration
	// RetryDelay is the base pause between attempts, jittered between one and
	// five times its value. Defaults to 1s.
	RetryDelay time.Duration
}

// Progress reports how far a table copy has come. Totals are estimates from
// the catalog (pg_class.reltuples and the relation size) and may be zero
// for a table never analyzed.
type Progress struct {
	Table canonical.TableName
	// Rows counts the rows delivered so far; Bytes the binary COPY data
	// they came in.
	Rows  int64
	Bytes int64
	// EstimatedRows is pg_class.reltuples; EstimatedBytes the size of the
	// table's files, larger than its COPY data: Rows/EstimatedRows is the
	// better fraction done.
	EstimatedRows  int64
	EstimatedBytes int64
	// Done is true on the table's last report.
	Done bool
}

// WithLogger sets the logger for state changes (slot created, blocked,
// retrying, resumed); siphon never logs per row. Defaults to a logger that
// passes warnings and errors to [slog.Default] and discards the rest.
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.logger = l } }

// WithSlot names the persistent logical replication slot that holds the
// change stream's position: 1 to 63 characters of a-z, 0-9 and _.
// Defaults to "siphon".
func WithSlot(name string) Option { return func(o *options) { o.slot, o.source = name, true } }

// WithPublication names the publication that selects the streamed tables
// (created when missing): 1 to 63 characters of a-z, 0-9 and _. Defaults
// to "siphon". A publication of your own may name its tables, or publish
// FOR TABLES IN SCHEMA or FOR ALL TABLES; it must publish every kind of
// change, and hold every table siphon would stream (see SyncPublication).
func WithPublication(name string) Option {
	return func(o *options) { o.publication, o.source = name, true }
}

// WithTables restricts siphon to the named tables, each "schema.table" in
// SQL notation: unquoted parts fold to lower case, double-quoted parts are
// taken as written (`"Sales"."Order Lines"`); a name without a schema is in
// "public". Defaults to every user table.
func WithTables(names ...string) Option {
	return func(o *options) { o.tables, o.source = append([]string(nil), names...), true }
}

// WithSlotRetry sets how long slot creation waits for blocking
// transactions. Zero fields keep their defaults (see [SlotRetry]).
func WithSlotRetry(r SlotRetry) Option {
	return func(o *options) {
		if r.LockTimeout != 0 {
			o.slotRetry.LockTimeout = r.LockTimeout
		}
		if r.MaxBlocked != 0 {
			o.slotRetry.MaxBlocked = r.MaxBlocked
		}
		if r.RetryDelay != 0 {
			o.slotRetry.RetryDelay = r.RetryDelay
		}
	}
}

// WithStatusInterval sets how often streaming sends a standby status update
// (acknowledging what was handled) when the server does not ask sooner.
// Defaults to 10s.
func WithStatusInterval(d time.Duration) Option { return func(o *options) { o.statusInterval = d } }

// WithHeartbeat makes streaming also write a heartbeat at this interval: a
// logical decoding message (pg_logical_emit_message, prefix
// "siphon.heartbeat", never emitted to the callback) that records the last
// transaction handled. A heartbeat is how an idle slot advances safely: the
// stream acknowledges the heartbeat's position, and a later resume from the
// last OpCommit Position behind it is accepted because the heartbeat vouches
// that nothing published lies in between. Without this option heartbeats are
// still written on demand, when nothing is in flight and the server's WAL
// has moved on past the acknowledged position; the interval adds a steady
// beat for servers with no traffic at all. Defaults to 0: on demand only.
// Any role that may connect to the source database can write a message
// with this prefix: one moves the slot no further than the message itself,
// which the stream has read (see SECURITY.md).
func WithHeartbeat(d time.Duration) Option { return func(o *options) { o.heartbeat = d } }

// WithMeterProvider makes the Conn report metrics through mp, an
// OpenTelemetry MeterProvider (pick the exporter there: Prometheus, OTLP,
// ...), under the instrumentation scope "github.com/siphondb/siphon":
//
//   - siphon.stream.changes, siphon.stream.transactions (counters): what
//     change streams delivered (StreamChanges, BackupIncremental,
//     Replicate); siphon.stream.sessions: replication sessions started;
//   - siphon.stream.lag (bytes) and siphon.stream.lag.time (seconds):
//     how far a running stream is behind the server;
//   - siphon.slot.retained_wal (bytes, per slot): the WAL the server keeps
//     for the Conn's slot and siphon's base slots, read when collected;
//   - siphon.apply.changes, siphon.apply.transactions (counters), and
//     siphon.apply.duration (seconds, a histogram per target
//     transaction): what apply did (ConsumeCanonical, ApplyChange,
//     RestoreChain, Replicate's target);
//   - siphon.apply.lag (bytes) and siphon.apply.lag.time (seconds): how
//     far Replicate's target is behind what it received;
//   - siphon.errors (a counter, by error.type: interrupted, resume_gap,
//     apply_gap, schema_change, untrusted_schema_change, busy, integrity,
//     usage, deadline, server, other): errors siphon's calls returned.
//
// Every metric carries the attribute db.namespace (the Conn's database);
// stream, slot and Replicate metrics carry siphon.slot too (the Conn's
// slot; for siphon.slot.retained_wal, each slot's). Counting costs an
// atomic addition per change; the rest is read when the provider
// collects.
// Defaults to none: no metrics, no cost.
func WithMeterProvider(mp metric.MeterProvider) Option {
	return func(o *options) { o.meterProvider = mp }
}

// WithProgress sets a function that receives table copy progress, a few
// times a second at most per table. It is called from one goroutine at a
// time. Defaults to none.
func WithProgress(f func(Progress)) Option { return func(o *options) { o.progress = f } }

// WithCopySessions sets how many sessions copy tables in parallel (bounded
// by the server's free connections). Defaults to 4.
func WithCopySessions(n int) Option { return func(o *options) { o.copySessions = n } }

// KeylessTables says what siphon's publication does with a table that has
// no usable replica identity (no primary key, and no REPLICA IDENTITY FULL
// or USING INDEX): PostgreSQL refuses every UPDATE and DELETE on a table
// that is in a publication publishing them and has none, so such a table
// must never join siphon's publication as it is.
type KeylessTables int

// What [WithKeylessTables] can do with tables without a usable replica
// identity.
const (
	// KeylessSkip leaves them out of the publication: their changes and
	// rows are not captured, and siphon logs which they are (at Warn, when
	// it creates the publication) and [Conn.Preflight] lists them.
	KeylessSkip KeylessTables = iota
	// KeylessInsertsOnly captures their inserts and truncates, through a
	// second publication ("<publication>_inserts") that publishes nothing
	// else: the application's updates and deletes on them work, and are
	// not captured. For append-only tables (logs, events).
	KeylessInsertsOnly
	// KeylessFull sets REPLICA IDENTITY FULL on them (which needs owning
	// them), then captures them whole: updates and deletes carry the whole
	// old row, which costs WAL, and apply finds rows by all their values.
	KeylessFull
)

func (k KeylessTables) String() string {
	switch k {
	case KeylessSkip:
		return "skip"
	case KeylessInsertsOnly:
		return "inserts only"
	case KeylessFull:
		return "replica identity full"
	}
	return fmt.Sprintf("KeylessTables(%d)", int(k))
}

// WithKeylessTables says what siphon's publication does with tables that
// have no usable replica identity, when siphon creates it or
// [Conn.SyncPublication] adds tables to it: see [KeylessTables]. Defaults
// to [KeylessSkip] for the publication of every table; a table named by
// [WithTables] that has no usable replica identity is refused with a
// [*ReplicaIdentityError] unless this option says what to do with it.
func WithKeylessTables(k KeylessTables) Option {
	return func(o *options) { o.keyless, o.keylessChosen, o.source = k, true, true }
}

// WithTriggersOnApply makes apply ([Conn.ConsumeCanonical],
// [Conn.ApplyChange], [Conn.RestoreChain]) run as an ordinary session on
// this Conn's database: the target's ordinary triggers and rules fire on
// every applied row, foreign keys are checked and their ON DELETE / ON
// UPDATE actions run, and ENABLE REPLICA triggers do not fire. Use it when
// the target must run its own logic on replicated rows, knowing that it may
// then differ from the source (a trigger that stamps rows rewrites them; an
// audit trigger records them twice; a cascade deletes rows the source
// deletes itself). Defaults to off: apply runs as PostgreSQL's own logical
// replication does, with session_replication_role = replica, so that only
// ENABLE REPLICA and ENABLE ALWAYS triggers and rules fire and the target
// ends equal to the source; a role that may not set that parameter is
// refused with a [*TriggersWouldFireError] where such logic exists.
func WithTriggersOnApply() Option { return func(o *options) { o.triggersOnApply = true } }

// WithoutSchemaCapture makes a Conn ignore the capture of schema changes
// (see [Conn.InstallSchemaCapture]) even where it is installed for its
// publication, and keeps Preflight from warning about it. The change
// stream then carries no schema changes: siphon follows the columns added
// and dropped that it can see in the stream, where that is exact, and an
// apply stops at any other schema change with a
// [*SchemaIncompatibleError] naming it, to be applied to the target by
// hand. Defaults to off: a Conn uses the capture when a superuser
// installed it for its publication (nothing installs it on its own).
func WithoutSchemaCapture() Option {
	return func(o *options) { o.noSchemaCapture, o.source = true, true }
}

// WithPartitionRoots makes siphon carry the rows of a partitioned table
// under the table itself (its root), never under its partitions: the
// publication siphon creates publishes with PostgreSQL's
// publish_via_partition_root, so the change stream, [Conn.BackupIncremental]
// and [Conn.Replicate] name the root; [Conn.InspectSchema] lists roots, not
// partitions (unless [WithTables] names one), so snapshots
// ([Snapshot.CopyTables], [Conn.EmitCanonical]) deliver every partition's
// rows as the root's. A target then needs only the root, partitioned as it
// likes (other bounds, another number of partitions) or not at all: apply
// inserts through the root, an update that moves a row between partitions
// arrives as a delete and an insert, and a TRUNCATE of the root empties the
// target's. PostgreSQL does not publish a TRUNCATE of a single partition
// under this setting: truncate the root, or delete the partition's rows.
// A publication that exists without the setting (or with it, for a Conn
// without this option) is refused at every stream start with a
// [*PublicationMismatchError]; [Conn.SyncPublication] sets it, after which
// the stream names the roots from that point on. Defaults to off: each
// partition's rows and changes carry the partition's own (leaf) name.
func WithPartitionRoots() Option {
	return func(o *options) { o.partitionRoots, o.source = true, true }
}

var slotNamePattern = regexp.MustCompile(`^[a-z0-9_]{1,63}$`)

// validate checks every option and returns the table names parsed.
func (o *options) validate() ([]canonical.TableName, error) {
	if o.logger == nil {
		return nil, &OptionError{Option: "WithLogger", Problem: "the logger is nil", Fix: "pass a *slog.Logger, or leave the option out"}
	}
	if !slotNamePattern.MatchString(o.slot) {
		return nil, &OptionError{Option: "WithSlot", Problem: fmt.Sprintf("%q is not a valid slot name", o.slot), Fix: "use 1 to 63 characters of a-z, 0-9 and _"}
	}
	if !slotNamePattern.MatchString(o.publication) {
		return nil, &OptionError{Option: "WithPublication", Problem: fmt.Sprintf("%q is not a valid publication name", o.publication), Fix: "use 1 to 63 characters of a-z, 0-9 and _"}
	}
	r := o.slotRetry
	if r.LockTimeout < 0 || r.MaxBlocked < 0 || r.RetryDelay < 0 {
		return nil, &OptionError{Option: "WithSlotRetry", Problem: "a duration is negative", Fix: "use positive durations, or zero for the default"}
	}
	if o.statusInterval <= 0 {
		return nil, &OptionError{Option: "WithStatusInterval", Problem: fmt.Sprintf("%v is not positive", o.statusInterval), Fix: "use a positive duration well below the server's wal_sender_timeout (60s by default)"}
	}
	if o.heartbeat < 0 {
		return nil, &OptionError{Option: "WithHeartbeat", Problem: fmt.Sprintf("%v is negative", o.heartbeat), Fix: "use a positive interval, or 0 for no heartbeat"}
	}
	if o.keyless < KeylessSkip || o.keyless > KeylessFull {
		return nil, &OptionError{Option: "WithKeylessTables", Problem: fmt.Sprintf("%v is not a policy", o.keyless), Fix: "use KeylessSkip, KeylessInsertsOnly or KeylessFull"}
	}
	if o.keyless == KeylessInsertsOnly && len(o.publication) > 63-len(insertsSuffix) {
		return nil, &OptionError{Option: "WithPublication", Problem: fmt.Sprintf("%q is too long for KeylessInsertsOnly, which adds a publication %q", o.publication, o.publication+insertsSuffix),
			Fix: fmt.Sprintf("use at most %d characters", 63-len(insertsSuffix))}
	}
	if o.copySessions < 1 || o.copySessions > 64 {
		return nil, &OptionError{Option: "WithCopySessions", Problem: fmt.Sprintf("%d sessions", o.copySessions), Fix: "use 1 to 64"}
	}
	if err := o.validateTrust(); err != nil {
		return nil, err
	}
	tables := make([]canonical.TableName, 0, len(o.tables))
	if o.streamKeyProblem != "" {
		return nil, &OptionError{Option: "WithStreamKey", Problem: o.streamKeyProblem,
			Fix: fmt.Sprintf("use keys of at least %d random bytes (crypto/rand.Read), kept outside the backup storage", canonical.MinKeyBytes)}
	}
	seen := map[canonical.TableName]bool{}
	for _, s := range o.tables {
		name, err := parseTableName(s)
		if err != nil {
			return nil, &OptionError{Option: "WithTables", Problem: err.Error(), Fix: `write each table as schema.table, quoting parts with double quotes when they hold upper case or odd characters: "Sales"."Order Lines"`}
		}
		if !seen[name] {
			seen[name] = true
			tables = append(tables, name)
		}
	}
	return tables, nil
}

// parseTableName parses a possibly schema-qualified SQL table name.
func parseTableName(s string) (canonical.TableName, error) {
	var parts []string
	rest := strings.TrimSpace(s)
	for {
		part, tail, err := parseIdentifier(rest)
		if err != nil {
			return canonical.TableName{}, fmt.Errorf("%q: %v", s, err)
		}
		parts = append(parts, part)
		if tail == "" {
			break
		}
		if tail[0] != '.' {
			return canonical.TableName{}, fmt.Errorf("%q: unexpected %q after %q", s, tail, part)
		}
		rest = tail[1:]
	}
	switch len(parts) {
	case 1:
		return canonical.TableName{Schema: "public", Name: parts[0]}, nil
	case 2:
		return canonical.TableName{Schema: parts[0], Name: parts[1]}, nil
	}
	return canonical.TableName{}, fmt.Errorf("%q: more than schema and table", s)
}

// parseIdentifier reads one identifier from the start of s: a double-quoted
// one (with "" for a quote) or an unquoted one, folded to lower case.
func parseIdentifier(s string) (ident, rest string, err error) {
	if strings.HasPrefix(s, `"`) {
		var b strings.Builder
		for i := 1; i < len(s); i++ {
			if s[i] != '"' {
				b.WriteByte(s[i])
				continue
			}
			if i+1 < len(s) && s[i+1] == '"' {
				b.WriteByte('"')
				i++
				continue
			}
			if b.Len() == 0 {
				return "", "", fmt.Errorf("empty quoted identifier")
			}
			return b.String(), s[i+1:], nil
		}
		return "", "", fmt.Errorf("unterminated quoted identifier")
	}
	end := strings.IndexByte(s, '.')
	if end < 0 {
		end = len(s)
	}
	ident = s[:end]
	if ident == "" || strings.ContainsAny(ident, "\" \t\n;") {
		return "", "", fmt.Errorf("%q is not an identifier (quote it with double quotes)", ident)
	}
	return strings.ToLower(ident), s[end:], nil
}

// warnAndAbove is the default log handler: warnings and errors go to
// slog.Default, the rest is dropped.
type warnAndAbove struct{ attrs []slog.Attr }

func (warnAndAbove) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }

func (h warnAndAbove) Handle(ctx context.Context, r slog.Record) error {
	r.AddAttrs(h.attrs...)
	return slog.Default().Handler().Handle(ctx, r)
}

func (h warnAndAbove) WithAttrs(attrs []slog.Attr) slog.Handler {
	return warnAndAbove{attrs: append(append([]slog.Attr(nil), h.attrs...), attrs...)}
}

func (h warnAndAbove) WithGroup(string) slog.Handler { return h }

// WithLocalChangesOnly makes streaming deliver only the changes made on the
// server itself, leaving out those applied by a session with a replication
// origin set up: by [Conn.ConsumeCanonical] when its role may use
// replication origins (not by [Conn.ApplyChange], which sets up none), or by
// a PostgreSQL subscription. Two databases that feed each other through
// siphon need it on both sides, or every change comes back to where it
// started. It is pgoutput's origin 'none' and needs PostgreSQL 16 or later:
// on an older server streaming fails with an [*OptionError]. Defaults to
// off: changes are streamed whatever their origin.
func WithLocalChangesOnly() Option { return func(o *options) { o.localOnly = true } }

// WithFailoverSlot makes siphon create the persistent slot ([WithSlot]) as a
// failover slot: a physical standby that synchronizes slots
// (sync_replication_slots = on) keeps a copy of it, so streaming can go on
// from the standby once it is promoted. It takes effect when the slot is
// created; an existing slot keeps what it has (pg_replication_slots.failover
// shows it). It needs PostgreSQL 17 or later: on an older server creating
// the slot fails with an [*OptionError]. Defaults to off: the slot lives on
// the primary only.
func WithFailoverSlot() Option { return func(o *options) { o.failover = true } }

// needRelease returns an [*OptionError] when server is of an older major
// release than release, the first that has what option asks for.
func needRelease(option string, release int, server pgdump.Version) error {
	if server.Major >= release {
		return nil
	}
	return &OptionError{Option: option,
		Problem: fmt.Sprintf("needs PostgreSQL %d or later; the server runs %s", release, server),
		Fix:     fmt.Sprintf("upgrade the server to PostgreSQL %d or later, or leave the option out", release)}
}

// Trust in schema changes.

// WithTrustedSchemaRoles names source roles, besides the source's
// superusers and the role that installed the schema capture, whose schema
// changes apply runs on the target (see the package documentation on
// schema changes). Trust is decided on the role that logged in on the
// source (session_user), and the statement runs on the target as the
// role it ran as there, which must exist on the target and be one the
// applying role may take (SET ROLE): create the role there first. A schema
// change by any other role stops the apply with an
// [*UntrustedSchemaChangeError]. Give it once with every role, or several
// times. Defaults to none.
func WithTrustedSchemaRoles(roles ...string) Option {
	return func(o *options) { o.trustedSchemaRoles = append(o.trustedSchemaRoles, roles...) }
}

// WithRoleDependentSchemaChanges makes apply run the schema changes of
// trusted roles whose meaning depends on who runs them: GRANT and REVOKE,
// ALTER DEFAULT PRIVILEGES, DROP OWNED and REASSIGN OWNED, statements
// naming CURRENT_USER, SESSION_USER or CURRENT_ROLE as a role, user
// mappings, servers and foreign data wrappers, IMPORT FOREIGN SCHEMA and
// SECURITY LABEL. On the target they act as the role they run as there,
// which is the source role only where it exists and the applying role may
// take it. Defaults to refusing them with an [*UntrustedSchemaChangeError].
func WithRoleDependentSchemaChanges() Option {
	return func(o *options) { o.roleDependentSchemaChanges = true }
}

// validateTrust checks WithTrustedSchemaRoles.
func (o *options) validateTrust() error {
	for _, r := range o.trustedSchemaRoles {
		if r == "" {
			return &OptionError{Option: "WithTrustedSchemaRoles", Problem: "a role name is empty",
				Fix: "name each source role as pg_roles.rolname spells it, without quotes"}
		}
	}
	return nil
}

// Authentication of streams.

// WithStreamKey authenticates the canonical streams the Conn writes and
// verifies those it reads with a key only the user holds: HMAC-SHA-256
// over every byte, at every checkpoint and schema change, and over the
// chain links (see the canonical package, "Authentication"). Every stream
// the Conn writes ([Conn.EmitCanonical], [Conn.BackupIncremental],
// [Conn.BackupIncrementalAfter]) is authenticated with key; the streams it
// reads ([Conn.ConsumeCanonical], [Conn.RestoreChain], [Conn.Verify],
// [Conn.VerifyChain]) are authenticated with key or any of previous, so
// that keys can be rotated: write with the new key, accept the old ones
// until the streams written with them are gone. Only the schema changes of
// a stream authenticated with one of these keys are applied (see
// [ErrUnauthenticatedSchemaChange]); a stream that names one of them but
// fails its check is refused from the checkpoint that fails (by
// RestoreChain, which verifies first, whole). Each key must be at least 32 bytes
// (an [*OptionError] from [Connect] otherwise), random, and kept apart from
// the streams (a backup's storage must not hold its key); the Conn copies
// the keys and never prints them. Defaults to no key: streams are checked
// for accidents (CRC-32C) but not authenticated, and their schema changes
// are refused.
func WithStreamKey(key []byte, previous ...[]byte) Option {
	return func(o *options) {
		o.streamKeys, o.streamKeyProblem = nil, ""
		for i, k := range append([][]byte{key}, previous...) {
			if len(k) < canonical.MinKeyBytes {
				which := "the key"
				if i > 0 {
					which = fmt.Sprintf("previous key %d", i)
				}
				o.streamKeyProblem = fmt.Sprintf("%s has %d bytes, fewer than %d", which, len(k), canonical.MinKeyBytes)
			}
			o.streamKeys = append(o.streamKeys, bytes.Clone(k))
		}
	}
}

// insertsSuffix names the publication of KeylessInsertsOnly tables.
const insertsSuffix = "_inserts"
