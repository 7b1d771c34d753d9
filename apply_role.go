package siphon

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/siphondb/siphon/canonical"
	"github.com/siphondb/siphon/internal/fkgraph"
)

// How apply treats the target's own logic. Like PostgreSQL's logical
// replication, apply runs with session_replication_role = replica: the
// target's ordinary triggers and rules, and the triggers behind foreign
// keys (their checks and their ON DELETE / ON UPDATE actions), do not fire;
// ENABLE REPLICA and ENABLE ALWAYS ones do. The source enforced its
// constraints and ran its triggers already; their effects arrive as changes
// of their own, so the target ends equal to the source.
//
// Setting the parameter needs a superuser or, since PostgreSQL 15, GRANT SET
// ON PARAMETER session_replication_role. A role without it applies as an
// ordinary session (foreign keys are checked), and every table is checked
// before its first row or change: logic that would fire there and not under
// native apply (or the reverse) is refused with a *TriggersWouldFireError,
// unless the Conn was made WithTriggersOnApply.

// applyRole says how one apply session runs.
type applyRole struct {
	replica bool   // session_replication_role = replica is set
	guard   bool   // an ordinary session that checks each table first
	role    string // the target's role, for messages
}

// readApplyRole finds out how c applies on the target q reaches.
func (c *Conn) readApplyRole(ctx context.Context, q querier) (applyRole, error) {
	var r applyRole
	var allowed bool
	err := q.QueryRow(ctx, "SELECT pg_catalog.has_parameter_privilege('session_replication_role', 'SET'), current_user").Scan(&allowed, &r.role)
	if err != nil {
		return r, fmt.Errorf("read the target role's privileges: %w", err)
	}
	switch {
	case c.opts.triggersOnApply:
	case allowed:
		r.replica = true
	default:
		r.guard = true
	}
	return r, nil
}

// replicaRoleSQL makes a session apply as a replica; with LOCAL, for the
// current (or pipelined implicit) transaction only.
const (
	replicaRoleSQL      = "SET session_replication_role = replica"
	localReplicaRoleSQL = "SET LOCAL session_replication_role = replica"
)

// applyEvents are the kinds of change a stream applies to a table: a
// snapshot only inserts, a change stream may do anything.
type applyEvents uint8

const (
	eventInsert applyEvents = 1 << iota
	eventUpdate
	eventDelete
	eventTruncate

	snapshotEvents = eventInsert
	changeEvents   = eventInsert | eventUpdate | eventDelete | eventTruncate
)

// firingQuery lists, for the tables named by $1 (schemas) and $2 (names),
// their enabled triggers and rules with their timing and events, and the
// foreign keys referencing them whose actions change rows.
const firingQuery = `
WITH t AS (
  SELECT c.oid, u.s, u.n FROM unnest($1::text[], $2::text[]) AS u(s, n)
  JOIN pg_namespace ns ON ns.nspname = u.s JOIN pg_class c ON c.relnamespace = ns.oid AND c.relname = u.n)
SELECT t.s, t.n, 'trigger', tg.tgname::text, '', '', tg.tgenabled::text,
       CASE WHEN tg.tgtype & 2 <> 0 THEN 'BEFORE' WHEN tg.tgtype & 64 <> 0 THEN 'INSTEAD OF' ELSE 'AFTER' END,
       tg.tgtype & 4 <> 0, tg.tgtype & 16 <> 0, tg.tgtype & 8 <> 0, tg.tgtype & 32 <> 0
FROM t JOIN pg_trigger tg ON tg.tgrelid = t.oid
WHERE NOT tg.tgisinternal AND tg.tgenabled <> 'D'
UNION ALL
SELECT t.s, t.n, 'rule', r.rulename::text, '', '', r.ev_enabled::text, 'ON',
       r.ev_type = '3', r.ev_type = '2', r.ev_type = '4', false
FROM t JOIN pg_rewrite r ON r.ev_class = t.oid
WHERE r.rulename <> '_RETURN' AND r.ev_enabled <> 'D'
UNION ALL
SELECT t.s, t.n, 'foreign key', k.conname::text, rn.nspname::text, rc.relname::text, 'O',
       CASE WHEN k.confdeltype IN ('c', 'n', 'd')
            THEN 'ON DELETE ' || CASE k.confdeltype WHEN 'c' THEN 'CASCADE' WHEN 'n' THEN 'SET NULL' ELSE 'SET DEFAULT' END
            ELSE 'ON UPDATE ' || CASE k.confupdtype WHEN 'c' THEN 'CASCADE' WHEN 'n' THEN 'SET NULL' ELSE 'SET DEFAULT' END END,
       false, k.confupdtype IN ('c', 'n', 'd'), k.confdeltype IN ('c', 'n', 'd'), false
FROM t JOIN pg_constraint k ON k.confrelid = t.oid AND k.contype = 'f'
JOIN pg_class rc ON rc.oid = k.conrelid JOIN pg_namespace rn ON rn.oid = rc.relnamespace
WHERE k.confdeltype IN ('c', 'n', 'd') OR k.confupdtype IN ('c', 'n', 'd')
ORDER BY 1, 2, 3, 4`

// checkNothingFires returns a *TriggersWouldFireError when applying events
// to tables as an ordinary session would fire logic that native apply does
// not, or skip an ENABLE REPLICA trigger or rule. Tables that do not exist
// are left for their first use to report.
func checkNothingFires(ctx context.Context, q querier, role string, tables []canonical.TableName, events applyEvents) error {
	schemas, names := nameArrays(tables)
	rows, err := q.Query(ctx, firingQuery, schemas, names)
	if err != nil {
		return fmt.Errorf("read the target's triggers: %w", err)
	}
	defer rows.Close()
	var found []Trigger
	for rows.Next() {
		var (
			t                       Trigger
			enabled, timing         string
			ins, upd, del, truncate bool
		)
		if err := rows.Scan(&t.Table.Schema, &t.Table.Name, &t.Kind, &t.Name, &t.Referencing.Schema, &t.Referencing.Name,
			&enabled, &timing, &ins, &upd, &del, &truncate); err != nil {
			return fmt.Errorf("read the target's triggers: %w", err)
		}
		var on []string
		for _, e := range []struct {
			set   bool
			event applyEvents
			name  string
		}{{ins, eventInsert, "INSERT"}, {upd, eventUpdate, "UPDATE"}, {del, eventDelete, "DELETE"}, {truncate, eventTruncate, "TRUNCATE"}} {
			if e.set && events&e.event != 0 {
				on = append(on, e.name)
			}
		}
		if len(on) == 0 || enabled == "A" { // never applied here, or fires under native apply too
			continue
		}
		t.On, t.Fires = timing+" "+strings.Join(on, " OR "), enabled != "R"
		if t.Kind == TriggerKindForeignKey {
			t.On = timing
		}
		found = append(found, t)
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read the target's triggers: %w", err)
	}
	if len(found) > 0 {
		return &TriggersWouldFireError{Role: role, Triggers: found}
	}
	return nil
}

// checkLoadOrder returns a *ForeignKeyOrderError when rows loaded table by
// table in order would fail a foreign key of the target that cannot be
// deferred.
func checkLoadOrder(ctx context.Context, q querier, role string, order []canonical.TableName) error {
	edges, err := readForeignKeys(ctx, q, order)
	if err != nil {
		return err
	}
	fixed := slices.DeleteFunc(edges, func(e fkgraph.Edge) bool { return e.Deferrable })
	e, backward := fkgraph.Backward(order, fixed)
	if !backward {
		return nil
	}
	refusal := &ForeignKeyOrderError{Role: role, Table: e.Child, References: e.Parent, Constraint: e.Constraint}
	for _, back := range fkgraph.Path(fixed, e.Parent, e.Child) {
		refusal.Cycle = append(refusal.Cycle, back.Constraint)
	}
	return refusal
}
