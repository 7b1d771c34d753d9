package sqltext

import (
	"slices"

	pg "github.com/pganalyze/pg_query_go/v6"
	"google.golang.org/protobuf/proto"
)

// classify returns what siphon needs to know of the statement n of a raw
// parse tree: all of a Statement but its text.
func classify(n *pg.Node) Statement {
	st := Statement{Tag: commandTag(n)}
	st.FiresDDLEvent, st.Uncertain = firesDDLEvent(n)
	if st.Tag == unknownTag {
		st.Uncertain = true
	}
	_, st.TransactionControl = n.GetNode().(*pg.Node_TransactionStmt)
	st.RoleDependent = roleDependent(n)
	st.Secret = secret(n)
	return st
}

// ddlEventNodes are the statements ProcessUtilitySlow runs, for which the
// server fires ddl_command_end (when their object type allows it: see
// sharedObjectTypes).
var ddlEventNodes = []string{
	"CreateSchemaStmt", "CreateStmt", "CreateForeignTableStmt", "AlterTableStmt", "AlterDomainStmt", "DefineStmt",
	"IndexStmt", "AlterExtensionContentsStmt", "CreateFdwStmt", "AlterFdwStmt", "CreateForeignServerStmt",
	"AlterForeignServerStmt", "CreateUserMappingStmt", "AlterUserMappingStmt", "DropUserMappingStmt",
	"ImportForeignSchemaStmt", "CompositeTypeStmt", "CreateEnumStmt", "CreateRangeStmt", "AlterEnumStmt", "ViewStmt",
	"CreateFunctionStmt", "AlterFunctionStmt", "RuleStmt", "CreateSeqStmt", "AlterSeqStmt", "CreateTableAsStmt",
	"RefreshMatViewStmt", "CreateTrigStmt", "CreatePLangStmt", "CreateDomainStmt", "CreateConversionStmt",
	"CreateCastStmt", "CreateOpClassStmt", "CreateOpFamilyStmt", "CreateTransformStmt", "AlterOpFamilyStmt",
	"AlterTSDictionaryStmt", "AlterTSConfigurationStmt", "AlterTableMoveAllStmt", "DropStmt", "RenameStmt",
	"AlterObjectDependsStmt", "AlterObjectSchemaStmt", "AlterOwnerStmt", "CommentStmt", "GrantStmt", "DropOwnedStmt",
	"AlterDefaultPrivilegesStmt", "CreatePolicyStmt", "AlterPolicyStmt", "SecLabelStmt", "CreateAmStmt",
	"CreatePublicationStmt", "AlterPublicationStmt", "CreateSubscriptionStmt", "AlterSubscriptionStmt",
	"DropSubscriptionStmt", "CreateStatsStmt", "AlterStatsStmt", "AlterCollationStmt", "AlterOperatorStmt",
	"AlterTypeStmt",
}

// noDDLEventNodes are the statements standard_ProcessUtility runs itself
// (or the executor runs), for which the server fires no ddl_command_end:
// plain SQL, transaction control, session commands, commands on shared
// objects and on event triggers.
var noDDLEventNodes = []string{
	"InsertStmt", "DeleteStmt", "UpdateStmt", "MergeStmt", "TransactionStmt", "DeclareCursorStmt",
	"ClosePortalStmt", "FetchStmt", "DoStmt", "CallStmt", "CreateTableSpaceStmt", "DropTableSpaceStmt",
	"AlterTableSpaceOptionsStmt", "TruncateStmt", "CopyStmt", "PrepareStmt", "ExecuteStmt", "DeallocateStmt",
	"GrantRoleStmt", "CreatedbStmt", "AlterDatabaseStmt", "AlterDatabaseRefreshCollStmt", "AlterDatabaseSetStmt",
	"DropdbStmt", "NotifyStmt", "ListenStmt", "UnlistenStmt", "LoadStmt", "ClusterStmt", "VacuumStmt",
	"AlterSystemStmt", "VariableSetStmt", "VariableShowStmt", "DiscardStmt", "CreateEventTrigStmt",
	"AlterEventTrigStmt", "CreateRoleStmt", "AlterRoleStmt", "AlterRoleSetStmt", "DropRoleStmt", "ReassignOwnedStmt",
	"LockStmt", "ConstraintsSetStmt", "CheckPointStmt",
}

// sharedObjectTypes are the object types EventTriggerSupportsObjectType
// refuses: GRANT, DROP, COMMENT, SECURITY LABEL, RENAME, ALTER ... OWNER
// and SET SCHEMA on them fire no event.
var sharedObjectTypes = []pg.ObjectType{pg.ObjectType_OBJECT_DATABASE, pg.ObjectType_OBJECT_TABLESPACE,
	pg.ObjectType_OBJECT_ROLE, pg.ObjectType_OBJECT_PARAMETER_ACL, pg.ObjectType_OBJECT_EVENT_TRIGGER}

// firesDDLEvent reports whether the server fires ddl_command_end for the
// statement n, and whether that is uncertain.
func firesDDLEvent(n *pg.Node) (fires, uncertain bool) {
	name := nodeName(n)
	switch s := n.GetNode().(type) {
	case *pg.Node_SelectStmt:
		// SELECT INTO runs as CREATE TABLE AS.
		return leftmost(s.SelectStmt).GetIntoClause() != nil, false
	case *pg.Node_CreateExtensionStmt, *pg.Node_AlterExtensionStmt:
		// The extension's script runs commands of its own, each firing too.
		return true, true
	case *pg.Node_ReindexStmt:
		// PostgreSQL 17 fires it for REINDEX; earlier releases do not.
		return true, true
	case *pg.Node_ExplainStmt:
		// EXPLAIN ANALYZE CREATE TABLE AS creates the table with no event.
		_, ctas := s.ExplainStmt.GetQuery().GetNode().(*pg.Node_CreateTableAsStmt)
		return false, ctas
	}
	if slices.Contains(noDDLEventNodes, name) {
		return false, false
	}
	if !slices.Contains(ddlEventNodes, name) {
		return false, true
	}
	if t, ok := objectType(n); ok && slices.Contains(sharedObjectTypes, t) {
		return false, false
	}
	return true, false
}

// objectType returns the type of object the statement n acts on, for the
// statements whose event depends on it.
func objectType(n *pg.Node) (pg.ObjectType, bool) {
	switch s := n.GetNode().(type) {
	case *pg.Node_GrantStmt:
		return s.GrantStmt.GetObjtype(), true
	case *pg.Node_DropStmt:
		return s.DropStmt.GetRemoveType(), true
	case *pg.Node_RenameStmt:
		return s.RenameStmt.GetRenameType(), true
	case *pg.Node_AlterObjectDependsStmt:
		return s.AlterObjectDependsStmt.GetObjectType(), true
	case *pg.Node_AlterObjectSchemaStmt:
		return s.AlterObjectSchemaStmt.GetObjectType(), true
	case *pg.Node_AlterOwnerStmt:
		return s.AlterOwnerStmt.GetObjectType(), true
	case *pg.Node_CommentStmt:
		return s.CommentStmt.GetObjtype(), true
	case *pg.Node_SecLabelStmt:
		return s.SecLabelStmt.GetObjtype(), true
	}
	return 0, false
}

// roleDependentNodes are the statements whose meaning depends on the role
// that runs them, whatever they say.
var roleDependentNodes = []string{
	"GrantStmt", "GrantRoleStmt", "AlterDefaultPrivilegesStmt", "DropOwnedStmt", "ReassignOwnedStmt",
	"CreateUserMappingStmt", "AlterUserMappingStmt", "DropUserMappingStmt", "CreateForeignServerStmt",
	"AlterForeignServerStmt", "CreateFdwStmt", "AlterFdwStmt", "SecLabelStmt",
}

// roleDependent reports whether the meaning of the statement n depends on
// the role that runs it.
func roleDependent(n *pg.Node) bool {
	if slices.Contains(roleDependentNodes, nodeName(n)) {
		return true
	}
	if d, ok := n.GetNode().(*pg.Node_DropStmt); ok && d.DropStmt.GetRemoveType() == pg.ObjectType_OBJECT_FOREIGN_SERVER {
		return true
	}
	found := false
	walk(n, func(m proto.Message) bool {
		if r, ok := m.(*pg.RoleSpec); ok {
			switch r.GetRoletype() {
			case pg.RoleSpecType_ROLESPEC_CURRENT_USER, pg.RoleSpecType_ROLESPEC_SESSION_USER, pg.RoleSpecType_ROLESPEC_CURRENT_ROLE:
				found = true
			}
		}
		return !found
	})
	return found
}

// secret reports whether the statement n may carry a secret: a password,
// a connection string, or the options of a user mapping, a server or a
// foreign data wrapper.
func secret(n *pg.Node) bool {
	switch s := n.GetNode().(type) {
	case *pg.Node_CreateUserMappingStmt, *pg.Node_AlterUserMappingStmt,
		*pg.Node_CreateSubscriptionStmt, *pg.Node_AlterSubscriptionStmt:
		return true
	case *pg.Node_CreateForeignServerStmt:
		return len(s.CreateForeignServerStmt.GetOptions()) > 0
	case *pg.Node_AlterForeignServerStmt:
		return len(s.AlterForeignServerStmt.GetOptions()) > 0
	case *pg.Node_CreateFdwStmt:
		return len(s.CreateFdwStmt.GetOptions()) > 0
	case *pg.Node_AlterFdwStmt:
		return len(s.AlterFdwStmt.GetOptions()) > 0
	case *pg.Node_CreateRoleStmt:
		return hasPassword(s.CreateRoleStmt.GetOptions())
	case *pg.Node_AlterRoleStmt:
		return hasPassword(s.AlterRoleStmt.GetOptions())
	}
	return false
}

// hasPassword reports whether the role options give a password.
func hasPassword(options []*pg.Node) bool {
	for _, o := range options {
		if o.GetDefElem().GetDefname() == "password" {
			return true
		}
	}
	return false
}
