package siphon

import (
	"context"
	"errors"
	"slices"

	"github.com/siphondb/siphon/canonical"
	"github.com/siphondb/siphon/internal/sqltext"
)

// Who a target trusts with schema changes (see SECURITY.md). A schema change is
// code the target runs, so it runs only when the source role that ran it
// is trusted, and as that role:
//   - trusted are the source's superusers (DDL.Superuser), the role that
//     installed the capture (DDL.Installer) and the roles the Conn names
//     with WithTrustedSchemaRoles; trust is decided on the role that logged
//     in (DDL.SessionRole), which SET ROLE cannot change;
//   - a statement whose meaning depends on who runs it (GRANT, REVOKE,
//     ALTER DEFAULT PRIVILEGES, DROP/REASSIGN OWNED, a CURRENT_USER role,
//     user mappings, servers...) runs only WithRoleDependentSchemaChanges;
//   - the statement runs under the source role's identity (DDL.Role,
//     SET LOCAL ROLE) where that role exists on the target and the applying
//     role may take it, as PostgreSQL 16's run_as_owner = false does for
//     apply: it can do there no more than the role could on the source.
//
// Anything else stops the apply with an *UntrustedSchemaChangeError:
// nothing of the source transaction is applied, nothing is skipped
// silently.

// roleDependentTags are the command tags of statements whose meaning
// depends on who runs them: what they grant, drop or connect with is the
// running role's.
var roleDependentTags = []string{
	"GRANT", "REVOKE", "ALTER DEFAULT PRIVILEGES", "DROP OWNED", "REASSIGN OWNED",
	"CREATE USER MAPPING", "ALTER USER MAPPING", "DROP USER MAPPING",
	"CREATE SERVER", "ALTER SERVER", "DROP SERVER",
	"CREATE FOREIGN DATA WRAPPER", "ALTER FOREIGN DATA WRAPPER", "DROP FOREIGN DATA WRAPPER",
	"IMPORT FOREIGN SCHEMA", "SECURITY LABEL",
}

// sessionRole is the source role whose trust decides d: its SessionRole,
// or, in a record written before siphon recorded it, its Role (which was
// session_user then).
func sessionRole(d *canonical.DDL) string {
	if d.SessionRole != "" {
		return d.SessionRole
	}
	return d.Role
}

// checkTrusted returns an *UntrustedSchemaChangeError when c does not
// apply d, of the source transaction committed at pos.
func (c *Conn) checkTrusted(pos canonical.Position, d *canonical.DDL) error {
	who := sessionRole(d)
	refusal := &UntrustedSchemaChangeError{Position: pos, Role: d.Role, SessionRole: who, Tag: d.Tag, Statement: errorStatement(d)}
	switch {
	case d.Superuser, who != "" && who == d.Installer, who != "" && slices.Contains(c.opts.trustedSchemaRoles, who):
	case who == "" && d.Problem != "":
		return nil // it runs nothing: its problem stops the apply
	case who == "":
		refusal.Reason = "the record does not say which role made it"
		return refusal
	default:
		refusal.Reason = "the role is not a superuser of the source nor the role that installed the capture, and is not named by WithTrustedSchemaRoles"
		return refusal
	}
	if !c.opts.roleDependentSchemaChanges && (slices.Contains(roleDependentTags, d.Tag) || roleDependent(d.Statement)) {
		refusal.Reason = "the statement's meaning depends on who runs it (it grants, revokes, drops or connects as the running role, or names CURRENT_USER, SESSION_USER or CURRENT_ROLE), " +
			"and the target runs it as another role than the source did; apply such statements with WithRoleDependentSchemaChanges"
		refusal.roleDependent = true
		return refusal
	}
	return nil
}

// errorStatement is d's statement as an error may show it: shortened, and
// left out when it may carry a secret.
func errorStatement(d *canonical.DDL) string {
	stmts, err := sqltext.Statements(d.Statement, true)
	if err != nil {
		return "" // unreadable: it cannot be checked for secrets
	}
	for _, st := range stmts {
		if st.Secret {
			return ""
		}
	}
	return shortStatement(d.Statement)
}

// roleDependent reports whether stmt's meaning depends on who runs it, as
// PostgreSQL's own parser reads it (sqltext.Statement.RoleDependent: a
// CURRENT_USER, SESSION_USER or CURRENT_ROLE role specification, grants,
// owned objects, user mappings...). A statement the parser cannot read is
// taken to depend on it.
func roleDependent(stmt string) bool {
	stmts, err := sqltext.Statements(stmt, true)
	if err != nil {
		return true
	}
	return slices.ContainsFunc(stmts, func(st sqltext.Statement) bool { return st.RoleDependent })
}

// identitySQL reads, for the source role $1, the session's role setting
// (to put back after the statement) and whether the session may take the
// role: it exists on the target and session_user (whose membership SET
// ROLE checks) is a superuser or may set it (MEMBER before PostgreSQL 16,
// the SET option since).
const identitySQL = `SELECT pg_catalog.current_setting('role'), coalesce((
  SELECT (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = session_user)
      OR CASE WHEN pg_catalog.current_setting('server_version_num')::int >= 160000
              THEN pg_catalog.pg_has_role(session_user, r.oid, 'SET')
              ELSE pg_catalog.pg_has_role(session_user, r.oid, 'MEMBER') END
  FROM pg_catalog.pg_roles r WHERE r.rolname = $1), false)`

// setRoleSQL sets the role for the rest of the transaction (SET LOCAL
// ROLE), the role's name bound as a parameter.
const setRoleSQL = "SELECT pg_catalog.set_config('role', $1, true)"

// ddlRole is how a schema change takes its source role's identity.
type ddlRole struct {
	role string // the role to set; "" to run as the applying role
	back string // the role setting to put back after the statement
}

// errRoleNotTaken is readIdentity's refusal: d would run as the applying
// role, which may hold more than the source role did.
var errRoleNotTaken = errors.New("the role it ran as on the source does not exist on the target, or the applying role may not SET ROLE to it: " +
	"as the applying role the statement could grant more than the source role had (its objects, SECURITY DEFINER functions included, would be the applying role's); " +
	"create the role on the target and let the applying role take it (GRANT it to the applying role)")

// readIdentity finds out, on q, whether d can run as its source role. A
// statement that cannot runs as the applying role only when it ran as a
// superuser on the source (its session's role, which SET ROLE left as it
// was), which no applying role exceeds; otherwise it is refused with
// errRoleNotTaken.
func (c *Conn) readIdentity(ctx context.Context, q querier, d *canonical.DDL) (ddlRole, error) {
	var id ddlRole
	var settable bool
	if d.Role != "" {
		if err := q.QueryRow(ctx, identitySQL, d.Role).Scan(&id.back, &settable); err != nil {
			return id, err
		}
	}
	switch {
	case settable:
		id.role = d.Role
		return id, nil
	case d.Superuser && (d.Role == "" || d.Role == sessionRole(d)):
		c.noteIdentity(d.Role, "the source superuser's role does not exist on the target, or the applying role may not SET ROLE to it")
		return id, nil
	}
	return id, errRoleNotTaken
}

// noteIdentity logs, once per source role, that its schema changes run as
// the applying role.
func (c *Conn) noteIdentity(role, why string) {
	if _, seen := c.identityNotes.LoadOrStore(role, true); !seen {
		c.log.Info("schema changes of this source role run as the applying role on the target", "source_role", role, "why", why)
	}
}

// ddlSteps are the statements that run d's statement under path and id in
// an open (or pipelined implicit) transaction, putting the session's
// role and search_path back after it, so that what the apply runs next
// (row changes, the applied Position) runs as the applying role. Only the
// statement itself runs under the source's search_path, which may name
// schemas of roles the applying role must not run the code of: the role
// is set before it and put back after the search_path is.
func ddlSteps(d *canonical.DDL, id ddlRole) []ddlStep {
	var steps []ddlStep
	if id.role != "" {
		steps = append(steps, ddlStep{setRoleSQL, [][]byte{[]byte(id.role)}})
	}
	steps = append(steps, ddlStep{setSearchPathSQL, [][]byte{[]byte(d.SearchPath)}}, ddlStep{d.Statement, nil},
		ddlStep{"RESET search_path", nil})
	if id.role != "" {
		steps = append(steps, ddlStep{setRoleSQL, [][]byte{[]byte(id.back)}})
	}
	return steps
}

// ddlStep is one statement of ddlSteps.
type ddlStep struct {
	sql    string
	params [][]byte
}
