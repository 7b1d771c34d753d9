package sqltext

import (
	pg "github.com/pganalyze/pg_query_go/v6"
)

// IsTypeName reports whether s is exactly a type name, as format_type
// prints them (`integer`, `character varying(10)`, `public."My Type"[]`,
// `timestamp(3) with time zone`), and nothing else: `SELECT NULL::` + s
// parses as one SELECT whose only target is a cast of a NULL constant,
// with integer type modifiers if any, and s holds no comment or semicolon. Such an s may be spliced after
// ADD COLUMN name without changing what the statement does.
func IsTypeName(s string) bool {
	const prefix = "SELECT NULL::"
	query := prefix + s
	tokens, err := scan(query)
	if err != nil {
		return false
	}
	for _, tok := range tokens {
		if isComment(tok) || tok.GetToken() == pg.Token_ASCII_59 {
			return false
		}
	}
	tree, err := parse(query)
	if err != nil || len(tree.GetStmts()) != 1 {
		return false
	}
	sel := tree.GetStmts()[0].GetStmt().GetSelectStmt()
	if sel == nil || len(sel.GetTargetList()) != 1 || !onlyTargets(sel) {
		return false
	}
	target := sel.GetTargetList()[0].GetResTarget()
	if target == nil || target.GetName() != "" || len(target.GetIndirection()) != 0 {
		return false
	}
	cast := target.GetVal().GetTypeCast()
	return cast != nil && cast.GetArg().GetAConst().GetIsnull() && plainType(cast.GetTypeName())
}

// plainType reports whether t is a type name whose modifiers, if any, are
// integer constants (as format_type prints them): a modifier that is an
// identifier would reach a type's typmod_in function on the target.
func plainType(t *pg.TypeName) bool {
	if t == nil || t.GetSetof() || t.GetPctType() {
		return false
	}
	for _, m := range t.GetTypmods() {
		if _, ok := m.GetAConst().GetVal().(*pg.A_Const_Ival); !ok {
			return false
		}
	}
	return true
}

// onlyTargets reports whether the SELECT has nothing but its target list.
func onlyTargets(s *pg.SelectStmt) bool {
	return len(s.GetDistinctClause()) == 0 && s.GetIntoClause() == nil && len(s.GetFromClause()) == 0 &&
		s.GetWhereClause() == nil && len(s.GetGroupClause()) == 0 && !s.GetGroupDistinct() && s.GetHavingClause() == nil &&
		len(s.GetWindowClause()) == 0 && len(s.GetValuesLists()) == 0 && len(s.GetSortClause()) == 0 &&
		s.GetLimitOffset() == nil && s.GetLimitCount() == nil && len(s.GetLockingClause()) == 0 && s.GetWithClause() == nil &&
		s.GetOp() == pg.SetOperation_SETOP_NONE && s.GetLarg() == nil && s.GetRarg() == nil
}
