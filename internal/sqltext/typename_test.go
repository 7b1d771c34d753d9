package sqltext

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestIsTypeName(t *testing.T) {
	t.Parallel()
	for _, s := range []string{"integer", "text", "character varying(10)", `public."My Type"[]`, "timestamp(3) with time zone",
		"interval day to second(3)", "bit varying(5)", "double precision", "numeric(10,2)", `"char"`, "integer[][]", "mal.text"} {
		assert.True(t, IsTypeName(s), s)
	}
	for _, s := range []string{"", "int; COPY x TO PROGRAM 'id'; --", "int;", "int -- x", "int /* x */", "int AS x", "int x",
		`int COLLATE "C"`, "int FROM pg_class", "int WHERE true", "int UNION SELECT 1", "int::text", "int + 1", "int IS NULL",
		"varchar(x)", "int INTO t", "int, 1", "int)", "'x'", "int[1:2]"} {
		assert.False(t, IsTypeName(s), s)
	}
}
