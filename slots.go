package siphon

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/siphondb/siphon/canonical"
)

// slotCreated says what ensureSlot found or made.
type slotCreated struct {
	// Created is true when this call created the slot.
	Created bool
	// ConsistentPoint is the new slot's consistent point (zero when the slot
	// already existed).
	ConsistentPoint canonical.Position
}

// ensureSlot makes sure the publication and then the persistent logical
// slot exist (in that order: pgoutput reads publications through the
// historic catalog, so a publication created after the slot misses changes).
func (c *Conn) ensureSlot(ctx context.Context) (slotCreated, error) {
	if err := c.ensurePublication(ctx); err != nil {
		return slotCreated{}, err
	}
	var exists bool
	if err := c.pool.QueryRow(ctx, "SELECT EXISTS (SELECT FROM pg_replication_slots WHERE slot_name = $1)", c.opts.slot).Scan(&exists); err != nil {
		return slotCreated{}, fmt.Errorf("siphon: look up slot %q: %w", c.opts.slot, err)
	}
	if exists {
		return slotCreated{}, nil
	}
	repl, err := c.newReplicationSession(ctx)
	if err != nil {
		return slotCreated{}, fmt.Errorf("siphon: create slot %q: %w", c.opts.slot, err)
	}
	defer repl.Close(context.Background())
	res, err := pglogrepl.CreateReplicationSlot(ctx, repl, c.opts.slot, "pgoutput",
		pglogrepl.CreateReplicationSlotOptions{Mode: pglogrepl.LogicalReplication, SnapshotAction: "NOSNAPSHOT"})
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "42710" { // created meanwhile by another session
			return slotCreated{}, nil
		}
		return slotCreated{}, fmt.Errorf("siphon: create slot %q: %w", c.opts.slot, err)
	}
	pos, err := canonical.ParsePosition(res.ConsistentPoint)
	if err != nil {
		return slotCreated{}, fmt.Errorf("siphon: create slot %q: %w", c.opts.slot, err)
	}
	c.log.Info("replication slot created", "slot", c.opts.slot, "consistent_point", pos)
	return slotCreated{Created: true, ConsistentPoint: pos}, nil
}

// ensurePublication creates the publication when it is missing: FOR ALL
// TABLES, or for the WithTables set.
func (c *Conn) ensurePublication(ctx context.Context) error {
	var exists bool
	if err := c.pool.QueryRow(ctx, "SELECT EXISTS (SELECT FROM pg_publication WHERE pubname = $1)", c.opts.publication).Scan(&exists); err != nil {
		return fmt.Errorf("siphon: look up publication %q: %w", c.opts.publication, err)
	}
	if exists {
		return nil
	}
	stmt := "CREATE PUBLICATION " + quoteIdent(c.opts.publication) + " FOR ALL TABLES"
	if len(c.tables) > 0 {
		stmt = "CREATE PUBLICATION " + quoteIdent(c.opts.publication) + " FOR TABLE "
		for i, t := range c.tables {
			if i > 0 {
				stmt += ", "
			}
			stmt += quoteTable(t)
		}
	}
	if _, err := c.pool.Exec(ctx, stmt); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "42710" { // created meanwhile
			return nil
		}
		return fmt.Errorf("siphon: create publication %q: %w", c.opts.publication, err)
	}
	return nil
}

// quoteIdent quotes a SQL identifier, always.
func quoteIdent(s string) string { return pgx.Identifier{s}.Sanitize() }

// quoteTable quotes a schema-qualified table name.
func quoteTable(t canonical.TableName) string { return pgx.Identifier{t.Schema, t.Name}.Sanitize() }
