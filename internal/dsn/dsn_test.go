package dsn

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestProblemNamesThePartAndNoSecret(t *testing.T) {
	for dsn, want := range map[string]string{
		"":                                        "it is empty",
		"garbage":                                 "word 1 is not keyword=value",
		"host=h s3cretPW port=5432":               "word 2 is not keyword=value",
		"host=h password=s3cretPW port=99999":     `the port "99999" is not a number from 1 to 65535`,
		"postgress://u:s3cretPW@h:5432/db":        `the URL scheme is "postgress": write postgres:// or postgresql://`,
		"postgres://u:s3cretPW@h:99999/db":        `the port "99999" is not a number from 1 to 65535`,
		"postgres://u:s3cretPW@h:notaport/db":     `the URL does not parse: invalid port ":notaport" after host`,
		"postgres://u:s3cretPW@[::1/db":           "the URL does not parse: missing ']' in host",
		"postgresql://u:s3cretPW@h1:5432,h2:0/db": `the port "0" is not a number from 1 to 65535`,
		"postgres://u:s3cretPW@h:5432/db?x=%zz":   "the URL does not parse as a PostgreSQL URL",
	} {
		got := Problem(dsn)
		assert.Contains(t, got, want, dsn)
		assert.NotContains(t, got, "s3cretPW", dsn)
	}
}
