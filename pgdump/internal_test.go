package pgdump

import (
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseVersion(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]Version{
		"15.4": {Major: 15, Minor: 4},
		"pg_dump (PostgreSQL) 15.18 (Debian 15.18-0+deb12u1)": {Major: 15, Minor: 18},
		"9.6.24":  {Major: 9, Minor: 6, Patch: 24},
		"16beta1": {Major: 16},
		"17devel": {Major: 17},
	} {
		v, err := ParseVersion(in)
		require.NoError(t, err, in)
		assert.Equal(t, want, v, in)
	}
	_, err := ParseVersion("pg_dump (PostgreSQL)")
	assert.ErrorIs(t, err, ErrInvalidVersion)

	assert.Equal(t, Version{Major: 15, Minor: 4}, VersionFromNum(150004))
	assert.Equal(t, Version{Major: 9, Minor: 6, Patch: 24}, VersionFromNum(90624))
	assert.Equal(t, "9.6.24", VersionFromNum(90624).String())
	assert.Equal(t, "9.6", VersionFromNum(90624).Release())
	assert.True(t, Version{Major: 14, Minor: 9}.OlderRelease(Version{Major: 15}))
	assert.False(t, Version{Major: 15}.OlderRelease(Version{Major: 15, Minor: 9}), "minor releases do not matter")
	assert.True(t, Version{Major: 9, Minor: 5}.OlderRelease(Version{Major: 9, Minor: 6}))
}

func TestCompressionArg(t *testing.T) {
	t.Parallel()
	v15, v16 := Version{Major: 15, Minor: 4}, Version{Major: 16, Minor: 1}
	for spec, want := range map[string]string{"": "", "6": "6", "none": "0", "gzip:9": "9", "gzip": ""} {
		got, err := compressionArg(spec, v15)
		require.NoError(t, err, spec)
		assert.Equal(t, want, got, spec)
	}
	for _, spec := range []string{"lz4", "zstd:3", "10", "gzip:x"} {
		_, err := compressionArg(spec, v15)
		assert.ErrorIs(t, err, ErrUnsupported, spec)
		assert.Contains(t, err.Error(), "0 to 9", "says what works")
	}
	got, err := compressionArg("zstd:3", v16)
	require.NoError(t, err)
	assert.Equal(t, "zstd:3", got, "release 16 takes methods")
}

func TestTailBufferKeepsTheEnd(t *testing.T) {
	t.Parallel()
	b := &tailBuffer{limit: 16}
	b.Write([]byte("first line\n"))
	assert.Equal(t, "first line\n", b.String())
	b.Write([]byte("second\nthird\n"))
	assert.Equal(t, "[earlier output dropped]\nsecond\nthird\n", b.String(), "the cut line is dropped")
	b.Write([]byte(strings.Repeat("x", 40)))
	assert.LessOrEqual(t, len(b.buf), 16)
}

func TestParseListing(t *testing.T) {
	t.Parallel()
	const out = `;
; Archive created at 2026-01-02 03:04:05 UTC
;     dbname: shop
;     TOC Entries: 9
;     Compression: -1
;     Dump Version: 1.14-0
;     Format: CUSTOM
;     Dumped from database version: 15.18 (Debian 15.18-0+deb12u1)
;     Dumped by pg_dump version: 15.18 (Debian 15.18-0+deb12u1)
;
;
; Selected TOC Entries:
;
6; 2615 16385 SCHEMA - Odd Schema postgres
215; 1259 16386 TABLE Odd Schema Mixed "Case" ü postgres
3323; 0 16386 TABLE DATA Odd Schema Mixed "Case" ü postgres
`
	l, err := parseListing(strings.NewReader(out))
	require.NoError(t, err)
	assert.Equal(t, "CUSTOM", l.Format)
	assert.Equal(t, "shop", l.Database)
	assert.Equal(t, "1.14-0", l.ArchiveVersion)
	require.Len(t, l.Entries, 3)
	assert.Equal(t, Entry{ID: 215, CatalogOID: 1259, OID: 16386, Text: `TABLE Odd Schema Mixed "Case" ü postgres`}, l.Entries[1])
	e, ok := l.Find("TABLE DATA", "Odd Schema", `Mixed "Case" ü`)
	assert.True(t, ok)
	assert.Equal(t, 3323, e.ID)
	_, ok = l.Find("TABLE", "Odd", `Schema Mixed "Case" ü`)
	assert.True(t, ok, "the listing itself cannot tell these apart: Is matches the text")
	_, ok = l.Find("TABLE", "public", "other")
	assert.False(t, ok)

	_, err = parseListing(strings.NewReader("not a listing line\n"))
	assert.Error(t, err)
}

func TestExitErrorNamesTheFirstError(t *testing.T) {
	t.Parallel()
	e := &ExitError{Args: []string{"/usr/bin/pg_restore", "--list"}, ExitCode: 1, Stderr: "pg_restore: warning: x\n" +
		"pg_restore: error: could not execute query: ERROR:  relation \"a\" already exists\nCommand was: CREATE TABLE a ();\n"}
	assert.Equal(t, `pgdump: /usr/bin/pg_restore: exit status 1: pg_restore: error: could not execute query: ERROR:  relation "a" already exists (more in ExitError.Stderr)`, e.Error())
	e = &ExitError{Args: []string{"pg_dump"}, ExitCode: -1}
	assert.Equal(t, "pgdump: pg_dump: killed by a signal: no error output", e.Error())
}

// TestEnvironCarriesConnAlone checks that the program's connection
// variables are Conn's: every setting it holds, none of this process's.
func TestEnvironCarriesConnAlone(t *testing.T) {
	t.Setenv("PGCHANNELBINDING", "disable")
	t.Setenv("PGSERVICE", "elsewhere")
	t.Setenv("PGTARGETSESSIONATTRS", "standby")
	c := Conn{Host: "h", Database: "db", SSLMode: "require", ChannelBinding: "require", TargetSessionAttrs: "read-write", ConnectTimeout: "7"}
	env := strings.Join(c.environ(""), "\n") + "\n"
	for _, want := range []string{"PGHOST=h", "PGDATABASE=db", "PGSSLMODE=require", "PGCHANNELBINDING=require",
		"PGTARGETSESSIONATTRS=read-write", "PGCONNECT_TIMEOUT=7", "PGPASSFILE=" + os.DevNull} {
		assert.Contains(t, env, want+"\n")
	}
	for _, unwanted := range []string{"PGCHANNELBINDING=disable", "PGSERVICE=", "PGTARGETSESSIONATTRS=standby", "PGGSSENCMODE="} {
		assert.NotContains(t, env, unwanted)
	}
}
