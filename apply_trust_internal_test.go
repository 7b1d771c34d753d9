package siphon

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/siphondb/siphon/canonical"
)

// TestRoleDependent checks which statements name the running role where
// a role is expected, and which only use it as a value.
func TestRoleDependent(t *testing.T) {
	t.Parallel()
	for stmt, want := range map[string]bool{
		"DROP OWNED BY CURRENT_USER":                                              true,
		"REASSIGN OWNED BY alice TO current_user":                                 true,
		"ALTER TABLE t OWNER TO current_role":                                     true,
		"CREATE SCHEMA s AUTHORIZATION SESSION_USER":                              true,
		"CREATE POLICY p ON t TO alice,current_user USING (true)":                 true,
		"CREATE USER MAPPING FOR CURRENT_USER SERVER s":                           true,
		"GRANT SELECT ON t TO alice GRANTED BY current_user":                      true,
		"ALTER DEFAULT PRIVILEGES FOR ROLE current_user GRANT ALL ON TABLES TO b": true,
		"CREATE TABLE t (who text DEFAULT current_user)":                          false,
		"CREATE TABLE t AS SELECT current_user AS who":                            false,
		"CREATE VIEW v AS SELECT * FROM t WHERE owner = session_user":             false,
		"ALTER TABLE t ADD COLUMN current_user_id int":                            false,
		"GRANT SELECT ON t TO alice":                                              true, // what it grants is the running role's
	} {
		assert.Equal(t, want, roleDependent(stmt), stmt)
	}
}

// TestCheckTrusted checks the trust rule on records alone: who is trusted,
// and what the refusal says.
func TestCheckTrusted(t *testing.T) {
	t.Parallel()
	c := &Conn{opts: options{trustedSchemaRoles: []string{"app"}}}
	d := func(session, role, installer string, super bool, tag, stmt string) *canonical.DDL {
		return &canonical.DDL{Tag: tag, Statement: stmt, Role: role, SessionRole: session, Installer: installer, Superuser: super}
	}
	for _, ok := range []*canonical.DDL{
		d("dba", "dba", "other", true, "CREATE TABLE", "CREATE TABLE x ()"),
		d("installer", "owner", "installer", false, "CREATE TABLE", "CREATE TABLE x ()"),
		d("app", "app", "", false, "ALTER TABLE", "ALTER TABLE x ADD COLUMN y int"),
		{Tag: "CREATE TABLE", Statement: "CREATE TABLE x ()", Role: "app"}, // written before session_role was
	} {
		assert.NoError(t, c.checkTrusted(0x10, ok), "%+v", ok)
	}
	err := c.checkTrusted(0x10, d("mallory", "app", "", false, "CREATE TABLE", "CREATE TABLE x ()"))
	var ute *UntrustedSchemaChangeError
	require.True(t, errors.As(err, &ute))
	assert.Equal(t, "mallory", ute.SessionRole, "SET ROLE app does not make mallory trusted")
	assert.Contains(t, err.Error(), `source role "mallory" (as role "app")`)
	assert.Contains(t, err.Error(), `WithTrustedSchemaRoles("mallory")`)
	assert.Contains(t, err.Error(), "SkipSchemaChanges: []canonical.Position{0/10}")

	err = c.checkTrusted(0x10, d("", "", "", false, "CREATE TABLE", "CREATE TABLE x ()"))
	require.True(t, errors.As(err, &ute))
	assert.Contains(t, ute.Reason, "does not say which role")

	secret := d("dba", "dba", "", true, "CREATE USER MAPPING", "CREATE USER MAPPING FOR app SERVER s OPTIONS (password 'hunter2')")
	err = c.checkTrusted(0x10, secret)
	require.True(t, errors.As(err, &ute))
	assert.Contains(t, err.Error(), "WithRoleDependentSchemaChanges()")
	assert.NotContains(t, err.Error(), "hunter2")
	assert.Empty(t, ute.Statement)

	opted := &Conn{opts: options{roleDependentSchemaChanges: true}}
	assert.NoError(t, opted.checkTrusted(0x10, secret))
	assert.Error(t, opted.checkTrusted(0x10, d("mallory", "mallory", "", false, "GRANT", "GRANT ALL ON t TO mallory")),
		"the option does not trust a role")
}
