package dsn

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestSearchPathsReadsOptionsAsTheServerDoes: every way the server's
// getopt reads a search_path from the options parameter is seen, and
// nothing else is taken for one.
func TestSearchPathsReadsOptionsAsTheServerDoes(t *testing.T) {
	for _, c := range []struct {
		params map[string]string
		want   []string
	}{
		{map[string]string{}, nil},
		{map[string]string{"search_path": "app"}, []string{"app"}},
		{map[string]string{"options": "-c search_path=a,b"}, []string{"a,b"}},
		{map[string]string{"options": "-csearch_path=a -c statement_timeout=0"}, []string{"a"}},
		{map[string]string{"options": "--search_path=a"}, []string{"a"}},
		{map[string]string{"options": "--search-path=a"}, []string{"a"}},
		{map[string]string{"options": "-c SEARCH_PATH=a"}, []string{"a"}},
		{map[string]string{"options": `-c search_path=a,\ pg_catalog`}, []string{"a, pg_catalog"}},
		{map[string]string{"options": "-c application_name=search_path=x"}, nil},
		{map[string]string{"options": "-c search_path=a", "search_path": "b"}, []string{"a", "b"}},
		// Grouped flags: -n and -T take no argument, -c the rest.
		{map[string]string{"options": "-nc search_path=a"}, []string{"a"}},
		{map[string]string{"options": "-Tcsearch_path=a"}, []string{"a"}},
		{map[string]string{"options": "-E-search_path=a"}, []string{"a"}},
		// -C takes the next word, a -c included.
		{map[string]string{"options": "-C -c -c search_path=a"}, []string{"a"}},
		{map[string]string{"options": "-C -c search_path=a"}, nil},
		// Only ASCII whitespace separates words.
		{map[string]string{"options": "-capplication_name=x\u00a0-c -csearch_path=a"}, []string{"a"}},
		{map[string]string{"options": "-capplication_name=x\t-csearch_path=a"}, []string{"a"}},
		// getopt stops at the first word that is not a flag, or at --.
		{map[string]string{"options": "db -c search_path=a"}, nil},
		{map[string]string{"options": "-- -c search_path=a"}, nil},
	} {
		assert.Equal(t, c.want, SearchPaths(c.params), "%q", c.params)
	}
}

// TestCatalogFirst: pg_catalog comes first, or is not named; any name
// before it, of a schema that exists or not, fails.
func TestCatalogFirst(t *testing.T) {
	for path, want := range map[string]bool{
		"":                             true,
		"app":                          true,
		`"$user", public`:              true,
		"pg_catalog, pg_temp":          true,
		" PG_Catalog ,app":             true,
		`"pg_catalog", app`:            true,
		"\tpg_catalog\n,\fapp":         true,
		`"PG_CATALOG", app`:            true, // another schema: pg_catalog is searched first
		"app, pg_catalog":              false,
		"app,PG_CATALOG":               false,
		`"$user", pg_catalog`:          false,
		"pg_temp, pg_catalog":          false,
		`"a,b", pg_catalog`:            false,
		`"a""b", pg_catalog`:           false,
		`"pg_""catalog", pg_catalog`:   false,
		"app, \"pg_catalog\", x":       false,
		"\vpg_catalog, pg_catalog":     false, // a name to an older lexer
		"pg_catalog,\vapp":             false,
		"\u00a0pg_catalog, pg_catalog": false, // U+00A0 is part of the first name
	} {
		assert.Equal(t, want, CatalogFirst(path), "%q", path)
	}
}
