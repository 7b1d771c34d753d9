package sqltext

import (
	pg "github.com/pganalyze/pg_query_go/v6"
)

// unknownTag is the tag of a statement whose command PostgreSQL's
// CreateCommandTag would not name either.
const unknownTag = "???"

// commandTag returns the command tag PostgreSQL gives the statement n of
// a raw parse tree, as CreateCommandTag in src/backend/tcop/utility.c
// does, or unknownTag.
func commandTag(n *pg.Node) string {
	if tag, ok := fixedTags[nodeName(n)]; ok {
		return tag
	}
	switch s := n.GetNode().(type) {
	case *pg.Node_SelectStmt:
		if leftmost(s.SelectStmt).GetIntoClause() != nil {
			return "SELECT INTO"
		}
		return "SELECT"
	case *pg.Node_TransactionStmt:
		return transactionTags[s.TransactionStmt.GetKind()]
	case *pg.Node_ClosePortalStmt:
		if s.ClosePortalStmt.GetPortalname() == "" {
			return "CLOSE CURSOR ALL"
		}
		return "CLOSE CURSOR"
	case *pg.Node_FetchStmt:
		if s.FetchStmt.GetIsmove() {
			return "MOVE"
		}
		return "FETCH"
	case *pg.Node_DropStmt:
		return tagOr(dropTags[s.DropStmt.GetRemoveType()])
	case *pg.Node_RenameStmt:
		t := s.RenameStmt.GetRenameType()
		if t == pg.ObjectType_OBJECT_COLUMN {
			t = s.RenameStmt.GetRelationType()
		}
		return alterTag(t)
	case *pg.Node_AlterObjectDependsStmt:
		return alterTag(s.AlterObjectDependsStmt.GetObjectType())
	case *pg.Node_AlterObjectSchemaStmt:
		return alterTag(s.AlterObjectSchemaStmt.GetObjectType())
	case *pg.Node_AlterOwnerStmt:
		return alterTag(s.AlterOwnerStmt.GetObjectType())
	case *pg.Node_AlterTableMoveAllStmt:
		return alterTag(s.AlterTableMoveAllStmt.GetObjtype())
	case *pg.Node_AlterTableStmt:
		return alterTag(s.AlterTableStmt.GetObjtype())
	case *pg.Node_AlterFunctionStmt:
		return tagOr(map[pg.ObjectType]string{pg.ObjectType_OBJECT_FUNCTION: "ALTER FUNCTION",
			pg.ObjectType_OBJECT_PROCEDURE: "ALTER PROCEDURE", pg.ObjectType_OBJECT_ROUTINE: "ALTER ROUTINE"}[s.AlterFunctionStmt.GetObjtype()])
	case *pg.Node_GrantStmt:
		return grantTag(s.GrantStmt.GetIsGrant(), "GRANT", "REVOKE")
	case *pg.Node_GrantRoleStmt:
		return grantTag(s.GrantRoleStmt.GetIsGrant(), "GRANT ROLE", "REVOKE ROLE")
	case *pg.Node_DefineStmt:
		return tagOr(defineTags[s.DefineStmt.GetKind()])
	case *pg.Node_CreateFunctionStmt:
		if s.CreateFunctionStmt.GetIsProcedure() {
			return "CREATE PROCEDURE"
		}
		return "CREATE FUNCTION"
	case *pg.Node_CreateTableAsStmt:
		switch {
		case s.CreateTableAsStmt.GetObjtype() == pg.ObjectType_OBJECT_MATVIEW:
			return "CREATE MATERIALIZED VIEW"
		case s.CreateTableAsStmt.GetObjtype() != pg.ObjectType_OBJECT_TABLE:
			return unknownTag
		case s.CreateTableAsStmt.GetIsSelectInto():
			return "SELECT INTO"
		}
		return "CREATE TABLE AS"
	case *pg.Node_VacuumStmt:
		if s.VacuumStmt.GetIsVacuumcmd() {
			return "VACUUM"
		}
		return "ANALYZE"
	case *pg.Node_VariableSetStmt:
		switch s.VariableSetStmt.GetKind() {
		case pg.VariableSetKind_VAR_RESET, pg.VariableSetKind_VAR_RESET_ALL:
			return "RESET"
		}
		return "SET"
	case *pg.Node_DiscardStmt:
		return tagOr(map[pg.DiscardMode]string{pg.DiscardMode_DISCARD_ALL: "DISCARD ALL", pg.DiscardMode_DISCARD_PLANS: "DISCARD PLANS",
			pg.DiscardMode_DISCARD_TEMP: "DISCARD TEMP", pg.DiscardMode_DISCARD_SEQUENCES: "DISCARD SEQUENCES"}[s.DiscardStmt.GetTarget()])
	case *pg.Node_DeallocateStmt:
		if s.DeallocateStmt.GetIsall() {
			return "DEALLOCATE ALL"
		}
		return "DEALLOCATE"
	}
	return unknownTag
}

// leftmost returns the first SELECT of a set operation (where SELECT
// INTO puts its INTO clause), or s itself.
func leftmost(s *pg.SelectStmt) *pg.SelectStmt {
	for s.GetOp() != pg.SetOperation_SETOP_NONE && s.GetLarg() != nil {
		s = s.GetLarg()
	}
	return s
}

// tagOr returns tag, or unknownTag for an empty one.
func tagOr(tag string) string {
	if tag == "" {
		return unknownTag
	}
	return tag
}

// grantTag returns grant or revoke.
func grantTag(isGrant bool, grant, revoke string) string {
	if isGrant {
		return grant
	}
	return revoke
}

// alterTag returns the tag of ALTER on an object of type t, as
// AlterObjectTypeCommandTag does: ALTER TABLE on a view is ALTER VIEW.
func alterTag(t pg.ObjectType) string {
	return tagOr(alterTags[t])
}

// fixedTags are the tags of the statements whose tag is their node's alone.
var fixedTags = map[string]string{
	"InsertStmt": "INSERT", "DeleteStmt": "DELETE", "UpdateStmt": "UPDATE", "MergeStmt": "MERGE",
	"DeclareCursorStmt": "DECLARE CURSOR", "CreateDomainStmt": "CREATE DOMAIN", "CreateSchemaStmt": "CREATE SCHEMA",
	"CreateStmt": "CREATE TABLE", "CreateTableSpaceStmt": "CREATE TABLESPACE", "DropTableSpaceStmt": "DROP TABLESPACE",
	"AlterTableSpaceOptionsStmt": "ALTER TABLESPACE", "CreateExtensionStmt": "CREATE EXTENSION",
	"AlterExtensionStmt": "ALTER EXTENSION", "AlterExtensionContentsStmt": "ALTER EXTENSION",
	"CreateFdwStmt": "CREATE FOREIGN DATA WRAPPER", "AlterFdwStmt": "ALTER FOREIGN DATA WRAPPER",
	"CreateForeignServerStmt": "CREATE SERVER", "AlterForeignServerStmt": "ALTER SERVER",
	"CreateUserMappingStmt": "CREATE USER MAPPING", "AlterUserMappingStmt": "ALTER USER MAPPING",
	"DropUserMappingStmt": "DROP USER MAPPING", "CreateForeignTableStmt": "CREATE FOREIGN TABLE",
	"ImportForeignSchemaStmt": "IMPORT FOREIGN SCHEMA", "TruncateStmt": "TRUNCATE TABLE", "CommentStmt": "COMMENT",
	"SecLabelStmt": "SECURITY LABEL", "CopyStmt": "COPY", "AlterDomainStmt": "ALTER DOMAIN",
	"AlterDefaultPrivilegesStmt": "ALTER DEFAULT PRIVILEGES", "CompositeTypeStmt": "CREATE TYPE",
	"CreateEnumStmt": "CREATE TYPE", "CreateRangeStmt": "CREATE TYPE", "AlterEnumStmt": "ALTER TYPE",
	"ViewStmt": "CREATE VIEW", "IndexStmt": "CREATE INDEX", "RuleStmt": "CREATE RULE",
	"CreateSeqStmt": "CREATE SEQUENCE", "AlterSeqStmt": "ALTER SEQUENCE", "DoStmt": "DO",
	"CreatedbStmt": "CREATE DATABASE", "AlterDatabaseStmt": "ALTER DATABASE",
	"AlterDatabaseRefreshCollStmt": "ALTER DATABASE", "AlterDatabaseSetStmt": "ALTER DATABASE",
	"DropdbStmt": "DROP DATABASE", "NotifyStmt": "NOTIFY", "ListenStmt": "LISTEN", "UnlistenStmt": "UNLISTEN",
	"LoadStmt": "LOAD", "CallStmt": "CALL", "ClusterStmt": "CLUSTER", "ExplainStmt": "EXPLAIN",
	"RefreshMatViewStmt": "REFRESH MATERIALIZED VIEW", "AlterSystemStmt": "ALTER SYSTEM",
	"VariableShowStmt": "SHOW", "CreateTransformStmt": "CREATE TRANSFORM", "CreateTrigStmt": "CREATE TRIGGER",
	"CreateEventTrigStmt": "CREATE EVENT TRIGGER", "AlterEventTrigStmt": "ALTER EVENT TRIGGER",
	"CreatePLangStmt": "CREATE LANGUAGE", "CreateRoleStmt": "CREATE ROLE", "AlterRoleStmt": "ALTER ROLE",
	"AlterRoleSetStmt": "ALTER ROLE", "DropRoleStmt": "DROP ROLE", "DropOwnedStmt": "DROP OWNED",
	"ReassignOwnedStmt": "REASSIGN OWNED", "LockStmt": "LOCK TABLE", "ConstraintsSetStmt": "SET CONSTRAINTS",
	"CheckPointStmt": "CHECKPOINT", "ReindexStmt": "REINDEX", "CreateConversionStmt": "CREATE CONVERSION",
	"CreateCastStmt": "CREATE CAST", "CreateOpClassStmt": "CREATE OPERATOR CLASS",
	"CreateOpFamilyStmt": "CREATE OPERATOR FAMILY", "AlterOpFamilyStmt": "ALTER OPERATOR FAMILY",
	"AlterOperatorStmt": "ALTER OPERATOR", "AlterTypeStmt": "ALTER TYPE",
	"AlterTSDictionaryStmt": "ALTER TEXT SEARCH DICTIONARY", "AlterTSConfigurationStmt": "ALTER TEXT SEARCH CONFIGURATION",
	"CreatePolicyStmt": "CREATE POLICY", "AlterPolicyStmt": "ALTER POLICY", "CreateAmStmt": "CREATE ACCESS METHOD",
	"CreatePublicationStmt": "CREATE PUBLICATION", "AlterPublicationStmt": "ALTER PUBLICATION",
	"CreateSubscriptionStmt": "CREATE SUBSCRIPTION", "AlterSubscriptionStmt": "ALTER SUBSCRIPTION",
	"DropSubscriptionStmt": "DROP SUBSCRIPTION", "AlterCollationStmt": "ALTER COLLATION", "PrepareStmt": "PREPARE",
	"ExecuteStmt": "EXECUTE", "CreateStatsStmt": "CREATE STATISTICS", "AlterStatsStmt": "ALTER STATISTICS",
}

var transactionTags = map[pg.TransactionStmtKind]string{
	pg.TransactionStmtKind_TRANS_STMT_BEGIN: "BEGIN", pg.TransactionStmtKind_TRANS_STMT_START: "START TRANSACTION",
	pg.TransactionStmtKind_TRANS_STMT_COMMIT: "COMMIT", pg.TransactionStmtKind_TRANS_STMT_ROLLBACK: "ROLLBACK",
	pg.TransactionStmtKind_TRANS_STMT_SAVEPOINT: "SAVEPOINT", pg.TransactionStmtKind_TRANS_STMT_RELEASE: "RELEASE",
	pg.TransactionStmtKind_TRANS_STMT_ROLLBACK_TO: "ROLLBACK", pg.TransactionStmtKind_TRANS_STMT_PREPARE: "PREPARE TRANSACTION",
	pg.TransactionStmtKind_TRANS_STMT_COMMIT_PREPARED:   "COMMIT PREPARED",
	pg.TransactionStmtKind_TRANS_STMT_ROLLBACK_PREPARED: "ROLLBACK PREPARED",
}

var defineTags = map[pg.ObjectType]string{
	pg.ObjectType_OBJECT_AGGREGATE: "CREATE AGGREGATE", pg.ObjectType_OBJECT_OPERATOR: "CREATE OPERATOR",
	pg.ObjectType_OBJECT_TYPE: "CREATE TYPE", pg.ObjectType_OBJECT_TSPARSER: "CREATE TEXT SEARCH PARSER",
	pg.ObjectType_OBJECT_TSDICTIONARY: "CREATE TEXT SEARCH DICTIONARY", pg.ObjectType_OBJECT_TSTEMPLATE: "CREATE TEXT SEARCH TEMPLATE",
	pg.ObjectType_OBJECT_TSCONFIGURATION: "CREATE TEXT SEARCH CONFIGURATION", pg.ObjectType_OBJECT_COLLATION: "CREATE COLLATION",
	pg.ObjectType_OBJECT_ACCESS_METHOD: "CREATE ACCESS METHOD",
}

var dropTags = map[pg.ObjectType]string{
	pg.ObjectType_OBJECT_TABLE: "DROP TABLE", pg.ObjectType_OBJECT_SEQUENCE: "DROP SEQUENCE", pg.ObjectType_OBJECT_VIEW: "DROP VIEW",
	pg.ObjectType_OBJECT_MATVIEW: "DROP MATERIALIZED VIEW", pg.ObjectType_OBJECT_INDEX: "DROP INDEX", pg.ObjectType_OBJECT_TYPE: "DROP TYPE",
	pg.ObjectType_OBJECT_DOMAIN: "DROP DOMAIN", pg.ObjectType_OBJECT_COLLATION: "DROP COLLATION", pg.ObjectType_OBJECT_CONVERSION: "DROP CONVERSION",
	pg.ObjectType_OBJECT_SCHEMA: "DROP SCHEMA", pg.ObjectType_OBJECT_TSPARSER: "DROP TEXT SEARCH PARSER",
	pg.ObjectType_OBJECT_TSDICTIONARY: "DROP TEXT SEARCH DICTIONARY", pg.ObjectType_OBJECT_TSTEMPLATE: "DROP TEXT SEARCH TEMPLATE",
	pg.ObjectType_OBJECT_TSCONFIGURATION: "DROP TEXT SEARCH CONFIGURATION", pg.ObjectType_OBJECT_FOREIGN_TABLE: "DROP FOREIGN TABLE",
	pg.ObjectType_OBJECT_EXTENSION: "DROP EXTENSION", pg.ObjectType_OBJECT_FUNCTION: "DROP FUNCTION", pg.ObjectType_OBJECT_PROCEDURE: "DROP PROCEDURE",
	pg.ObjectType_OBJECT_ROUTINE: "DROP ROUTINE", pg.ObjectType_OBJECT_AGGREGATE: "DROP AGGREGATE", pg.ObjectType_OBJECT_OPERATOR: "DROP OPERATOR",
	pg.ObjectType_OBJECT_LANGUAGE: "DROP LANGUAGE", pg.ObjectType_OBJECT_CAST: "DROP CAST", pg.ObjectType_OBJECT_TRIGGER: "DROP TRIGGER",
	pg.ObjectType_OBJECT_EVENT_TRIGGER: "DROP EVENT TRIGGER", pg.ObjectType_OBJECT_RULE: "DROP RULE", pg.ObjectType_OBJECT_FDW: "DROP FOREIGN DATA WRAPPER",
	pg.ObjectType_OBJECT_FOREIGN_SERVER: "DROP SERVER", pg.ObjectType_OBJECT_OPCLASS: "DROP OPERATOR CLASS", pg.ObjectType_OBJECT_OPFAMILY: "DROP OPERATOR FAMILY",
	pg.ObjectType_OBJECT_POLICY: "DROP POLICY", pg.ObjectType_OBJECT_TRANSFORM: "DROP TRANSFORM", pg.ObjectType_OBJECT_ACCESS_METHOD: "DROP ACCESS METHOD",
	pg.ObjectType_OBJECT_PUBLICATION: "DROP PUBLICATION", pg.ObjectType_OBJECT_STATISTIC_EXT: "DROP STATISTICS",
}

var alterTags = map[pg.ObjectType]string{
	pg.ObjectType_OBJECT_AGGREGATE: "ALTER AGGREGATE", pg.ObjectType_OBJECT_ATTRIBUTE: "ALTER TYPE", pg.ObjectType_OBJECT_CAST: "ALTER CAST",
	pg.ObjectType_OBJECT_COLLATION: "ALTER COLLATION", pg.ObjectType_OBJECT_COLUMN: "ALTER TABLE", pg.ObjectType_OBJECT_CONVERSION: "ALTER CONVERSION",
	pg.ObjectType_OBJECT_DATABASE: "ALTER DATABASE", pg.ObjectType_OBJECT_DOMAIN: "ALTER DOMAIN", pg.ObjectType_OBJECT_DOMCONSTRAINT: "ALTER DOMAIN",
	pg.ObjectType_OBJECT_EXTENSION: "ALTER EXTENSION", pg.ObjectType_OBJECT_FDW: "ALTER FOREIGN DATA WRAPPER", pg.ObjectType_OBJECT_FOREIGN_SERVER: "ALTER SERVER",
	pg.ObjectType_OBJECT_FOREIGN_TABLE: "ALTER FOREIGN TABLE", pg.ObjectType_OBJECT_FUNCTION: "ALTER FUNCTION", pg.ObjectType_OBJECT_INDEX: "ALTER INDEX",
	pg.ObjectType_OBJECT_LANGUAGE: "ALTER LANGUAGE", pg.ObjectType_OBJECT_LARGEOBJECT: "ALTER LARGE OBJECT", pg.ObjectType_OBJECT_OPCLASS: "ALTER OPERATOR CLASS",
	pg.ObjectType_OBJECT_OPERATOR: "ALTER OPERATOR", pg.ObjectType_OBJECT_OPFAMILY: "ALTER OPERATOR FAMILY", pg.ObjectType_OBJECT_POLICY: "ALTER POLICY",
	pg.ObjectType_OBJECT_PROCEDURE: "ALTER PROCEDURE", pg.ObjectType_OBJECT_ROLE: "ALTER ROLE", pg.ObjectType_OBJECT_ROUTINE: "ALTER ROUTINE",
	pg.ObjectType_OBJECT_RULE: "ALTER RULE", pg.ObjectType_OBJECT_SCHEMA: "ALTER SCHEMA", pg.ObjectType_OBJECT_SEQUENCE: "ALTER SEQUENCE",
	pg.ObjectType_OBJECT_TABLE: "ALTER TABLE", pg.ObjectType_OBJECT_TABCONSTRAINT: "ALTER TABLE", pg.ObjectType_OBJECT_TABLESPACE: "ALTER TABLESPACE",
	pg.ObjectType_OBJECT_TRIGGER: "ALTER TRIGGER", pg.ObjectType_OBJECT_EVENT_TRIGGER: "ALTER EVENT TRIGGER",
	pg.ObjectType_OBJECT_TSCONFIGURATION: "ALTER TEXT SEARCH CONFIGURATION", pg.ObjectType_OBJECT_TSDICTIONARY: "ALTER TEXT SEARCH DICTIONARY",
	pg.ObjectType_OBJECT_TSPARSER: "ALTER TEXT SEARCH PARSER", pg.ObjectType_OBJECT_TSTEMPLATE: "ALTER TEXT SEARCH TEMPLATE", pg.ObjectType_OBJECT_TYPE: "ALTER TYPE",
	pg.ObjectType_OBJECT_VIEW: "ALTER VIEW", pg.ObjectType_OBJECT_MATVIEW: "ALTER MATERIALIZED VIEW", pg.ObjectType_OBJECT_PUBLICATION: "ALTER PUBLICATION",
	pg.ObjectType_OBJECT_SUBSCRIPTION: "ALTER SUBSCRIPTION", pg.ObjectType_OBJECT_STATISTIC_EXT: "ALTER STATISTICS",
}
