// Package canonical holds siphon's engine-neutral view of a database's data
// and changes, and the JSONL format that carries it. It depends on the
// standard library only.
//
// # Types
//
// A [Position] is a point on the source's timeline: a PostgreSQL WAL location
// (LSN), printed "16/B374D848". Snapshots, change streams and backups all
// carry one, so they chain with no gap and no duplicate: a resume Position is
// the end of a committed transaction, or a snapshot's consistent point.
//
// A [Change] is one committed change: [OpBegin], then the transaction's
// [OpInsert], [OpUpdate], [OpDelete], [OpTruncate], [OpMessage] and [OpDDL]
// (schema change, [DDL]) changes, then [OpCommit], whose Position is the
// point to resume from. A [Sequence] is the state of a source sequence.
//
// A [Value] is one column value in canonical form: the text the source's
// type output function prints, which is lossless for every type (numeric
// NaN, int8 beyond 2^53, infinity dates, arrays, ranges, composites, ...).
// NULL, an unchanged TOAST value ([Unchanged]) and the empty string are three
// different Values. A [Row] holds a row's Values in column order.
//
// A [Schema] lists [Table] descriptions: schema, name, [Column] names and
// types, primary key, identity key and replica identity.
//
// # The JSONL format
//
// An [Encoder] writes, and a [Decoder] reads, a stream of JSON objects, one a
// line (format "siphon.jsonl", version [FormatVersion]). Member "t" gives the
// record type. A stream is a header, then table records, rows or changes, and
// an end record:
//
//	{"t":"header","format":"siphon.jsonl","version":1,"checksum":"crc32c","kind":"snapshot","engine":"postgres","position":"0/16B3748","end":"0/16B9000","system_id":"7301234567890123456","timeline":1,"slot":"siphon","server_version":"15.18","created":"2026-11-30T05:00:00Z","sum":"xxxxxxxx"}
//	{"t":"table","schema":"public","name":"t","columns":[{"name":"id","type":"bigint","type_oid":20,"nullable":false},{"name":"body","type":"text","type_oid":25,"nullable":true}],"primary_key":["id"],"identity_key":["id"],"replica_identity":"default"}
//	{"t":"row","schema":"public","table":"t","values":["1",null]}
//	{"t":"begin","xid":745,"position":"0/16B3748","commit_time":"2026-11-30T05:00:00.123456Z"}
//	{"t":"insert","schema":"public","table":"t","xid":745,"position":"0/16B3748","new":["1","hello"]}
//	{"t":"update","schema":"public","table":"t","xid":745,"position":"0/16B3748","new":["1",null],"old":["1",null],"unchanged":["body"]}
//	{"t":"delete","schema":"public","table":"t","xid":745,"position":"0/16B3748","old":["1",null]}
//	{"t":"truncate","xid":745,"position":"0/16B3748","tables":[{"schema":"public","name":"t"}],"cascade":false,"restart_identity":false}
//	{"t":"message","xid":745,"position":"0/16B3748","transactional":true,"prefix":"p","content":"aGVsbG8="}
//	{"t":"ddl","xid":745,"position":"0/16B3748","tag":"ALTER TABLE","statement":"ALTER TABLE t ADD COLUMN note text","search_path":"\"$user\", public","objects":[{"type":"table","identity":"public.t"}]}
//	{"t":"commit","xid":745,"position":"0/16B3790","commit_time":"2026-11-30T05:00:00.123456Z","sum":"xxxxxxxx"}
//	{"t":"sequence","schema":"public","name":"t_id_seq","value":1,"called":true,"sum":"xxxxxxxx"}
//	{"t":"end","position":"0/16B3790","records":11,"sum":"xxxxxxxx"}
//
// ("xxxxxxxx" stands for a checksum, see below. A real stream holds either
// rows or changes, as its header's [Kind] says:
// a snapshot holds rows; an incremental backup or a recorded change stream
// holds changes.)
//
// The records:
//
//   - header: always the first line. "position" is where the stream starts
//     (a snapshot's consistent point, or the Position an incremental
//     continues from), "end" where it ends when known, "previous" the Link
//     of the backup an incremental continues. A version other than 1 is
//     refused ([ErrUnsupportedVersion]). See [Header].
//   - table: a table's columns (a column's "default" is true when rows
//     that existed when it was added may hold a value), keys and replica
//     identity. It comes before
//     the first row or change of its table, and again whenever the columns
//     sent with a change differ (like pgoutput's Relation message). Values
//     are aligned with the latest table record of their table.
//   - row: one snapshot row.
//   - begin, insert, update, delete, truncate, message, ddl, commit: one
//     [Change] each. Row changes, truncates, schema changes and
//     transactional messages come between a begin and its commit. A value is a JSON string (its text) or null;
//     "unchanged" names the columns whose value is an unchanged TOAST value
//     (their slot holds null), "old_unchanged" the same for "old". "old" is
//     present when the change has old values. Message content is standard
//     base64. Row changes take the commit time of their begin. A ddl
//     record holds the statement the target runs, the search_path it runs
//     under, the role it ran as ("role"), who ran it ("session_role",
//     "superuser": true when they were one) and the role that installed
//     the capture ("installer"), which a target decides trust on (absent:
//     none), and, for information, the objects it
//     touched ("dropped" marks those it dropped); "problem", when present,
//     says why the statement cannot be replayed (see [DDL]). The table
//     records after it have the new shape.
//   - sequence: a source sequence's last_value and is_called, outside
//     transactions, in any kind of stream (see [Sequence]).
//   - end: the last line of a complete stream. "position" is where the
//     stream ends (the Position to resume from), "records" the number of
//     records between header and end. A stream without it was cut short: the
//     Decoder reports [ErrTruncated], which wraps [io.ErrUnexpectedEOF].
//
// Positions are strings in LSN notation; times are RFC 3339 strings in UTC;
// xid, timeline, type_oid and records are JSON integers.
//
// # Checksums
//
// Every stream an Encoder writes is checked, so that an accident after it
// was stored, copied or sent (a flipped bit, a truncated copy, a disk full)
// is found, and still be written and read in one pass (through a pipe, a
// socket). A checksum finds accidents, not tampering: anyone who can write
// the stream can change it and compute the checksums again (see
// Authentication). A running CRC-32C (Castagnoli) covers
// every byte from the first of the header on, and checkpoint records end
// with a member "sum": the running CRC-32C of the stream up to and
// including `"sum":"` of that line, as eight lowercase hex digits. The
// header (which names the algorithm: "checksum":"crc32c"), every commit,
// every change outside a transaction, every sequence, the end record and,
// in snapshots, a row every 256 KiB are checkpoints. The Decoder verifies
// each checkpoint as it reads it, and requires one on the header, every
// commit, every sequence and the end record of a checked stream, so a changed byte (a digit of a value, a
// position or an xid), a record or transaction removed, repeated or moved,
// or a header made to look unchecked, is an error wrapping [ErrChecksum] at
// the next checkpoint at the latest: a reader that acts on a transaction
// only at its commit never acts on a damaged one. A stream whose header
// carries no sum (written by hand) is read as unchecked: [Header].Checked
// is false. [Decoder.Link] and [Encoder.Link] identify a checked stream by
// its end and last sum, for chains of backups.
//
// # Authentication
//
// A stream written with a key ([Encoder.SetKey]) is also authenticated, so
// that it can be trusted after it was stored where others can write
// (backup storage, a shared directory, a message subject): only the
// holder of the key could have written it. The header names the key by
// its [KeyID] ("auth":"hmac-sha256","key":"<16 hex digits>", see
// [Header].KeyID), and every checkpoint, and every ddl record, carries a
// member "mac" just before its "sum": HMAC-SHA-256, as 64 lowercase hex
// digits, chained from checkpoint to checkpoint so that each covers every
// byte of the stream from the first of the header up to and including
// `"mac":"` of its own line (mac(1) = HMAC(key, 32 zero bytes ‖ the
// bytes through the header's `"mac":"`); mac(i) = HMAC(key, mac(i-1) ‖ the
// bytes after checkpoint i-1's `"mac":"` through checkpoint i's)). The sum
// covers the MAC. A [Decoder] given the key ([Decoder.SetKeys], which
// takes several, for rotation) verifies every MAC as it reads, so that a
// changed, added, removed, reordered or swapped byte or record, a stream
// cut short and extended, or one written with another key under this key's
// id, is an error wrapping [ErrAuthentication] at the next checkpoint at
// the latest, and a ddl record is verified before it is returned;
// [Decoder.Authenticated] reports that it holds the key. A stream stripped
// of its authentication reads as one that is not authenticated: whether
// to act on such a stream is the reader's decision (siphon's
// ConsumeCanonical and RestoreChain refuse their schema changes). The Link
// of an authenticated stream is its key id and last MAC, so a chain whose
// links are authenticated cannot have one swapped. A reader without the
// key still checks the stream's checksums; the unkeyed format is read as
// before, and readers that do not know "mac" ignore it.
//
// # What applying a stream runs
//
// Row changes are data: an apply binds their values as parameters. A ddl
// record is code: applying it (siphon's ConsumeCanonical, RestoreChain)
// runs its statement on the target, as the applying role, which may do
// anything that role may, "COPY ... TO PROGRAM" included for a superuser,
// as restoring a pg_dump archive runs the SQL it holds. Apply a stream's
// schema changes only when its authentication says who wrote it, or when
// every byte of it comes from someone trusted.
//
// # Guarantees
//
// Decoded text is byte-identical to the encoded text: every Unicode
// character, the empty string, and NUL characters (written \u0000) round-trip.
// Strings must be valid UTF-8: the Encoder refuses anything else with an
// [*EncodeError] wrapping [ErrInvalidUTF8] rather than altering it, and the
// Decoder refuses invalid UTF-8 and escaped lone surrogates likewise.
// Identifiers may hold any character (quotes, spaces, upper case, Unicode).
//
// The Encoder refuses, without writing anything of it, any record the
// Decoder would reject; the Decoder checks everything the Encoder writes
// (structure, order, value counts, the end record's count) and reports
// problems as a [*DecodeError] naming the line. Members a record does not
// need are ignored, so later revisions of version 1 can add optional ones.
//
// The Encoder writes rows and changes without reflection and without
// allocating; the Decoder allocates two or three objects per row or change
// (the Row and one string holding its text).
package canonical
