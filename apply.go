package siphon

// Apply: replaying changes and canonical streams into a target database.
//
// Files: apply.go (the API, errors, ApplyChange), apply_catalog.go (the
// target's tables and how source columns map onto them), apply_sql.go
// (statements per change shape), apply_queue.go (pipelined statements),
// apply_origin.go (where the applied Position is kept), apply_role.go
// (session_replication_role, and what an ordinary session checks),
// apply_consume.go (ConsumeCanonical, the apply session and its record
// source), apply_units.go (a change stream's transactions, grouped into
// target transactions), apply_copy.go (snapshots and COPY paths) and
// apply_ddl.go (schema changes, and columns followed without them).

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/siphondb/siphon/canonical"
	"github.com/siphondb/siphon/internal/pgerr"
)

// ApplyChange applies one row change, truncate or schema change to the
// database c is connected to (the target), in a transaction of its own.
// Begin, commit and message changes are accepted and do nothing. A schema
// change runs its statement under the source's search_path, as the
// source role that ran it (see the package documentation on schema
// changes), and fails with a [*SchemaChangeError], or an
// [*UntrustedSchemaChangeError] when the target does not trust it. ch.Columns must describe the
// source's columns (changes from [Conn.StreamChanges] and
// [canonical.Decoder] do).
//
// ApplyChange is idempotent for a target table with a primary key (or a
// replica identity index, used when there is no primary key):
//   - an insert is an upsert on that key (INSERT ... ON CONFLICT DO UPDATE);
//   - an update sets the row with that key (taken from the old values when
//     the source sent them, from the new ones otherwise); columns whose
//     unchanged TOAST value the source did not send are left out of the SET
//     list and keep the value the target has, which is the old value;
//   - a delete deletes the row with that key; a missing row is no error.
//
// A target table without such a key is matched on all the old values, which
// needs the source table's REPLICA IDENTITY FULL; update and delete then
// change exactly one matching row (ctid-limited), so duplicate rows stay
// duplicates. That is not idempotent by nature: applied twice, an insert
// inserts twice. [Conn.ConsumeCanonical] gives exactly-once there, by keeping
// the applied Position with the data.
//
// A truncate empties the listed tables (RESTART IDENTITY when the source
// said so); like PostgreSQL's own apply, it does not cascade to tables the
// source did not list.
//
// Values are bound as text parameters typed with the target column's type,
// whose input function rebuilds the exact value; nothing is spliced into
// SQL and every identifier is quoted. A table that does not exist in the
// target, a source column the target lacks or types differently, a
// NOT NULL target column without default that the source does not send, or
// a key the source's old values cannot fill is a [*SchemaIncompatibleError]
// naming the table and column, returned before anything is written.
//
// The target's triggers, rules and foreign keys are treated as in
// [Conn.ConsumeCanonical]: the change is applied with
// session_replication_role = replica when the role may set it; otherwise a
// table where they would fire is refused with a [*TriggersWouldFireError]
// at its first use, unless c was made [WithTriggersOnApply].
//
// Target tables are looked up once and cached on c; a change whose columns
// differ from the cached ones, or an error saying a table or column is
// missing, looks the table up again.
func (c *Conn) ApplyChange(ctx context.Context, ch canonical.Change) error {
	var err error
	switch ch.Op {
	case canonical.OpBegin, canonical.OpCommit, canonical.OpMessage:
		return nil
	case canonical.OpTruncate:
		err = c.applyTruncate(ctx, &ch)
	case canonical.OpInsert, canonical.OpUpdate, canonical.OpDelete:
		err = c.applyRowChange(ctx, &ch)
	case canonical.OpDDL:
		err = c.applySchemaChange(ctx, &ch)
	default:
		err = fmt.Errorf("unknown op %v", ch.Op)
	}
	if err != nil {
		tables := ch.Truncated
		if ch.Op != canonical.OpTruncate {
			tables = []canonical.TableName{ch.TableName()}
		}
		err = explainTablePrivileges(ctx, c.pool, explainSearchPath(err), tables, applyTablePrivileges, "apply: it writes every change of a table")
		err = errorf("siphon: apply %s on %s: %w", ch.Op, describeTarget(&ch), err)
		c.countError(ctx, err)
		return err
	}
	c.stats.applyChanges.Add(1)
	return nil
}

func describeTarget(ch *canonical.Change) string {
	switch ch.Op {
	case canonical.OpTruncate:
		return fmt.Sprintf("%d tables", len(ch.Truncated))
	case canonical.OpDDL:
		return "the schema"
	}
	return ch.TableName().String()
}

func (c *Conn) applyRowChange(ctx context.Context, ch *canonical.Change) error {
	if len(ch.Columns) == 0 {
		return errors.New("the change has no Columns: pass changes as StreamChanges or the canonical decoder give them")
	}
	role, err := c.apply.applyRole(ctx, c)
	if err != nil {
		return err
	}
	b, err := c.apply.binding(ctx, c.pool, role, ch.TableName(), ch.Columns)
	if err != nil {
		return err
	}
	sh := &shape{}
	ok, err := planChange(b, ch, sh)
	if err != nil || !ok {
		return err
	}
	stmt := c.apply.statement(b, sh)
	var params paramList
	params.addChange(sh, ch)
	err = c.execApplied(ctx, role, stmt.sql, params.values, stmt.oids)
	if isCatalogError(err) {
		c.apply.forget(b.source)
	}
	return err
}

func (c *Conn) applyTruncate(ctx context.Context, ch *canonical.Change) error {
	role, err := c.apply.applyRole(ctx, c)
	if err != nil {
		return err
	}
	var targets []*targetTable
	for _, name := range ch.Truncated {
		t, err := c.apply.target(ctx, c.pool, role, name)
		if err != nil {
			return err
		}
		targets = append(targets, t)
	}
	if len(targets) == 0 {
		return nil
	}
	parents, err := truncatedParents(ctx, c.pool, targets)
	if err != nil {
		return err
	}
	err = c.execApplied(ctx, role, truncateSQL(targets, parents, ch.RestartIdentity), nil, nil)
	if isCatalogError(err) {
		for _, name := range ch.Truncated {
			c.apply.forget(name)
		}
	}
	return err
}

// execApplied runs one applied statement on a pooled session, as a
// replica when the role may: SET LOCAL and the statement are sent together
// and run in one implicit transaction.
func (c *Conn) execApplied(ctx context.Context, role applyRole, sql string, params [][]byte, oids []uint32) error {
	conn, err := c.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	pg := conn.Conn().PgConn()
	if !role.replica {
		_, err = pg.ExecParams(ctx, sql, params, oids, nil, nil).Close()
		return err
	}
	batch := &pgconn.Batch{}
	batch.ExecParams(localReplicaRoleSQL, nil, nil, nil, nil)
	batch.ExecParams(sql, params, oids, nil, nil)
	_, err = pg.ExecBatch(ctx, batch).ReadAll()
	return err
}

// isCatalogError reports whether err says a table, column or type is not
// what siphon's cached description of the target said.
func isCatalogError(err error) bool {
	return pgerr.Is(err, pgerrcode.UndefinedTable, pgerrcode.UndefinedColumn, pgerrcode.DatatypeMismatch,
		pgerrcode.InvalidColumnReference) // the last: an ON CONFLICT target that is no unique key
}
