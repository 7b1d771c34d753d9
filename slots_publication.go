package siphon

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/siphondb/siphon/canonical"
)

// The publication selects what the change stream carries. It is created
// before any slot (pgoutput reads publications through the historic
// catalog), and never changed once it exists.

// ensurePublication creates the publication when it is missing: FOR ALL
// TABLES, or for the WithTables set. One that exists with another table
// set, or that does not publish every kind of change, is a
// [*PublicationMismatchError]: siphon never changes it.
func (c *Conn) ensurePublication(ctx context.Context) error {
	found, err := c.checkPublication(ctx)
	if err != nil || found {
		return err
	}
	if _, err := c.pool.Exec(ctx, c.createPublicationSQL()); err != nil {
		if isCode(err, codeDuplicateObject, codeUniqueViolation) { // created meanwhile
			_, err := c.checkPublication(ctx)
			return err
		}
		hint := ""
		if isCode(err, codeInsufficientPriv) {
			hint = ": create it as a superuser (FOR ALL TABLES needs one), or name tables you own with WithTables"
		}
		return fmt.Errorf("siphon: create publication %q%s: %w", c.opts.publication, hint, err)
	}
	scope := "all"
	if len(c.tables) > 0 {
		scope = tableList(c.tables)
	}
	c.log.Info("publication created", "publication", c.opts.publication, "tables", scope)
	return nil
}

func (c *Conn) createPublicationSQL() string {
	stmt := "CREATE PUBLICATION " + quoteIdent(c.opts.publication)
	if len(c.tables) == 0 {
		return stmt + " FOR ALL TABLES"
	}
	return stmt + " FOR TABLE " + tableList(c.tables)
}

// PublicationMismatchError reports a publication that exists but does not
// publish what siphon was configured for.
type PublicationMismatchError struct {
	Publication string
	Problem     string // what differs
}

func (e *PublicationMismatchError) Error() string {
	return fmt.Sprintf("siphon: publication %q %s: siphon does not change an existing publication;"+
		" adjust it with ALTER PUBLICATION, drop it, or name another with WithPublication", e.Publication, e.Problem)
}

// checkPublication reports whether the publication exists, and an error
// when it exists but differs from the configuration.
func (c *Conn) checkPublication(ctx context.Context) (bool, error) {
	var all, ins, upd, del, trunc bool
	var schemas, names []string
	err := c.pool.QueryRow(ctx, `
		SELECT p.puballtables, p.pubinsert, p.pubupdate, p.pubdelete, p.pubtruncate,
		       coalesce((SELECT array_agg(n.nspname::text ORDER BY n.nspname, c.relname) FROM pg_publication_rel r
		                 JOIN pg_class c ON c.oid = r.prrelid JOIN pg_namespace n ON n.oid = c.relnamespace
		                 WHERE r.prpubid = p.oid), '{}'),
		       coalesce((SELECT array_agg(c.relname::text ORDER BY n.nspname, c.relname) FROM pg_publication_rel r
		                 JOIN pg_class c ON c.oid = r.prrelid JOIN pg_namespace n ON n.oid = c.relnamespace
		                 WHERE r.prpubid = p.oid), '{}')
		FROM pg_publication p WHERE p.pubname = $1`, c.opts.publication).
		Scan(&all, &ins, &upd, &del, &trunc, &schemas, &names)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("siphon: look up publication %q: %w", c.opts.publication, err)
	}
	mismatch := func(problem string) (bool, error) {
		return true, &PublicationMismatchError{Publication: c.opts.publication, Problem: problem}
	}
	if !(ins && upd && del && trunc) {
		return mismatch("does not publish every kind of change (insert, update, delete, truncate)")
	}
	switch {
	case len(c.tables) == 0 && !all:
		return mismatch("publishes only some tables, but siphon was not limited with WithTables")
	case len(c.tables) > 0 && all:
		return mismatch("publishes all tables, but WithTables names " + tableList(c.tables))
	case len(c.tables) > 0:
		have := make([]canonical.TableName, len(names))
		for i := range names {
			have[i] = canonical.TableName{Schema: schemas[i], Name: names[i]}
		}
		if !sameTables(have, c.tables) {
			return mismatch("publishes " + tableList(have) + ", but WithTables names " + tableList(c.tables))
		}
	}
	return true, nil
}

func sameTables(a, b []canonical.TableName) bool {
	set := make(map[canonical.TableName]bool, len(a))
	for _, t := range a {
		set[t] = true
	}
	for _, t := range b {
		if !set[t] {
			return false
		}
	}
	return len(set) == len(b)
}

func tableList(ts []canonical.TableName) string {
	if len(ts) == 0 {
		return "no table"
	}
	s := make([]string, len(ts))
	for i, t := range ts {
		s[i] = quoteTable(t)
	}
	return strings.Join(s, ", ")
}
