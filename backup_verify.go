package siphon

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"time"

	"github.com/siphondb/siphon/canonical"
	"github.com/siphondb/siphon/pgdump"
)

// VerifyReport says what [Conn.Verify] found in one backup stream.
type VerifyReport struct {
	// OK is true when the stream has no problem: its envelope, checksums
	// and body all check out.
	OK bool
	// Problems lists what is wrong, each saying where (a byte offset of
	// the stream, or a line of a JSONL body) and what was expected.
	Problems []string
	// Enveloped is false for a bare JSONL stream (as
	// [Conn.BackupIncremental] writes it), true for an envelope.
	Enveloped bool
	// Checked is true when checksums vouch for the backup's bytes: an
	// envelope's, or a JSONL stream's own (see [canonical.Header].Checked).
	// A bare JSONL stream without them (written by hand, or by siphon
	// before streams were checked) is a problem (which
	// [ApplyOptions].Unchecked accepts when applying it).
	Checked bool
	// Kind is the backup's kind (dump, snapshot or incremental) and Body
	// its body's format ("" for a bare JSONL stream).
	Kind canonical.Kind
	Body canonical.BodyFormat
	// Start and End are where the backup starts and ends on the source's
	// timeline (equal for a dump or a snapshot).
	Start, End canonical.Position
	// SystemID and Timeline identify the source; Slot is the replication
	// slot the backup is aligned with.
	SystemID string
	Timeline uint32
	Slot     string
	// ServerVersion is the source's version; Tool what wrote the body.
	ServerVersion, Tool string
	// Base is the physical base slot and its WAL range, when the backup
	// made one.
	Base *canonical.EnvelopeBase
	// Previous is the Link of the backup this one continues, when it
	// recorded one; Link identifies this one: an envelope's (see
	// [canonical.EnvelopeTrailer.Link]) or a checked JSONL stream's (see
	// [canonical.Decoder.Link]).
	Previous, Link string
	// Authenticated is true when a JSONL stream is authenticated with one
	// of the Conn's keys ([WithStreamKey]), which verified every byte of
	// it, to its end: only the key holder wrote it. KeyID names the key a JSONL stream
	// says it is authenticated with (see [canonical.KeyID]), held by the
	// Conn or not; empty for a stream that is not authenticated. A stream
	// that names one of the Conn's keys and fails its check is a problem.
	Authenticated bool
	KeyID         string
	// SchemaChanges counts a JSONL stream's schema changes (DDL records):
	// restoring it runs each as a statement on the target. Those of a
	// stream that is not Authenticated are a problem (which
	// [ApplyOptions].UnauthenticatedSchemaChanges accepts when applying
	// it).
	SchemaChanges int
	// Created is when the backup was written.
	Created time.Time
	// Bytes is the stream's size as read; BodyBytes the body's.
	Bytes, BodyBytes int64
	// Tables lists the tables the backup holds.
	Tables []canonical.TableName
	// Entries counts the archive's table of contents entries (dumps) or
	// the records between header and end (JSONL).
	Entries int
}

func (r *VerifyReport) problem(format string, args ...any) {
	r.Problems = append(r.Problems, fmt.Sprintf(format, args...))
}

// Verify reads a backup stream to its end and checks it, touching no
// database: the envelope's framing, chunk checksums, length and SHA-256
// (see [canonical.EnvelopeReader]); for a dump, that pg_restore --list
// reads the archive and that it holds every table the header lists; for
// JSONL (a snapshot or an incremental, enveloped or bare), a full decode,
// authenticated with the Conn's keys ([WithStreamKey]), and that it agrees
// with its envelope. Problems with the stream go in the report (OK false);
// Verify returns an error only when it could not check: the reader
// failed, ctx ended, pg_restore is missing.
//
// Of the Conn it uses only its keys: [VerifyStream] does the same with no
// Conn and no server.
func (c *Conn) Verify(ctx context.Context, r io.Reader) (*VerifyReport, error) {
	return verifyStream(ctx, r, c.rules(ApplyOptions{}))
}

// VerifyOptions say how [VerifyStream] and [VerifyStreamChain], which have
// no Conn, check streams. The zero value authenticates nothing.
type VerifyOptions struct {
	// Keys authenticate JSONL streams as a Conn's keys do (see
	// [WithStreamKey]): the current key and the previous ones, each of at
	// least 32 bytes. Defaults to none: no stream is Authenticated, and
	// the schema changes of every JSONL stream are a problem.
	Keys [][]byte
}

// rules returns the stream rules of opt, or an *OptionError for a key
// that is too short.
func (opt VerifyOptions) rules() (streamRules, error) {
	for i, k := range opt.Keys {
		if len(k) < canonical.MinKeyBytes {
			return streamRules{}, &OptionError{Option: "VerifyOptions.Keys",
				Problem: fmt.Sprintf("key %d has %d bytes, fewer than %d", i, len(k), canonical.MinKeyBytes),
				Fix:     "give the keys the streams were written with (WithStreamKey)"}
		}
	}
	return streamRules{keys: opt.Keys}, nil
}

// VerifyStream is [Conn.Verify] without a Conn, for a process that checks
// backups and has no database to connect to (a backup orchestrator, the
// first step of a restore drill): verifying needs only the stream, the
// keys that authenticate it, and pg_restore for a dump.
func VerifyStream(ctx context.Context, opt VerifyOptions, r io.Reader) (*VerifyReport, error) {
	rules, err := opt.rules()
	if err != nil {
		return nil, err
	}
	return verifyStream(ctx, r, rules)
}

// verifyStream is Verify, with the call's rules.
func verifyStream(ctx context.Context, r io.Reader, rules streamRules) (*VerifyReport, error) {
	rep := &VerifyReport{}
	counted := &countingReader{r: &ctxReader{ctx: ctx, r: r}}
	br := bufio.NewReaderSize(counted, 64<<10)
	var err error
	if first, _ := br.Peek(1); len(first) == 1 && first[0] == '{' {
		err = verifyJSONL(br, rep, nil, rules)
		rep.Bytes = counted.n - int64(br.Buffered())
		if err == nil && !rep.Checked && !rules.unchecked {
			rep.problem("the JSONL stream carries no checksums (written by hand, or by siphon before streams were checked): " +
				"nothing vouches for its content; write it with canonical.Encoder, or apply it anyway with ApplyOptions.Unchecked")
		}
	} else {
		err = verifyEnvelope(ctx, br, rep, rules)
	}
	if err != nil {
		return nil, errorf("siphon: verify: %w", err)
	}
	rep.OK = len(rep.Problems) == 0
	return rep, nil
}

// streamProblem files err in the report when it is a problem of the
// stream, and returns it otherwise.
func streamProblem(rep *VerifyReport, err error) error {
	var envErr *canonical.EnvelopeError
	var decErr *canonical.DecodeError
	switch {
	case errors.As(err, &envErr):
		rep.problem("%v", envErr)
	case errors.As(err, &decErr) && !isReadError(decErr):
		rep.problem("JSONL body, %v", decErr)
	default:
		return err
	}
	return nil
}

// contentErrors are the decode errors that say what is wrong with a
// JSONL stream itself.
var contentErrors = []error{canonical.ErrSyntax, canonical.ErrInvalidRecord, canonical.ErrOrder, canonical.ErrUnknownTable,
	canonical.ErrUnsupportedVersion, canonical.ErrInvalidUTF8, canonical.ErrLineTooLong, canonical.ErrChecksum, canonical.ErrAuthentication, io.ErrUnexpectedEOF}

// isReadError reports whether a decode error is the reader's failure
// rather than the stream's content.
func isReadError(err *canonical.DecodeError) bool {
	for _, content := range contentErrors {
		if errors.Is(err, content) {
			return false
		}
	}
	return true
}

// verifyEnvelope checks an envelope and its body.
func verifyEnvelope(ctx context.Context, r io.Reader, rep *VerifyReport, rules streamRules) error {
	er := canonical.NewEnvelopeReader(r)
	h, err := er.Header()
	if err != nil {
		rep.Bytes = er.Offset()
		return streamProblem(rep, err)
	}
	rep.Enveloped, rep.Checked, rep.Kind, rep.Body, rep.Start, rep.End = true, true, h.Kind, h.Body, h.Start, h.End
	rep.SystemID, rep.Timeline, rep.Slot, rep.ServerVersion, rep.Tool = h.SystemID, h.Timeline, h.Slot, h.ServerVersion, h.Tool
	rep.Base, rep.Previous, rep.Created, rep.Tables = h.Base, h.Previous, h.Created, h.Tables
	switch h.Body {
	case canonical.BodyPgDumpCustom:
		err = verifyDumpCustom(ctx, er, h, rep)
	case canonical.BodyPgDumpDirectoryTar:
		err = verifyDumpTar(ctx, er, h, rep)
	case canonical.BodyJSONL:
		err = verifyJSONL(er, rep, &h, rules)
	}
	if err != nil {
		return err
	}
	if len(rep.Problems) > 0 {
		rep.Bytes = er.Offset()
		return nil // the envelope's own error, if any, is already filed
	}
	return finishEnvelope(er, h, rep)
}

// finishEnvelope reads the envelope to its end and files its trailer.
func finishEnvelope(er *canonical.EnvelopeReader, h canonical.EnvelopeHeader, rep *VerifyReport) error {
	_, err := io.Copy(io.Discard, er)
	rep.Bytes = er.Offset()
	if err != nil {
		return streamProblem(rep, err)
	}
	t, err := er.Trailer()
	if err != nil {
		return err
	}
	rep.BodyBytes, rep.Link = t.BodyBytes, t.Link()
	if !t.End.IsZero() {
		if rep.Kind != canonical.KindDump && rep.End != 0 && rep.End != t.End {
			rep.problem("the envelope's trailer ends at %v, but its JSONL body at %v", t.End, rep.End)
		}
		rep.End = t.End
	}
	if h.Base != nil {
		base := *h.Base
		base.WALEnd = t.BaseWALEnd
		rep.Base = &base
	}
	return nil
}

// verifyDumpCustom runs pg_restore --list on the body, then checks that
// the archive has every table the header lists.
func verifyDumpCustom(ctx context.Context, er *canonical.EnvelopeReader, h canonical.EnvelopeHeader, rep *VerifyReport) error {
	listing, err := pgdump.List(ctx, pgdump.ListOptions{Exec: pgdump.ExecOptions{ServerVersion: toolVersion(h)}}, er)
	return checkListing(listing, err, h, rep)
}

// toolVersion is the release of the pg_dump that wrote the body: the
// oldest pg_restore that reads it.
func toolVersion(h canonical.EnvelopeHeader) pgdump.Version {
	v, _ := pgdump.ParseVersion(h.Tool)
	return v
}

func checkListing(listing *pgdump.Listing, err error, h canonical.EnvelopeHeader, rep *VerifyReport) error {
	var exitErr *pgdump.ExitError
	switch {
	case errors.As(err, &exitErr):
		rep.problem("the body is not an archive pg_restore can read (pg_restore --list: %s)", exitErr.Stderr)
		return nil
	case err != nil:
		return streamProblem(rep, err)
	}
	rep.Entries = len(listing.Entries)
	for _, t := range h.Tables {
		if _, ok := listing.Find("TABLE", t.Schema, t.Name); !ok {
			rep.problem("the header lists table %s, but the archive has no TABLE entry for it", t)
		}
	}
	return nil
}

// verifyDumpTar checks a directory-format dump carried as a tar: plain
// flat files, toc.dat first, which pg_restore --list must read.
func verifyDumpTar(ctx context.Context, er *canonical.EnvelopeReader, h canonical.EnvelopeHeader, rep *VerifyReport) error {
	dir, remove, err := pgdump.MkdirTemp("", "siphon-verify-*")
	if err != nil {
		return err
	}
	defer remove()
	first := true
	err = readDumpTar(er, func(name string, body io.Reader) error {
		if first && name != "toc.dat" {
			return fmt.Errorf("the dump's tar starts with %q instead of toc.dat", name)
		}
		first = false
		if name == "toc.dat" {
			return writeFile(filepath.Join(dir, name), body)
		}
		return nil
	})
	switch {
	case errors.Is(err, errNoTOC):
		rep.problem("the body's tar has no toc.dat: it is not a directory-format dump")
		return nil
	case err != nil:
		if streamProblem(rep, err) != nil {
			rep.problem("the body is not a directory-format dump as a tar: %v", err)
		}
		return nil
	}
	listing, err := pgdump.ListFile(ctx, pgdump.ListOptions{Exec: pgdump.ExecOptions{ServerVersion: toolVersion(h)}}, dir)
	return checkListing(listing, err, h, rep)
}

// verifyJSONL decodes a JSONL stream to its end, checking it against its
// envelope's header, if any, and authenticating it with the rules' keys.
func verifyJSONL(r io.Reader, rep *VerifyReport, env *canonical.EnvelopeHeader, rules streamRules) error {
	d := rules.newDecoder(r)
	jh, err := d.Header()
	if err != nil {
		return streamProblem(rep, err)
	}
	rep.KeyID = jh.KeyID
	if env == nil {
		rep.Kind, rep.Start, rep.End, rep.Created = jh.Kind, jh.Start, jh.End, jh.Created
		rep.SystemID, rep.Timeline, rep.Slot, rep.ServerVersion = jh.SystemID, jh.Timeline, jh.Slot, jh.ServerVersion
		rep.Previous, rep.Checked = jh.Previous, jh.Checked
	} else {
		checkJSONLHeader(jh, env, rep)
	}
	seen := map[canonical.TableName]bool{}
	for {
		rec, err := d.Next()
		if err == io.EOF {
			if env == nil {
				rep.Link = d.Link()
			}
			rep.Authenticated = d.Authenticated() // every byte verified
			return nil
		}
		if err != nil {
			return streamProblem(rep, err)
		}
		if rec.Type == canonical.RecordChange && rec.Change.Op == canonical.OpDDL {
			if rep.SchemaChanges++; rep.SchemaChanges == 1 {
				if err := rules.checkSchemaChange(d, rec); err != nil {
					rep.problem("JSONL body: %v", err)
				}
			}
		}
		switch rec.Type {
		case canonical.RecordTable:
			if name := rec.TableName(); !seen[name] {
				seen[name] = true
				rep.Tables = append(rep.Tables, name)
			}
		case canonical.RecordEnd:
			rep.Entries = int(rec.Count)
			if rep.End != 0 && rep.End != rec.Position {
				rep.problem("JSONL body, line %d: the end record says %v, the header %v", rec.Count+2, rec.Position, rep.End)
			}
			rep.End = rec.Position
		}
	}
}

// checkJSONLHeader compares a JSONL body's header with its envelope's.
func checkJSONLHeader(jh canonical.Header, env *canonical.EnvelopeHeader, rep *VerifyReport) {
	if jh.Kind != env.Kind {
		rep.problem("JSONL body, line 1: kind %q, but the envelope says %q", jh.Kind, env.Kind)
	}
	if jh.Start != env.Start {
		rep.problem("JSONL body, line 1: starts at %v, but the envelope says %v", jh.Start, env.Start)
	}
	if jh.SystemID != "" && env.SystemID != "" && jh.SystemID != env.SystemID {
		rep.problem("JSONL body, line 1: system identifier %s, but the envelope says %s", jh.SystemID, env.SystemID)
	}
	if jh.Timeline != 0 && env.Timeline != 0 && jh.Timeline != env.Timeline {
		rep.problem("JSONL body, line 1: timeline %d, but the envelope says %d", jh.Timeline, env.Timeline)
	}
}

// ChainReport says what [Conn.VerifyChain] found in a chain of backups.
type ChainReport struct {
	// OK is true when every link is OK and the links form one chain.
	OK bool
	// Problems lists every problem, each starting with "link N" (1-based).
	Problems []string
	// Links are the reports of each link, in order.
	Links []*VerifyReport
	// Start and End are where the chain starts and ends.
	Start, End canonical.Position

	// byLink holds each link's Problems, in order.
	byLink [][]string
}

// VerifyChain verifies each link of a chain (a base backup, then the
// incrementals that continue it, in order) as [Conn.Verify] does, and that
// they form one chain: one system identifier and timeline, every link
// after the first an incremental that starts exactly where the previous
// one ended (a gap loses changes, an overlap repeats them), and, between
// envelopes, each Previous naming the previous link. Each link is read
// from its current offset to its end. It returns an error only when it
// could not read a link. Like Verify it touches no database:
// [VerifyStreamChain] does the same with no Conn.
func (c *Conn) VerifyChain(ctx context.Context, links ...io.ReadSeeker) (*ChainReport, error) {
	return verifyChain(ctx, links, c.rules(ApplyOptions{}))
}

// VerifyStreamChain is [Conn.VerifyChain] without a Conn, as
// [VerifyStream] is [Conn.Verify].
func VerifyStreamChain(ctx context.Context, opt VerifyOptions, links ...io.ReadSeeker) (*ChainReport, error) {
	rules, err := opt.rules()
	if err != nil {
		return nil, err
	}
	return verifyChain(ctx, links, rules)
}

// verifyChain is VerifyChain, with the call's rules.
func verifyChain(ctx context.Context, links []io.ReadSeeker, rules streamRules) (*ChainReport, error) {
	chain := &ChainReport{}
	for i, r := range links {
		rep, err := verifyStream(ctx, r, rules)
		if err != nil {
			return nil, errorf("siphon: verify chain, link %d: %w", i+1, err)
		}
		chain.Links = append(chain.Links, rep)
		var problems []string
		for _, p := range rep.Problems {
			problems = append(problems, fmt.Sprintf("link %d: %s", i+1, p))
		}
		if i > 0 {
			problems = append(problems, linkProblems(i+1, chain.Links[i-1], rep)...)
		}
		chain.byLink = append(chain.byLink, problems)
		chain.Problems = append(chain.Problems, problems...)
	}
	if len(chain.Links) > 0 {
		chain.Start, chain.End = chain.Links[0].Start, chain.Links[len(chain.Links)-1].End
	}
	chain.OK = len(chain.Links) > 0 && len(chain.Problems) == 0
	if len(chain.Links) == 0 {
		chain.Problems = append(chain.Problems, "no link given")
	}
	return chain, nil
}

// linkProblems checks that link n (1-based) continues link n-1, from what
// was read of both: a link whose header could not be read says nothing of
// its source or where it starts, one whose end could not be read (cut or
// damaged before its end record) nothing of where it ends, and one not
// read to its end nothing of its authentication. Their own problems say
// why; comparing what is unknown would add false ones (a gap after a
// damaged link).
func linkProblems(n int, prev, cur *VerifyReport) []string {
	var out []string
	add := func(format string, args ...any) {
		out = append(out, fmt.Sprintf("link %d: ", n)+fmt.Sprintf(format, args...))
	}
	if !cur.headerRead() {
		return nil
	}
	if cur.Kind != canonical.KindIncremental {
		add("is a %s: only incrementals continue a chain", cur.Kind)
	}
	if !prev.headerRead() {
		return out
	}
	if cur.SystemID != prev.SystemID {
		add("comes from system %q, link %d from system %q: they are different clusters", cur.SystemID, n-1, prev.SystemID)
	}
	if cur.Timeline != prev.Timeline {
		add("is on timeline %d, link %d on timeline %d", cur.Timeline, n-1, prev.Timeline)
	}
	switch {
	case !prev.endRead():
	case cur.Start > prev.End:
		add("starts at %v, but link %d ends at %v: a gap, the changes between them are missing", cur.Start, n-1, prev.End)
	case cur.Start < prev.End:
		add("starts at %v, but link %d ends at %v: an overlap, the changes between them would be applied twice", cur.Start, n-1, prev.End)
	}
	if cur.Slot != prev.Slot && cur.Slot != "" && prev.Slot != "" {
		add("comes from slot %q, link %d from slot %q: they are different change streams", cur.Slot, n-1, prev.Slot)
	}
	if cur.Previous != "" && prev.Link != "" && cur.Previous != prev.Link {
		add("names %s as its previous link, but link %d is %s", cur.Previous, n-1, prev.Link)
	}
	if prev.Authenticated && !cur.Authenticated && len(cur.Problems) == 0 {
		add("is not authenticated with the Conn's keys, but link %d is: it was not written by the key's holder (or with a key the Conn was not given, see WithStreamKey)", n-1)
	}
	return out
}

// headerRead reports whether the backup's header was read: its kind,
// source and start are known.
func (r *VerifyReport) headerRead() bool { return r.Kind != "" }

// endRead reports whether where the backup ends is known: from its end
// record, its trailer, or a header that says it (a dump's). No backup
// ends at 0/0.
func (r *VerifyReport) endRead() bool { return r.End != 0 }

// ChainLink is what the next backup of a chain continues: where a backup
// ends and the Link that identifies it. [VerifyReport.ChainLink] gives a
// verified backup's; [Conn.BackupIncrementalAfter] takes one and returns
// the next. It marshals to JSON, to keep in a catalog of backups.
type ChainLink struct {
	End  canonical.Position `json:"end"`
	Link string             `json:"link,omitempty"`
}

// ChainLink returns what the backup the report describes hands on to the
// next incremental of its chain: its End and Link.
func (r *VerifyReport) ChainLink() ChainLink { return ChainLink{End: r.End, Link: r.Link} }

// countingReader counts the bytes read through it.
type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}
