package dsn

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

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
	} {
		assert.Equal(t, c.want, SearchPaths(c.params), "%v", c.params)
	}
}

func TestCatalogFirst(t *testing.T) {
	for path, want := range map[string]bool{
		"":                            true,
		"app":                         true,
		`"$user", public`:             true,
		"pg_catalog, app":             true,
		" PG_Catalog ,app":            true,
		`"pg_catalog", app`:           true,
		"app, pg_catalog":             false,
		"app,PG_CATALOG":              false,
		`"a,b", pg_catalog`:           false,
		`"pg_""catalog", pg_catalog`:  false,
		`"PG_CATALOG", app`:           true, // another schema: pg_catalog is searched first
		"pg_temp, pg_catalog":         false,
		"app, \"pg_catalog\", public": false,
	} {
		assert.Equal(t, want, CatalogFirst(path), "%q", path)
	}
}
