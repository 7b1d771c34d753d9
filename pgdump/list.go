package pgdump

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// ListOptions says how to run pg_restore --list.
type ListOptions struct {
	// Exec says how to find and run pg_restore.
	Exec ExecOptions
}

// Listing is an archive's table of contents, as pg_restore --list prints
// it.
type Listing struct {
	// Format is the archive format as pg_restore names it: CUSTOM,
	// DIRECTORY or TAR.
	Format string
	// Database is the name of the database that was dumped.
	Database string
	// ArchiveVersion is the archive format's version, for example "1.14-0".
	ArchiveVersion string
	// ServerVersion and DumpVersion are the releases of the server dumped
	// and of the pg_dump that dumped it.
	ServerVersion, DumpVersion string
	// Compression is the compression pg_restore reports.
	Compression string
	// Entries are the archive's entries in restore order.
	Entries []Entry
}

// Entry is one line of an archive's table of contents.
type Entry struct {
	// ID is the entry's dump ID.
	ID int
	// CatalogOID and OID identify the object in the dumped database.
	CatalogOID, OID uint32
	// Text is the rest of the line: the entry type ("TABLE", "TABLE
	// DATA", "SEQUENCE SET"...), the schema ("-" when none), the name and
	// the owner, separated by spaces and not quoted, so a name holding
	// spaces cannot be told from its neighbours; use [Entry.Is] to look
	// for a known object.
	Text string
}

// Is reports whether e is the entry of type desc ("TABLE", "TABLE DATA")
// for the object schema.name.
func (e Entry) Is(desc, schema, name string) bool {
	if schema == "" {
		schema = "-"
	}
	want := desc + " " + sanitizeLine(schema) + " " + sanitizeLine(name) + " "
	return strings.HasPrefix(e.Text, want)
}

// Find returns the first entry of type desc for schema.name, if any.
func (l *Listing) Find(desc, schema, name string) (Entry, bool) {
	for _, e := range l.Entries {
		if e.Is(desc, schema, name) {
			return e, true
		}
	}
	return Entry{}, false
}

// sanitizeLine does what pg_restore does to names in a listing: line
// breaks become spaces.
func sanitizeLine(s string) string { return strings.NewReplacer("\n", " ", "\r", " ").Replace(s) }

// List runs pg_restore --list on the archive read from r (custom or tar
// format) and returns its table of contents. pg_restore reads only the
// table of contents: List does not read r to its end.
func List(ctx context.Context, opts ListOptions, r io.Reader) (*Listing, error) {
	return list(ctx, opts, "", r)
}

// ListFile runs pg_restore --list on the archive at path: a custom or tar
// format file, or a directory format directory.
func ListFile(ctx context.Context, opts ListOptions, path string) (*Listing, error) {
	return list(ctx, opts, path, nil)
}

func list(ctx context.Context, opts ListOptions, path string, r io.Reader) (*Listing, error) {
	prog, err := Find(ctx, "pg_restore", opts.Exec.Bin, opts.Exec.ServerVersion)
	if err != nil {
		return nil, err
	}
	args := []string{"--list"}
	if path != "" {
		args = append(args, "--", path)
	}
	var out bytes.Buffer
	if err := run(ctx, command{program: prog, args: args, exec: opts.Exec, stdin: r, stdout: &out}); err != nil {
		return nil, err
	}
	return parseListing(&out)
}

// parseListing reads pg_restore --list output.
func parseListing(r io.Reader) (*Listing, error) {
	l := &Listing{}
	header := map[string]*string{
		"Format":                       &l.Format,
		"dbname":                       &l.Database,
		"Dump Version":                 &l.ArchiveVersion,
		"Dumped from database version": &l.ServerVersion,
		"Dumped by pg_dump version":    &l.DumpVersion,
		"Compression":                  &l.Compression,
	}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if strings.HasPrefix(line, ";") {
			key, value, ok := strings.Cut(strings.TrimSpace(strings.TrimPrefix(line, ";")), ":")
			if p := header[key]; ok && p != nil && *p == "" {
				*p = strings.TrimSpace(value)
			}
			continue
		}
		if strings.TrimSpace(line) == "" {
			continue
		}
		e, err := parseEntry(line)
		if err != nil {
			return nil, fmt.Errorf("pgdump: pg_restore --list, line %d: %w", n, err)
		}
		l.Entries = append(l.Entries, e)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("pgdump: pg_restore --list: %w", err)
	}
	return l, nil
}

// parseEntry reads "ID; CATALOGOID OID TEXT".
func parseEntry(line string) (Entry, error) {
	id, rest, ok := strings.Cut(line, "; ")
	fields := strings.SplitN(rest, " ", 3)
	if !ok || len(fields) != 3 {
		return Entry{}, fmt.Errorf("unexpected line %q", line)
	}
	var e Entry
	var err1, err2, err3 error
	e.ID, err1 = strconv.Atoi(id)
	catalog, err2 := strconv.ParseUint(fields[0], 10, 32)
	oid, err3 := strconv.ParseUint(fields[1], 10, 32)
	if err1 != nil || err2 != nil || err3 != nil {
		return Entry{}, fmt.Errorf("unexpected line %q", line)
	}
	e.CatalogOID, e.OID, e.Text = uint32(catalog), uint32(oid), fields[2]
	return e, nil
}

// writeUseList writes the entries of the archive at path that
// opts.Exclude keeps to a pg_restore --use-list file, in a temporary
// directory of opts.Exec.TempDir that remove removes.
func writeUseList(ctx context.Context, opts RestoreOptions, path string) (list string, remove func() error, err error) {
	l, err := ListFile(ctx, ListOptions{Exec: opts.Exec}, path)
	if err != nil {
		return "", nil, err
	}
	dir, remove, err := MkdirTemp(opts.Exec.TempDir, "pgdump-list-*")
	if err != nil {
		return "", nil, fmt.Errorf("pgdump: make a directory for the restore list: %w", err)
	}
	var b bytes.Buffer
	for _, e := range l.Entries {
		if !opts.Exclude(e) {
			fmt.Fprintf(&b, "%d; %d %d %s\n", e.ID, e.CatalogOID, e.OID, e.Text)
		}
	}
	list = filepath.Join(dir, "restore.list")
	if err := os.WriteFile(list, b.Bytes(), 0o600); err != nil {
		remove()
		return "", nil, fmt.Errorf("pgdump: write the restore list: %w", err)
	}
	return list, remove, nil
}
