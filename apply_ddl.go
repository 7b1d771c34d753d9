package siphon

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/siphondb/siphon/canonical"
	"github.com/siphondb/siphon/internal/sqltext"
)

// schemaChange applies an OpDDL change in the unit's transaction, which
// then ends with the source transaction (a new enum value, say, is usable
// only once committed).
func (cc *changeConsumer) schemaChange(ctx context.Context, ch *canonical.Change) error {
	cc.unit.schemaChanged = true
	if err := cc.flushRuns(ctx); err != nil {
		return err
	}
	if err := cc.s.flush(ctx); err != nil {
		return err
	}
	return cc.s.c.runSchemaChange(ctx, cc.s, cc.tx.pos, ch.DDL, cc.s.skip)
}

// ddlSession is where a schema change runs: an apply session in its open
// transaction, or ApplyChange's pooled session.
type ddlSession interface {
	// runDDL runs d's statement under its search_path, as its source role
	// where the target has it (see apply_trust.go).
	runDDL(ctx context.Context, d *canonical.DDL) error
	// schemaChanged forgets what is known of the target's tables.
	schemaChanged()
}

// runSchemaChange runs d, of the source transaction committed at pos,
// under the source's search_path and role, unless skip holds pos, or d is
// not trusted (an *UntrustedSchemaChangeError) or cannot be replayed (a
// *SchemaChangeError).
func (c *Conn) runSchemaChange(ctx context.Context, s ddlSession, pos canonical.Position, d *canonical.DDL, skip []canonical.Position) error {
	if slices.Contains(skip, pos) {
		c.log.Warn("schema change skipped (SkipSchemaChanges)", "position", pos, "tag", d.Tag, "statement", errorStatement(d))
		return nil
	}
	if err := c.checkTrusted(pos, d); err != nil {
		return err
	}
	var err error
	if d.Problem == "" {
		defer s.schemaChanged()
		if err = s.runDDL(ctx, d); err == nil {
			return nil
		}
	}
	if errors.Is(err, errRoleNotTaken) {
		return &UntrustedSchemaChangeError{Position: pos, Role: d.Role, SessionRole: sessionRole(d), Tag: d.Tag,
			Statement: errorStatement(d), Reason: errRoleNotTaken.Error(), roleMissing: true}
	}
	return &SchemaChangeError{Position: pos, Tag: d.Tag, Statement: d.Statement, Problem: d.Problem, Err: err}
}

// setSearchPathSQL sets the search_path for the rest of the transaction.
const setSearchPathSQL = "SELECT pg_catalog.set_config('search_path', $1, true)"

// runDDL runs d's statement in the session's open transaction, then puts
// the session's role and search_path back.
func (s *applySession) runDDL(ctx context.Context, d *canonical.DDL) error {
	if err := s.await(); err != nil {
		return err
	}
	id, err := s.c.readIdentity(ctx, s.conn, d)
	if err != nil {
		return err
	}
	for _, step := range ddlSteps(d, id) {
		if _, err := s.pg.ExecParams(ctx, step.sql, step.params, nil, nil, nil).Close(); err != nil {
			return err
		}
	}
	return nil
}

// schemaChanged forgets the target's tables: they are read again, and
// checked again when the role must, at their next use.
func (s *applySession) schemaChanged() {
	if s.role.guard {
		for name := range s.targets {
			if !slices.Contains(s.unchecked, name) {
				s.unchecked = append(s.unchecked, name)
			}
		}
	}
	clear(s.targets)
	clear(s.bindings)
}

// applySchemaChange is ApplyChange of an OpDDL change.
func (c *Conn) applySchemaChange(ctx context.Context, ch *canonical.Change) error {
	if ch.DDL == nil {
		return fmt.Errorf("a ddl change without its DDL")
	}
	role, err := c.apply.applyRole(ctx, c)
	if err != nil {
		return err
	}
	return c.runSchemaChange(ctx, pooledDDL{c: c, role: role}, ch.Position, ch.DDL, nil)
}

// pooledDDL runs ApplyChange's schema changes on a pooled session, each
// in an implicit transaction of its own, as a replica when the role may.
type pooledDDL struct {
	c    *Conn
	role applyRole
}

func (p pooledDDL) runDDL(ctx context.Context, d *canonical.DDL) error {
	conn, err := p.c.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	id, err := p.c.readIdentity(ctx, conn.Conn(), d)
	if err != nil {
		return err
	}
	batch := &pgconn.Batch{}
	if p.role.replica {
		batch.ExecParams(localReplicaRoleSQL, nil, nil, nil, nil)
	}
	for _, step := range ddlSteps(d, id) {
		batch.ExecParams(step.sql, step.params, nil, nil, nil)
	}
	_, err = conn.Conn().PgConn().ExecBatch(ctx, batch).ReadAll()
	return err
}

func (p pooledDDL) schemaChanged() { p.c.apply.forgetAll() }

// followColumns makes the target table follow the column changes the
// stream shows without schema change records (a source without the
// schema capture), where that is exact:
//   - a column the source added, which the target lacks, is added when it
//     is nullable and has no default on the source: the rows that existed
//     hold NULL there too;
//   - a column the table's previous table record in this stream had, and
//     the new one has not, is dropped.
//
// A change that adds and drops columns at once (a rename, perhaps), or
// adds a column with a default, is left to bind to refuse. followed
// reports whether the target table changed.
func (s *applySession) followColumns(ctx context.Context, t *canonical.Table, target *targetTable) (followed bool, err error) {
	name := t.TableName()
	prev := s.previous[name]
	var add []canonical.Column
	for _, c := range t.Columns {
		if target.column(c.Name) == nil {
			add = append(add, c)
		}
	}
	var drop []string
	others := false // target columns the stream never had: the target's own
	for _, tc := range target.columns {
		switch {
		case t.ColumnIndex(tc.name) >= 0, tc.generated: // a stream carries no generated column
		case slices.ContainsFunc(prev, func(c canonical.Column) bool { return c.Name == tc.name }):
			drop = append(drop, tc.name)
		default:
			others = true
		}
	}
	switch {
	case len(add) > 0 && (len(drop) > 0 || others):
		return false, nil // which column became which is not known
	case slices.ContainsFunc(add, func(c canonical.Column) bool { return !c.Nullable || c.Default }):
		return false, nil // the rows that existed got values the stream does not carry
	case len(add)+len(drop) == 0:
		return false, nil
	}
	// A column's type is text from the stream: it reaches SQL only once
	// isTypeName and the target's own parser take it for a type name.
	notType := func(c canonical.Column) error {
		return &SchemaIncompatibleError{Table: name, Column: c.Name, Problem: fmt.Sprintf(
			"the source added the column with type %q, which is not a type name the target knows: nothing was run; add the column by hand", shorten(c.Type, 80))}
	}
	for _, c := range add {
		if !isTypeName(c.Type) {
			return false, notType(c)
		}
	}
	if err := s.flush(ctx); err != nil {
		return false, err
	}
	var stmts []string
	for _, c := range add {
		typ, ok, err := targetTypeName(ctx, s.pg, c.Type)
		if err != nil {
			return false, err
		} else if !ok {
			return false, notType(c)
		}
		stmts = append(stmts, "ALTER TABLE "+sqltext.Name(name.Schema, name.Name)+" ADD COLUMN "+sqltext.Ident(c.Name)+" "+typ)
	}
	for _, col := range drop {
		stmts = append(stmts, "ALTER TABLE "+sqltext.Name(name.Schema, name.Name)+" DROP COLUMN "+sqltext.Ident(col))
	}
	for _, stmt := range stmts {
		if _, err := s.pg.Exec(ctx, stmt).ReadAll(); err != nil {
			return false, &SchemaIncompatibleError{Table: name, Problem: fmt.Sprintf(
				"the source's columns changed and following them failed (%s): %v; change the target table by hand", stmt, err)}
		}
	}
	s.c.log.Info("the target table follows the columns the source added or dropped", "table", name, "statements", stmts)
	return true, nil
}
