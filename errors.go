package siphon

// The package's errors, in one place: the sentinels callers match with
// errors.Is, the typed errors they match with errors.As, each saying what
// went wrong and how to fix it, and Retryable.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/siphondb/siphon/canonical"
	dsnpkg "github.com/siphondb/siphon/internal/dsn"
	"github.com/siphondb/siphon/internal/pgerr"
	"github.com/siphondb/siphon/internal/sqltext"
	"github.com/siphondb/siphon/internal/walwire"
	"github.com/siphondb/siphon/pgdump"
)

// Errors of the Conn itself that callers can branch on with errors.Is.
var (
	// ErrClosed means the Conn, or the Snapshot, was closed: make a new
	// one (Connect, Conn.TakeSnapshot).
	ErrClosed = errors.New("siphon: used after Close")
	// ErrAlreadyStreaming means the Conn is streaming its slot already
	// (StreamChanges, BackupIncremental or Replicate): a slot is read by
	// one stream at a time; wait for that one to return, or use a Conn
	// with another slot.
	ErrAlreadyStreaming = errors.New("siphon: this Conn is already streaming its slot")
	// ErrNilArgument means an argument a call needs is nil or missing (a
	// callback, a target Conn, what an earlier call returned); the error
	// wrapping it names the argument.
	ErrNilArgument = errors.New("siphon: a required argument is nil")
)

// Retryable reports whether err says the operation may succeed when it is
// tried again as it was, with nothing to fix first: the connection broke
// ([*StreamInterruptedError], a network error, a server shutting down or
// out of connections for now), or another session holds what it needs for
// now ([ErrSlotInUse], [ErrApplyInProgress], a [*SlotBlockedError], a
// [*BackupConflictError]).
// Errors that need a change first (a [*ResumeGapError], a
// [*SchemaChangeError], a [*SchemaIncompatibleError], an [*OptionError],
// a checksum error...) are not retryable, nor is a cancelled ctx.
func Retryable(err error) bool {
	var blocked *SlotBlockedError
	var interrupted *StreamInterruptedError
	var conflict *BackupConflictError
	switch {
	case err == nil:
		return false
	case errors.As(err, &interrupted), errors.Is(err, ErrSlotInUse), errors.Is(err, ErrApplyInProgress),
		errors.As(err, &blocked), errors.As(err, &conflict):
		return true
	}
	return isInterruption(err)
}

// ErrApplyInProgress means another session is applying the same source
// into the same target database right now: one source is applied by one
// session at a time. Wait for it to finish, or stop it.
var ErrApplyInProgress = errors.New("siphon: another session is applying this source into the target")

// ErrAmbiguousSource is returned (wrapped) by [Conn.AppliedPosition] when
// changes from more than one source were applied into the target database:
// ask for one with [Conn.AppliedPositionFor] ([Conn.AppliedSources] lists
// them), or forget those no longer applied ([Conn.ResetAppliedPosition],
// [Conn.SweepOrphanOriginsWith]).
var ErrAmbiguousSource = errors.New("siphon: more than one source was applied into the target")

// Errors of [Conn.ConsumeCanonical] callers can branch on with errors.Is.
var (
	// ErrUnchecked means a canonical stream carries no checksums (it was
	// written by hand, or by siphon before streams were checked), so
	// nothing vouches for its bytes: write it with a canonical.Encoder, or
	// apply it anyway with ApplyOptions.Unchecked.
	ErrUnchecked = errors.New("siphon: the stream carries no checksums (written by hand or by an older siphon): " +
		"its bytes cannot be verified; write it with canonical.Encoder, or apply it anyway with ApplyOptions.Unchecked")
	// ErrNotCanonical means the stream given to ConsumeCanonical is not a
	// canonical stream: a pg_dump backup, or not a siphon stream at all.
	ErrNotCanonical = errors.New("siphon: not a canonical stream")
)

// ApplyGapError is returned by [Conn.ConsumeCanonical] for a change stream
// that does not continue what the target holds of its source: it starts
// after the Position the target has applied (the transactions between the
// two would be lost: consume the streams that cover them first), or its
// source is not one the target holds while the target holds others (a
// stream of another cluster or slot than the base the target was restored
// or loaded from: its changes would land on another source's data).
// Nothing of the stream was applied.
type ApplyGapError struct {
	Applied canonical.Position // what the target has applied of the stream's source
	Start   canonical.Position // where the stream starts
	// Source is the stream's source key ("<system id>_<slot>").
	Source string
	// Holds, when the target holds nothing of Source, lists the sources it
	// holds with their applied Positions; nil otherwise.
	Holds map[string]canonical.Position
}

func (e *ApplyGapError) Error() string {
	if e.Holds != nil {
		held := make([]string, 0, len(e.Holds))
		for key, pos := range e.Holds {
			held = append(held, fmt.Sprintf("%s up to %v", key, pos))
		}
		slices.Sort(held)
		return fmt.Sprintf("siphon: the stream comes from source %s (system id_slot), of which the target holds nothing, "+
			"but the target holds %s: its changes would land on another source's data; consume it into the target "+
			"restored or loaded from its own source, or, if the target does hold that source's data, say up to where with MarkAppliedPosition",
			e.Source, strings.Join(held, ", "))
	}
	return fmt.Sprintf("siphon: the target has applied up to %v but the stream starts at %v: "+
		"the transactions in between are missing; consume the stream that starts at or before %v first",
		e.Applied, e.Start, e.Applied)
}

// SchemaChangeError reports a schema change captured on the source (an
// [canonical.OpDDL] change) that apply could not make on the target: its
// statement failed there, or it cannot be replayed as it is
// ([canonical.DDL].Problem). Nothing of the source transaction that holds
// it was applied; every transaction before it was.
type SchemaChangeError struct {
	// Position is the source transaction's commit LSN (its begin's
	// Position), which [ApplyOptions].SkipSchemaChanges takes.
	Position  canonical.Position
	Tag       string
	Statement string
	// Problem is the change's DDL.Problem; empty when the statement failed.
	Problem string
	// Err is the target's error; nil with a Problem.
	Err error
}

func (e *SchemaChangeError) Error() string {
	what := fmt.Sprintf("siphon: the schema change (%s) of the source transaction committed at %v", e.Tag, e.Position)
	if e.Problem != "" {
		what += " cannot be replayed: " + e.Problem
	} else {
		what += fmt.Sprintf(" failed on the target: %v", e.Err)
	}
	return fmt.Sprintf("%s; the statement: %s; make the target's schema what the source's became (by hand), then apply again with SkipSchemaChanges: []canonical.Position{%v} in ApplyOptions (or ReplicateOptions)",
		what, shortStatement(e.Statement), e.Position)
}

func (e *SchemaChangeError) Unwrap() error { return e.Err }

// TriggersWouldFireError is returned by apply ([Conn.ConsumeCanonical],
// [Conn.ApplyChange], [Conn.RestoreChain]) when the target role may not
// set session_replication_role, so applying as an ordinary session would
// run target logic that PostgreSQL's own logical replication does not (the
// target would then differ from the source), or skip an ENABLE REPLICA
// trigger it runs. Nothing of the tables concerned was applied.
type TriggersWouldFireError struct {
	Role     string    // the target role
	Triggers []Trigger // what would fire (or not), table by table
}

func (e *TriggersWouldFireError) Error() string {
	list := make([]string, len(e.Triggers))
	for i, t := range e.Triggers {
		list[i] = t.String()
	}
	return fmt.Sprintf("siphon: apply refused before writing to these tables: role %q may not set session_replication_role, "+
		"so applying as an ordinary session would run the target's own logic, and the target would differ from the source: %s; "+
		"have a superuser run GRANT SET ON PARAMETER session_replication_role TO %s, or connect WithTriggersOnApply to apply with them firing",
		e.Role, strings.Join(list, "; "), sqltext.Ident(e.Role))
}

// ForeignKeyOrderError is returned by [Conn.ConsumeCanonical] for a
// snapshot that a target role without the session_replication_role
// privilege cannot load: the target's foreign keys are checked as rows
// arrive, and Table's rows come before those of References, which a
// foreign key of the target that cannot be deferred makes Table reference.
// Nothing was loaded.
type ForeignKeyOrderError struct {
	Role       string
	Table      canonical.TableName
	References canonical.TableName
	Constraint string
	// Cycle, when not empty, is the chain of foreign keys (constraint
	// names) by which References refers back to Table: no order loads
	// them.
	Cycle []string
}

func (e *ForeignKeyOrderError) Error() string {
	why := "its rows come first in the snapshot (the source's foreign keys differ from the target's)"
	if len(e.Cycle) > 0 {
		why = fmt.Sprintf("and %s references %s back (%s): no order of the rows passes both checks", e.References, e.Table, strings.Join(e.Cycle, ", "))
	}
	return fmt.Sprintf("siphon: snapshot refused, nothing was loaded: role %q applies with foreign keys checked, and %s references %s (constraint %s, not deferrable), %s; "+
		"have a superuser run GRANT SET ON PARAMETER session_replication_role TO %s, or make the constraint DEFERRABLE on the target",
		e.Role, e.Table, e.References, sqltext.Ident(e.Constraint), why, sqltext.Ident(e.Role))
}

// ErrSerializableDeferrable is returned by [Conn.Backup] when
// [BackupOptions].SerializableDeferrable is set: see there.
var ErrSerializableDeferrable = pgdump.ErrSnapshotSerializable

// ErrTargetBeforeBase means [Conn.RestoreChain] was asked for a target
// Position before the base backup's, or a target time before the base
// backup was taken: no restore can reach it.
var ErrTargetBeforeBase = errors.New("siphon: the target is before the chain's base backup")

// ChainError is returned by [Conn.RestoreChain] when the chain it was given
// does not verify ([Conn.VerifyChain]): a link is damaged, or does not
// continue the previous one (a missing, repeated or reordered incremental,
// another cluster or timeline). Nothing was restored.
type ChainError struct {
	// Link is the first bad link, 1-based: 1 is the base backup, 2 the
	// first incremental.
	Link int
	// Problems are that link's problems, as in [ChainReport].Problems:
	// each starts with "link N: ".
	Problems []string
	// Report is the whole chain's report.
	Report *ChainReport
}

func (e *ChainError) Error() string {
	// Each problem names its link already ("link 3: ...").
	return "siphon: restore chain refused, nothing was restored: " + strings.Join(e.Problems, "; ")
}

// Errors of [Conn.Restore] (and [Conn.CopySchema]) callers can branch on
// with errors.Is.
var (
	// ErrNotDump means the envelope given to Restore holds a snapshot or
	// an incremental (JSONL), not a pg_dump archive.
	ErrNotDump = errors.New("siphon: the backup is not a dump")
	// ErrTargetNotEmpty means the database Restore would restore into, or
	// CopySchema copy into, already holds tables, views or sequences.
	ErrTargetNotEmpty = errors.New("siphon: the target database is not empty")
)

// OwnershipError is returned by [Conn.CopySchema] (and [Conn.Replicate]
// with [ReplicateOptions].CopySchema) when objects of the source that run
// with their owner's rights (tables, with their rules and index
// expressions; views; SECURITY DEFINER functions) belong to roles that are
// not superusers there, and the copy would give them to the target Conn's
// role ([CopySchemaOptions].KeepOwners not set): they would then run with
// its rights on the target, more than their owners had on the source.
// Nothing was created.
type OwnershipError struct {
	// Target is the target Conn's role, which would own them.
	Target string
	// Owners lists, by source role, objects it owns (the first few).
	Owners map[string][]string
}

func (e *OwnershipError) Error() string {
	roles := make([]string, 0, len(e.Owners))
	for role := range e.Owners {
		roles = append(roles, role)
	}
	slices.Sort(roles)
	for i, role := range roles {
		roles[i] = fmt.Sprintf("%q (%s)", role, strings.Join(e.Owners[role], ", "))
	}
	return fmt.Sprintf("siphon: copy schema refused, nothing was created: objects of the source belong to roles that are not superusers there: %s; "+
		"owned by role %q on the target, they would run with its rights there, more than their owners have: "+
		"keep their owners with CopySchemaOptions.KeepOwners (create those roles on the target first)", strings.Join(roles, "; "), e.Target)
}

// PreflightError is what Connect and the first operation that needs it
// return when a check fails that nothing can work without: the database's
// encoding, wal_level for a source, a table WithTables names. Check says
// what and how to fix it.
type PreflightError struct {
	Check Check
}

func (e *PreflightError) Error() string {
	return fmt.Sprintf("siphon: %s: %s: %s", e.Check.Name, e.Check.Found, e.Check.Fix)
}

// ErrCaptureNeedsSuperuser is matched (errors.Is) by the error of
// [Conn.InstallSchemaCapture] and [Conn.Detach] for a role that is not a
// superuser: event triggers are a superuser's.
var ErrCaptureNeedsSuperuser = errors.New("siphon: schema capture needs a superuser (CREATE EVENT TRIGGER)")

// Errors callers can branch on with errors.Is.
var (
	// ErrInvalidDSN means the connection string does not parse; the
	// error wrapping it says which part is wrong, never quoting a
	// password. It is the same error as pgdump.ErrInvalidDSN.
	ErrInvalidDSN = dsnpkg.ErrInvalid
	// ErrSlotInUse means a replication slot is active in another session.
	ErrSlotInUse = errors.New("siphon: replication slot is in use")
	// ErrUnsafeSearchPath is matched by the error of Connect, or of any
	// session siphon opens later, when the session's search_path (the
	// DSN's, or PGOPTIONS'), as the server holds it, names a schema
	// before pg_catalog, existing or not: the functions and operators
	// that schema's owner puts there would run in siphon's sessions, as
	// siphon's role, in place of the built-ins siphon's statements call
	// (the target's apply compares keys with operators the search_path
	// finds). The session is closed before siphon runs anything else in
	// it.
	ErrUnsafeSearchPath = errors.New("siphon: the session's search_path puts a schema before pg_catalog")
)

// PrivilegeError reports that the server refused what siphon asked of it
// because the role lacks a privilege: which one, what needs it, and the
// statement that grants it. Every refusal for lack of a privilege that
// siphon can name is one (a replication session without REPLICATION, a
// table or sequence the role may not read or write, a schema it may not
// use).
type PrivilegeError struct {
	// Role is the role that lacks the privilege.
	Role string
	// Privilege is what it lacks: "the REPLICATION attribute",
	// "SELECT on table public.orders", ...
	Privilege string
	// Needed says what needs it: "replication sessions: snapshots,
	// streams, backups", ...
	Needed string
	// Fix is the statement that grants it, and who may run it.
	Fix string
	// Err is the error the lack caused: the server's, or pg_dump's (a
	// [*pgdump.ExitError]); nil in a Preflight check.
	Err error
}

func (e *PrivilegeError) Error() string {
	msg := fmt.Sprintf("siphon: role %q lacks %s", e.Role, e.Privilege)
	if e.Needed != "" {
		msg += " (needed for " + e.Needed + ")"
	}
	msg += ": " + e.Fix
	if e.Err != nil {
		msg += fmt.Sprintf(" (%v)", e.Err)
	}
	return msg
}

func (e *PrivilegeError) Unwrap() error { return e.Err }

// privilegeError returns err as a *PrivilegeError of role when it is the
// server's refusal for lack of a privilege (SQLSTATE 42501), and err
// otherwise. privilege, needed and fix are as in PrivilegeError.
func privilegeError(err error, role, privilege, needed, fix string) error {
	var pgErr *pgconn.PgError
	if !pgerr.Is(err, pgerrcode.InsufficientPrivilege) || !errors.As(err, &pgErr) {
		return err
	}
	return &PrivilegeError{Role: role, Privilege: privilege, Needed: needed, Fix: fix, Err: pgErr}
}

// OptionError reports an invalid [Option] given to [Connect].
type OptionError struct {
	Option  string // the With... function
	Problem string // what is wrong
	Fix     string // how to fix it
}

func (e *OptionError) Error() string {
	return fmt.Sprintf("siphon: %s: %s: %s", e.Option, e.Problem, e.Fix)
}

// SchemaIncompatibleError reports a table that is missing, or whose shape
// changed or differs from what an operation expects.
type SchemaIncompatibleError struct {
	Table   canonical.TableName
	Column  string // the column concerned, if any
	Problem string
}

func (e *SchemaIncompatibleError) Error() string {
	if e.Column != "" {
		return fmt.Sprintf("siphon: table %s, column %q: %s", e.Table, e.Column, e.Problem)
	}
	return fmt.Sprintf("siphon: table %s: %s", e.Table, e.Problem)
}

// SlotBlockedError reports that creating a replication slot waited longer
// than [SlotRetry].MaxBlocked for transactions to end. Siphon returns it
// wrapped with the operation and slot name; use errors.As.
type SlotBlockedError struct {
	Slot     string        // the slot that could not be created
	Waited   time.Duration // from the first attempt to giving up
	Attempts int           // attempts made
	// Blockers are the sessions the latest attempts waited for: transactions
	// holding a transaction ID, or another siphon session holding the
	// slot-management lock. Empty when none was caught waiting.
	Blockers []Blocker
}

func (e *SlotBlockedError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "blocked for %v (%d attempts)", e.Waited.Round(time.Millisecond), e.Attempts)
	for i, bl := range e.Blockers {
		b.WriteString(listSep(i, " by "))
		b.WriteString(bl.String())
	}
	b.WriteString(": creating a logical slot waits for every transaction that holds a transaction ID;" +
		" commit or roll back those transactions (pg_terminate_backend(pid) ends a session," +
		" COMMIT PREPARED or ROLLBACK PREPARED a prepared one), or allow a longer wait with WithSlotRetry")
	return b.String()
}

// StreamInterruptedError reports that the replication connection broke: the
// network failed, the server shut down, or the walsender was terminated
// (pg_terminate_backend, wal_sender_timeout). It is retryable: call
// [Conn.StreamChanges] again from Position, and nothing is lost or repeated.
type StreamInterruptedError struct {
	// Position is where to resume from: the end of the last transaction
	// whose OpCommit emit returned nil, or the stream's start.
	Position canonical.Position
	Err      error
}

func (e *StreamInterruptedError) Error() string {
	return fmt.Sprintf("siphon: change stream interrupted (resume from %v): %v", e.Position, e.Err)
}

func (e *StreamInterruptedError) Unwrap() error { return e.Err }

// GapReason says why a [ResumeGapError] was returned.
type GapReason string

// The reasons for a [ResumeGapError].
const (
	// GapBehindSlot: the requested Position is older than the slot's
	// confirmed position, and no siphon heartbeat vouches that nothing was
	// published in between. The slot was advanced by another consumer, or
	// it was dropped and recreated (a new slot starts past any earlier
	// Position), or the caller's Position is stale.
	GapBehindSlot GapReason = "behind the slot's confirmed position"
	// GapSlotLost: the server invalidated the slot (wal_status "lost",
	// max_slot_wal_keep_size exceeded): the WAL it needed was removed.
	GapSlotLost GapReason = "the slot was invalidated (wal_status lost)"
	// GapSlotMissing: the slot does not exist; it was dropped.
	GapSlotMissing GapReason = "the slot does not exist"
)

// ResumeGapError reports that the change stream cannot continue from the
// requested Position without losing changes. PostgreSQL would silently start
// later; siphon refuses. The way out is a new snapshot
// ([Conn.EmitCanonical]) followed by streaming from its Position.
type ResumeGapError struct {
	Slot      string
	Requested canonical.Position
	// Confirmed is the slot's confirmed position (zero when the slot is
	// missing).
	Confirmed canonical.Position
	Reason    GapReason
}

func (e *ResumeGapError) Error() string {
	return fmt.Sprintf("siphon: cannot resume slot %q from %v: %s (confirmed %v): changes may be missing; take a new snapshot and stream from its position",
		e.Slot, e.Requested, e.Reason, e.Confirmed)
}

// SlotConfigError reports a slot of the name siphon was given ([WithSlot])
// that exists but cannot be streamed from: a physical slot, one of another
// database or another output plugin, or another session's temporary slot.
// siphon never drops or changes it.
type SlotConfigError struct {
	Slot    string
	Problem string // what is wrong with it: "is a physical slot", ...
}

func (e *SlotConfigError) Error() string {
	return fmt.Sprintf("siphon: a slot named %q exists but %s: name another slot with WithSlot, or drop that one if it is unused", e.Slot, e.Problem)
}

// PublicationMissingError reports a change stream's slot whose publication
// is gone: the slot holds changes a publication of that name selected when
// they were written, and one created now would not select the changes
// written before it.
type PublicationMissingError struct {
	Publication string
	Slot        string
}

func (e *PublicationMissingError) Error() string {
	return fmt.Sprintf("siphon: publication %q does not exist but slot %q does: drop the slot (Detach), "+
		"then take a new snapshot or full backup and stream from its Position", e.Publication, e.Slot)
}

// PublicationMismatchError reports a publication that exists but does not
// publish what siphon was configured for, or that tables have drifted away
// from (created after it, or without a usable replica identity while they
// are published).
type PublicationMismatchError struct {
	Publication string
	Problem     string // what differs
	// Missing lists the tables the publication should hold and does not:
	// tables created after it, whose changes are not captured.
	Missing []canonical.TableName
	// Unsafe lists published tables that lost their usable replica
	// identity: the application's UPDATE and DELETE on them fail.
	Unsafe []canonical.TableName
	// Fix says what to do.
	Fix string
}

func (e *PublicationMismatchError) Error() string {
	fix := e.Fix
	if fix == "" {
		fix = "siphon does not change an existing publication; adjust it with ALTER PUBLICATION, drop it, or name another with WithPublication"
	}
	return fmt.Sprintf("siphon: publication %q %s: %s", e.Publication, e.Problem, fix)
}

// DetachIncompleteError is returned by [Conn.Detach] when it removed what
// the role may remove but some of what siphon made for the Conn stays on
// the source: the role may not drop the slot (it lacks REPLICATION, and
// the publication the slot reads stays with it) or the publication (another
// role owns it). Once the role named in Remaining has removed it, or the
// role was given what it lacked, Detach again removes the rest.
type DetachIncompleteError struct {
	// Removed lists what this Detach removed, such as `slot "cdc"`.
	Removed []string
	// Remaining lists what stays, each with why and who may remove it.
	Remaining []string
}

func (e *DetachIncompleteError) Error() string {
	removed := "nothing"
	if len(e.Removed) > 0 {
		removed = strings.Join(e.Removed, " and ")
	}
	return fmt.Sprintf("siphon: detach removed %s; what stays: %s; call Detach again once that is done",
		removed, strings.Join(e.Remaining, "; "))
}

// ReplicaIdentityError reports tables named by [WithTables] that have no
// usable replica identity, which siphon will not publish without being
// told how (see [WithKeylessTables]): the application's UPDATE and DELETE
// on them would fail.
type ReplicaIdentityError struct {
	Tables []canonical.TableName
}

func (e *ReplicaIdentityError) Error() string {
	return fmt.Sprintf("siphon: %s %s no usable replica identity (no primary key, no REPLICA IDENTITY FULL or USING INDEX): "+
		"publishing their updates would make the application's UPDATE and DELETE on them fail; give them a primary key, "+
		"or choose with WithKeylessTables: KeylessFull (siphon sets REPLICA IDENTITY FULL), KeylessInsertsOnly, or KeylessSkip",
		tableList(e.Tables), pluralHas(len(e.Tables)))
}

// errorf is fmt.Errorf for the errors siphon returns, whose format starts
// with "siphon: ". The prefix is said once: where the error wraps one that
// says it already (a sentinel, a typed error, a nested call's error), the
// inner "siphon: " is left out of the message. errors.Is and errors.As see
// every wrapped error as fmt.Errorf's would.
func errorf(format string, args ...any) error {
	err := fmt.Errorf(format, args...)
	return &prefixedError{msg: strings.ReplaceAll(err.Error(), ": siphon: ", ": "), err: err}
}

// prefixedError is an error of errorf.
type prefixedError struct {
	msg string
	err error
}

func (e *prefixedError) Error() string { return e.msg }
func (e *prefixedError) Unwrap() error { return e.err }

// Trust.

// UntrustedSchemaChangeError is returned by apply ([Conn.ConsumeCanonical],
// [Conn.ApplyChange], [Conn.RestoreChain]) for a schema change the target
// does not run: the source role that made it is not trusted (not a
// superuser of the source, not the role that installed the capture, not
// named by [WithTrustedSchemaRoles]), its statement's meaning depends on
// who runs it and the Conn was not made [WithRoleDependentSchemaChanges],
// or the role it ran as cannot be taken on the target (it does not exist
// there, or the applying role may not SET ROLE to it) while it was not a
// source superuser's: run as the applying role instead, it could grant
// more than the source role had. Nothing of the source transaction that
// holds it was applied; every transaction before it was.
type UntrustedSchemaChangeError struct {
	// Position is the source transaction's commit LSN (its begin's
	// Position), which [ApplyOptions].SkipSchemaChanges takes.
	Position canonical.Position
	// Role is the role the statement ran as on the source (DDL.Role);
	// SessionRole the role that logged in, on which trust is decided.
	Role, SessionRole string
	Tag               string
	// Statement is the statement, shortened; empty for a statement that
	// may carry secrets (user mappings, servers, subscriptions).
	Statement string
	// Reason says why the target does not run it.
	Reason string
	// roleDependent: refused for its meaning, not for its role;
	// roleMissing: refused because the target cannot take its role.
	roleDependent, roleMissing bool
}

func (e *UntrustedSchemaChangeError) Error() string {
	who := fmt.Sprintf("source role %q", e.SessionRole)
	if e.Role != "" && e.Role != e.SessionRole {
		who += fmt.Sprintf(" (as role %q)", e.Role)
	}
	stmt := shortStatement(e.Statement)
	if stmt == "" {
		stmt = "(left out: it may carry secrets)"
	}
	fix := fmt.Sprintf("if the target may run what %q runs on the source, give WithTrustedSchemaRoles(%q)", e.SessionRole, e.SessionRole)
	switch {
	case e.roleDependent:
		fix = "if the target may run it as the source role, give WithRoleDependentSchemaChanges()"
	case e.roleMissing:
		role := e.Role
		if role == "" {
			role = e.SessionRole
		}
		fix = fmt.Sprintf("create role %q on the target and GRANT it to the applying role", role)
	}
	return fmt.Sprintf("siphon: the schema change (%s) of the source transaction committed at %v, made by %s, is not trusted: %s; the statement: %s; "+
		"%s, or make the target's schema what it should be by hand and apply again with SkipSchemaChanges: []canonical.Position{%v} in ApplyOptions (or ReplicateOptions)",
		e.Tag, e.Position, who, e.Reason, stmt, fix, e.Position)
}

// SchemaCaptureForeignError: schema siphon, or the capture's event
// triggers, hold objects that belong to a role other than the superuser
// who installs the capture. Such a role could change what the capture's
// trigger runs as a superuser, or write rows a target would take for
// schema changes, so siphon neither installs over them nor streams
// their rows.
type SchemaCaptureForeignError struct {
	// Objects names each object and its owner.
	Objects []string
}

func (e *SchemaCaptureForeignError) Error() string {
	return "schema siphon holds objects siphon did not install: " + strings.Join(e.Objects, ", ") +
		"; check what they do, then drop them (DROP SCHEMA siphon CASCADE, DROP EVENT TRIGGER) or give them to the installing superuser, and call InstallSchemaCapture again"
}

// Authentication.

// ErrUnauthenticatedSchemaChange is returned (wrapped, with the Position of
// the source transaction) by [Conn.ConsumeCanonical] and
// [Conn.RestoreChain] for a schema change (a DDL record) in a stream that is
// not authenticated with one of the Conn's keys; nothing of that source
// transaction is applied. A schema change runs a statement on the target,
// and whoever could write the stream chose it.
var ErrUnauthenticatedSchemaChange = errors.New("siphon: a schema change in a stream that is not authenticated with the Conn's key: " +
	"write the stream with a Conn made WithStreamKey and read it with the same key (or a previous one), " +
	"or apply with ApplyOptions.UnauthenticatedSchemaChanges to run the schema changes of a stream you trust")

func pluralHas(n int) string {
	if n == 1 {
		return "has"
	}
	return "have"
}

func tableList(ts []canonical.TableName) string {
	if len(ts) == 0 {
		return "no table"
	}
	s := make([]string, len(ts))
	for i, t := range ts {
		s[i] = sqltext.Name(t.Schema, t.Name)
	}
	return strings.Join(s, ", ")
}

// Blocker is a session that held up slot creation, as pg_stat_activity
// showed it.
type Blocker struct {
	PID              int    // the session's process ID; 0 for a prepared transaction
	XID              uint32 // the transaction ID it holds; 0 when it holds none
	XIDAge           int64  // transactions assigned since XID
	State            string // "active", "idle in transaction", ... or "prepared"
	Database         string
	User             string
	Application      string
	TransactionStart time.Time // zero when unknown
	QueryStart       time.Time // zero when unknown
	// Query is the session's current or last statement, cut to 200
	// characters; PREPARE TRANSACTION 'gid' for a prepared transaction.
	Query string
}

func (b Blocker) String() string {
	who := "pid " + strconv.Itoa(b.PID)
	if b.PID == 0 {
		who = "a prepared transaction"
	}
	s := fmt.Sprintf("%s (xid %d, age %d, %s", who, b.XID, b.XIDAge, b.State)
	if !b.TransactionStart.IsZero() {
		s += " since " + b.TransactionStart.UTC().Format(time.RFC3339)
	}
	return s + fmt.Sprintf(", application %q, database %q, user %q): %q", b.Application, b.Database, b.User, b.Query)
}

// LogValue implements [slog.LogValuer].
func (b Blocker) LogValue() slog.Value {
	return slog.GroupValue(slog.Int("pid", b.PID), slog.Any("xid", b.XID), slog.Int64("xid_age", b.XIDAge),
		slog.String("state", b.State), slog.String("application", b.Application), slog.String("database", b.Database),
		slog.String("user", b.User), slog.Time("xact_start", b.TransactionStart),
		slog.Time("query_start", b.QueryStart), slog.String("query", b.Query))
}

// listSep returns first before a list's first item and "; " before the others.
func listSep(i int, first string) string {
	if i == 0 {
		return first
	}
	return "; "
}

// shortStatement shortens a statement for an error message.
func shortStatement(s string) string {
	const limit = 300
	if len(s) > limit {
		return s[:limit] + "..."
	}
	return s
}

// isInterruption reports whether err means the session broke and a new one may
// succeed: network errors, a server shutting down or terminating the
// walsender, connection failures.
func isInterruption(err error) bool {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ErrUnsafeSearchPath) {
		return false
	}
	if pgerr.Code(err) != "" {
		return pgerr.IsInterruption(err)
	}
	var netErr net.Error
	var connectErr *pgconn.ConnectError
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, walwire.ErrServerEndedStream) || errors.Is(err, walwire.ErrServerStopping) ||
		errors.As(err, &netErr) || errors.As(err, &connectErr)
}

// TriggerKind says what a [Trigger] is.
type TriggerKind string

// The kinds of [Trigger].
const (
	TriggerKindTrigger    TriggerKind = "trigger"
	TriggerKindRule       TriggerKind = "rule"
	TriggerKindForeignKey TriggerKind = "foreign key" // its ON DELETE or ON UPDATE action
)

// Trigger is a piece of the target's own logic on a table: a trigger, a
// rule, or the action of a foreign key that references the table.
type Trigger struct {
	Table canonical.TableName
	Name  string // the trigger's, rule's or foreign key constraint's
	Kind  TriggerKind
	// Referencing is, for a foreign key, the table that holds it: the one
	// whose rows its action changes.
	Referencing canonical.TableName
	// On says when it acts: "BEFORE UPDATE", "ON DELETE CASCADE"...
	On string
	// Fires is true for logic that would fire on applied changes although
	// PostgreSQL's apply does not run it, false for an ENABLE REPLICA
	// trigger or rule that PostgreSQL's apply runs and an ordinary session
	// does not.
	Fires bool
}

func (t Trigger) String() string {
	s := fmt.Sprintf("%s %s on %s (%s)", t.Kind, sqltext.Ident(t.Name), t.Table, t.On)
	if t.Kind == TriggerKindForeignKey {
		s = fmt.Sprintf("foreign key %s of %s referencing %s (%s)", sqltext.Ident(t.Name), t.Referencing, t.Table, t.On)
	}
	if !t.Fires {
		s += ", ENABLE REPLICA: would not fire"
	}
	return s
}
