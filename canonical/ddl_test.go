package canonical

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestDDLTrustFieldsRoundTrip checks that the fields the target decides
// trust on (SessionRole, Superuser, Installer) survive a stream, and that
// a ddl record written before they existed decodes with them zero.
func TestDDLTrustFieldsRoundTrip(t *testing.T) {
	t.Parallel()
	ddls := []*DDL{
		{Tag: "CREATE FUNCTION", Statement: "CREATE FUNCTION mal.f() RETURNS int LANGUAGE sql AS 'SELECT 1'",
			SearchPath: `"mal", "public"`, Role: "owner_role", SessionRole: "mallory", Installer: "postgres"},
		{Tag: "GRANT", Statement: "GRANT SELECT ON t TO app", SearchPath: "", Role: "dba", SessionRole: "dba", Superuser: true, Installer: "dba"},
		{Tag: "CREATE TABLE", Statement: "CREATE TABLE x ()", SearchPath: `"public"`},
		// A change whose statement was not carried (it may hold a secret)
		// travels with its problem alone.
		{Tag: "CREATE USER MAPPING", SearchPath: `"public"`, Role: "dba", SessionRole: "dba", Superuser: true,
			Problem: "the CREATE USER MAPPING may carry a secret"},
	}
	data := encode(t, testHeader, func(e *Encoder) {
		require.NoError(t, e.WriteChange(&Change{Op: OpBegin, XID: 7, Position: 0x10, CommitTime: testTime}))
		for _, d := range ddls {
			require.NoError(t, e.WriteChange(&Change{Op: OpDDL, XID: 7, Position: 0x10, DDL: d}))
		}
		require.NoError(t, e.WriteChange(&Change{Op: OpCommit, XID: 7, Position: 0x20, CommitTime: testTime}))
		require.NoError(t, e.WriteEnd(0x20))
	})
	assert.Equal(t, 2, bytes.Count(data, []byte(`"superuser":true`)), "superuser is written only when true")
	assert.Equal(t, 0, bytes.Count(data, []byte(`"superuser":false`)))
	_, recs, err := decodeAll(data)
	require.NoError(t, err)
	require.Len(t, recs, len(ddls)+3)
	for i, want := range ddls {
		assert.Equal(t, want, recs[1+i].Change.DDL, "ddl %d", i)
	}

	old := lines(changesHeaderLine, beginLine,
		`{"t":"ddl","xid":7,"position":"0/10","tag":"CREATE TABLE","statement":"CREATE TABLE x ()","search_path":"public","role":"app"}`,
		commitLine, `{"t":"end","position":"0/20","records":3}`)
	_, recs, err = decodeAll(old)
	require.NoError(t, err)
	require.Len(t, recs, 4)
	assert.Equal(t, &DDL{Tag: "CREATE TABLE", Statement: "CREATE TABLE x ()", SearchPath: "public", Role: "app"}, recs[1].Change.DDL,
		"a record without the trust fields decodes with them zero: an untrusted change")
}
