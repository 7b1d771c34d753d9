// Package repository keeps siphon's backup chains where production keeps
// backups: in a bucket (a local directory, S3, GCS, Azure Blob Storage,
// through gocloud.dev/blob), listed with their positions and times,
// verified, restored as of a time or a Position, expired by a retention
// policy, compressed, and encrypted with a key the user holds.
//
// It is built on siphon's Conn.Backup, Conn.BackupIncrementalAfter,
// VerifyStreamChain and Conn.RestoreChain, and is a Go module of its own
// (github.com/siphondb/siphon/repository), so that the cloud SDKs it
// brings stay out of the programs that import siphon alone.
//
//	repo, err := repository.Open(ctx, "s3://backups?region=eu-west-1", repository.WithKey(key))
//	src, err := siphon.Connect(ctx, dsn, siphon.WithSlot("shop_backup"), repo.StreamKey())
//	chain, err := repo.StartChain(ctx, src, repository.StartChainOptions{}) // daily: a base backup
//	chain, err = repo.AddLink(ctx, src, "")                                // hourly: an incremental
//	chains, err := repo.Chains(ctx)                                        // positions, times, sizes, tables
//	rep, err := repo.Verify(ctx, "", repository.VerifyOptions{})           // read back, checked, recorded
//	_, err = repo.Restore(ctx, target, repository.RestoreOptions{Time: t}) // as of t, into an empty database
//	_, err = repo.Expire(ctx, src, repository.ExpireOptions{KeepChains: 7}) // and the base slots dropped
//
// # Buckets
//
// Open takes a gocloud.dev/blob URL; this package imports the drivers of
// "file://" and "s3://". For Google Cloud Storage ("gs://") or Azure Blob
// Storage ("azblob://"), import gocloud.dev/blob/gcsblob or
// gocloud.dev/blob/azureblob in your program (a blank import) and open by
// URL, or open the bucket yourself and pass it to New. For a local
// directory use "file:///var/backups/siphon?create_dir=true&no_tmp_dir=true&metadata=skip":
// no_tmp_dir writes each object next to its final name and renames it
// when complete (so an upload never crosses file systems, and what a killed
// one leaves is swept by Expire), and metadata=skip leaves out
// gocloud's ".attrs" files. An S3-compatible server takes "endpoint=",
// "use_path_style=true" and, without TLS, "disable_https=true". Give
// the bucket a lifecycle rule that aborts incomplete multipart uploads
// after a day: a killed upload's parts are invisible but stored.
//
// Uploads stream: a base backup goes from pg_dump through the repository
// into the bucket's writer (S3 multipart uploads of 5 MiB parts) as it is
// written, and downloads stream back the same way: nothing holds a whole
// link in memory or in a temporary file (siphon's Restore spools the base's
// body to a temporary file for pg_restore, as it always does).
//
// # Layout
//
// Everything lives under "chains/", one folder per chain, named by the time
// it was started (UTC, to the millisecond) and 6 random characters, so that
// folders sort by time:
//
//	chains/20261201T020000.000Z-k3m9x2/
//	    0001-base-a7c2qd.dump           the base backup: pg_dump's custom-format archive, as pg_dump wrote it
//	    0002-incr-m2x8pa.jsonl.zst      an incremental: canonical JSONL (see package canonical), zstd-compressed
//	    0003-incr-9fkq2b.jsonl.zst      ...
//	    manifest-0001.json              the chain when it held 1 link
//	    manifest-0002.json              ... 2 links
//	    manifest-0003.json              ... 3 links: the newest manifest is the chain
//	    verified-20261201T060000.123456789Z-x2pq.json   the result of a Verify
//	    expired.json                    only while Expire removes the chain
//
// In a repository opened WithKey every object but expired.json ends in
// ".enc" and is encrypted (see "Encryption"). A base backup taken with
// siphon.BackupOptions.Jobs is a tar of pg_dump's directory format, named
// "0001-base-....tar".
//
// Each link is written once, under a name with a random part that no other
// writer uses, and never changed. A link exists only once a manifest lists
// it: the manifest of the next generation is written last, after the link's
// object is complete, with a conditional write (gocloud's IfNotExist: S3's
// If-None-Match, GCS and Azure preconditions, and a lock within the process
// for a directory), and read back. So an upload that fails or is killed
// leaves an object no manifest lists (an orphan, which Expire deletes once
// older than ExpireOptions.OrphansAfter), never a link a listing shows; and
// of two writers that add to a chain at the same time, the second to write
// its manifest gets a *ConflictError and its link is not added (see
// ConflictError). A directory bucket shared by two processes checks the
// condition and reads the manifest back, which catches all but a race of
// both within microseconds: run one writer per chain.
//
// A manifest is JSON, the SHA-256 of its bytes first:
//
//	{"sha256": "<hex of the bytes of the manifest member>",
//	 "manifest": {"format": "siphon-repository-manifest", "version": 1,
//	   "chain": "...", "generation": 3, "written": "...", "writer": "...",
//	   "system_id": "...", "timeline": 1, "slot": "...", "base_slot": "siphon_...",
//	   "links": [{"n": 1, "kind": "dump", "body": "pg_dump-custom", "object": "chains/.../0001-base-a7c2qd.dump",
//	              "start": "0/3000028", "end": "0/3000028", "link": "...", "created": "...",
//	              "bytes": 8123, "stored_bytes": 8123, "sha256": "...", "tables": [...],
//	              "envelope": {"head": "...", "trailer": {...}}},
//	             {"n": 2, "kind": "incremental", "compression": "zstd", "start": "0/3000028", "end": "0/30A1B70",
//	              "previous": "...", "transactions": 12, "first_commit": "...", "last_commit": "...", ...}]}}
//
// "sha256" and "stored_bytes" of a link are the object's as stored (an
// encrypted object has no "sha256": its segments authenticate it); a base's
// "envelope" holds what siphon's envelope had around pg_dump's archive (its
// header lines and trailer), so that the object is pg_dump's archive alone
// and a restore frames it again into the very envelope siphon wrote.
//
// # Restoring by hand
//
// With nothing but the bucket and PostgreSQL's tools, from an unencrypted
// repository: read the newest manifest of the chain (the highest
// manifest-NNNN.json), download its link 1 and restore it:
//
//	pg_restore --exit-on-error -d postgres://.../restored 0001-base-a7c2qd.dump
//
// (for a ".tar" base: tar -xf it into a directory and pg_restore -Fd that).
// The database is then the source at the base's "start" Position. The
// incrementals after it are readable with zstd -d (JSONL, one record a line)
// but applying them is siphon's work: Conn.ConsumeCanonical applies one
// (in order, each exactly once), or Conn.RestoreChain with the links. From an
// encrypted repository the objects must be decrypted first, which no
// standard tool does: Decrypt does it, for example with this program
// (go run it with the key in a file; see ExampleDecrypt):
//
//	key, _ := os.ReadFile("repository.key")
//	in, _ := os.Open("0001-base-a7c2qd.dump.enc")
//	out, _ := os.Create("0001-base-a7c2qd.dump")
//	err := repository.Decrypt(out, in, "chains/20261201T020000.000Z-k3m9x2/0001-base-a7c2qd.dump.enc", key)
//
// The manifests of an encrypted repository are encrypted too: Chains reads
// them.
//
// # Encryption
//
// WithKey takes a master key of at least 32 random bytes, which the user
// keeps (never in the bucket). From it HKDF-SHA-256 derives three subkeys:
// one encrypts the links and verification records, one the manifests, and
// one is the canonical stream key (Repository.StreamKey, siphon's
// WithStreamKey), which authenticates the incrementals' JSONL so that a
// restore runs their schema changes. Each object is encrypted with
// AES-256-GCM under a key derived from its subkey and a random 32-byte salt
// of its own, in segments of 1 MiB, each bound to its number, to whether it
// is the last, and to the object's name (from "chains/" on); the object's
// header names the master key by its id (canonical.KeyID of it), so that
// WithKey(newKey, oldKey) writes with the new key and reads both. The format
// is written out in crypt.go.
//
// # Threat model
//
// Whoever can write to the bucket but does not hold the key (a storage
// administrator, a leaked bucket credential, a bug in another program)
// can, in an encrypted repository, read nothing of the data (the object
// names, sizes and times are visible, and so is how many links each chain
// has; the manifests, which name the tables, are encrypted) and change
// nothing unnoticed: a changed byte, an object cut short, two objects
// swapped, one copied from another chain or another repository, or one
// written with another key is refused with an *IntegrityError naming it,
// and a restore reads and checks every link before it applies anything.
// The base backup, which siphon itself only checksums, is authenticated here
// too. What the key cannot prevent: deleting objects (a chain or its newest
// manifests can be removed, which makes the chain shorter or gone, never
// different; keep the bucket's object versioning or a copy if that matters),
// and replaying a whole older repository in place of the current one.
// The key's holder is trusted: whoever has it can write chains a restore
// accepts.
//
// An unencrypted repository (no WithKey) protects against accidents only:
// every object is checked against the SHA-256 and size its manifest
// records, and every manifest against its own SHA-256, so a flipped bit,
// a cut upload or two objects mixed up are refused, naming the object. It
// does not protect against anyone who can write to the bucket: they can
// read everything, and change a link and its manifest's checksum together,
// or write a chain of their own. Restoring a chain runs the SQL of its
// base backup (and, with siphon.ApplyOptions.UnauthenticatedSchemaChanges,
// the schema changes of its incrementals) on the target: keep an
// unencrypted repository where only trusted writers reach it.
//
// # Retention
//
// Expire keeps the chains an ExpireOptions policy keeps (the newest
// KeepChains, and those whose newest link was written within KeepFor;
// never the newest chain) and removes the others: a tombstone first, so
// the chain leaves listings at once, then its base slot on the source (a
// chain's physical base slot pins the source's WAL from the base backup on,
// until the chain is expired: keep only as many chains as the source's
// disk can hold WAL for), then its objects. The source's persistent
// logical slot, which every chain's incrementals read, stays.
//
// # Metrics and progress
//
// With WithMeterProvider the repository records, through the OpenTelemetry
// metric API (meter "github.com/siphondb/siphon/repository"):
//
//   - siphon.repository.uploaded (By, counter): bytes written to the bucket
//     as stored, attribute kind (dump, incremental, manifest, record);
//   - siphon.repository.downloaded (By, counter): bytes read, as stored;
//   - siphon.repository.objects ({object}, counter): objects written, read
//     and deleted, attributes op (upload, download, delete) and kind;
//   - siphon.repository.duration (s, histogram): each call's duration,
//     attributes call (start_chain, add_link, list, verify, restore, expire)
//     and outcome (ok, error);
//   - siphon.repository.errors ({error}, counter): failed calls, attributes
//     call and kind (integrity, conflict, mismatch, option, no_chain,
//     canceled, other).
//
// WithProgress receives the bytes done of each upload and download, about
// every MiB and at the end, as siphon's WithProgress reports table copies.
package repository
