package canonical

import "time"

// The JSONL format's name and the version this package writes and reads. A
// header with another version is refused with [ErrUnsupportedVersion].
const (
	FormatName    = "siphon.jsonl"
	FormatVersion = 1
)

// EnginePostgres is the [Header.Engine] of streams read from PostgreSQL.
const EnginePostgres = "postgres"

// Kind says what a JSONL stream holds.
type Kind string

// The kinds of JSONL stream. A snapshot holds table and row records; an
// incremental backup and a recorded change stream hold table records and
// change records (begin, insert, update, delete, truncate, message, commit).
const (
	// KindSnapshot is a consistent snapshot (EmitCanonical's output); its
	// header's Start is the snapshot's consistent point.
	KindSnapshot Kind = "snapshot"
	// KindIncremental is a bounded change set (BackupIncremental's output);
	// its header's Start is the Position it continues from.
	KindIncremental Kind = "incremental"
	// KindChanges is a recorded change stream, for tests and replays.
	KindChanges Kind = "changes"
)

// valid reports whether k is one of the known kinds.
func (k Kind) valid() bool {
	return k == KindSnapshot || k == KindIncremental || k == KindChanges
}

// holdsRows reports whether a stream of kind k holds row records; otherwise
// it holds change records.
func (k Kind) holdsRows() bool { return k == KindSnapshot }

// Header is the first record of a JSONL stream. In JSON it also carries the
// format name and version, which the Encoder writes and the Decoder checks.
type Header struct {
	// Kind says what the stream holds. Required.
	Kind Kind
	// Engine names the source's engine, [EnginePostgres] for PostgreSQL.
	Engine string
	// Start is where the stream starts on the source's timeline: a
	// snapshot's consistent point, or the Position an incremental continues
	// from. JSON field "position".
	Start Position
	// End is where the stream ends, when known at the time the header is
	// written; zero (and omitted) otherwise. The end record always carries
	// it. JSON field "end".
	End Position
	// SystemID is the source's system identifier (pg_control_system), as
	// decimal text; it tells apart clusters whose positions are unrelated.
	SystemID string
	// Timeline is the source's timeline ID.
	Timeline uint32
	// Slot names the replication slot the stream was read through.
	Slot string
	// ServerVersion is the source's version, for example "15.18".
	ServerVersion string
	// Created is when the stream was written. It is written in UTC with up
	// to nanosecond precision.
	Created time.Time
	// Previous, for a stream that continues a chain of backups, is the
	// Link of the backup it continues (see [Decoder.Link] and
	// [EnvelopeTrailer.Link]); empty otherwise. JSON field "previous".
	Previous string
	// Checked is true when the stream carries checksums, which the Decoder
	// verifies (every stream an Encoder writes does; the Encoder ignores
	// this field); false for a stream written without them (by hand, or by
	// siphon before checksums), whose bytes nothing vouches for. JSON field
	// "checksum" ("crc32c") with the header's "sum".
	Checked bool
	// KeyID, for an authenticated stream, names the key it was
	// authenticated with (see [KeyID] and [Encoder.SetKey]); empty for a
	// stream that is not. It says what the writer claims:
	// [Decoder.Authenticated] says whether the Decoder holds that key and so
	// verifies the claim. The Encoder ignores this field (it writes the id
	// of its key). JSON fields "auth" ("hmac-sha256") and "key".
	KeyID string
}
