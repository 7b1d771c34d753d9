package siphon

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5/pgconn"

	dsnpkg "github.com/siphondb/siphon/internal/dsn"
	"github.com/siphondb/siphon/internal/pgerr"
)

// sessionSettings are set on every session siphon opens, replication
// sessions included, so output functions print values the same way, and
// every name siphon's SQL does not qualify resolves in pg_catalog (then
// the session's own temporary objects), as in PostgreSQL's own apply
// workers: a search_path the database's owner sets (ALTER DATABASE … SET)
// could otherwise put her functions and operators before the built-ins,
// to run as siphon's role. An application_name or search_path the DSN
// gives (search_path=…, or -c search_path=… in its options or PGOPTIONS)
// is the user's own choice and is kept, provided that it searches
// pg_catalog first (see [ErrUnsafeSearchPath]).
var sessionSettings = map[string]string{
	"search_path":        "pg_catalog, pg_temp",
	"DateStyle":          "ISO, MDY",
	"TimeZone":           "UTC",
	"IntervalStyle":      "postgres",
	"extra_float_digits": "3",
	"bytea_output":       "hex",
	"lc_monetary":        "C",
	"application_name":   "siphon",
}

// noTimeouts returns the query that turns off, for the rest of the
// transaction (local) or of the session, every timeout a role or database
// setting may give a session: statement_timeout, lock_timeout,
// idle_in_transaction_session_timeout, and transaction_timeout where the
// server has it (PostgreSQL 17 on). It is for what lasts as long as a
// copy, a dump or a chunk of the catch-up does, and waits for a lock as
// long as pg_dump would.
func noTimeouts(local bool) string {
	return fmt.Sprintf("SELECT pg_catalog.set_config(name, '0', %t) FROM pg_catalog.pg_settings "+
		"WHERE name IN ('statement_timeout', 'lock_timeout', 'idle_in_transaction_session_timeout', 'transaction_timeout')", local)
}

// setSessionSettings gives config, parsed from a user's DSN, siphon's
// session settings, and makes each session it opens check its search_path
// before anything else runs in it (the query of the DSN's
// target_session_attrs included).
// A setting the DSN spells in another case (DATESTYLE=…) is the server's
// same setting, sent twice in an order no one chose: it takes the
// setting's own spelling, so that siphon's value replaces it (or, for the
// two the user may choose, it replaces siphon's).
func setSessionSettings(config *pgconn.Config) {
	params := config.RuntimeParams
	for key, value := range params {
		for name := range sessionSettings {
			if key != name && strings.EqualFold(key, name) {
				delete(params, key)
				if _, set := params[name]; !set {
					params[name] = value
				}
			}
		}
	}
	userSearchPath := len(dsnpkg.SearchPaths(params)) > 0
	for name, value := range sessionSettings {
		_, set := params[name]
		switch {
		case set && name == "application_name", name == "search_path" && userSearchPath:
			continue // the user's own wins (a search_path in options or PGOPTIONS too)
		}
		params[name] = value
	}
	validate := config.ValidateConnect // target_session_attrs' query, when the DSN sets it
	config.ValidateConnect = func(ctx context.Context, conn *pgconn.PgConn) error {
		if err := requireCatalogFirst(ctx, conn); err != nil {
			return err
		}
		if validate != nil {
			return validate(ctx, conn)
		}
		return nil
	}
}

// requireCatalogFirst fails a session whose search_path setting names a
// schema before pg_catalog (see [dsnpkg.CatalogFirst]). It reads the
// setting from the server, which alone knows what the startup packet's
// settings (a DSN's, PGOPTIONS', in whatever spelling) made of it, and
// checks its text, not the schemas that exist: one named before
// pg_catalog could be created while the session lasts.
func requireCatalogFirst(ctx context.Context, conn *pgconn.PgConn) error {
	res, err := conn.Exec(ctx, "SELECT pg_catalog.current_setting('search_path')").ReadAll()
	if err != nil {
		return fmt.Errorf("siphon: read the session's search_path: %w", err)
	}
	if len(res) != 1 || len(res[0].Rows) != 1 {
		return errors.New("siphon: read the session's search_path: the server returned no row")
	}
	if path := string(res[0].Rows[0][0]); !dsnpkg.CatalogFirst(path) {
		return fmt.Errorf("%w: search_path = %q: name pg_catalog first in it, or leave pg_catalog out "+
			"(the server then searches it first)", ErrUnsafeSearchPath, path)
	}
	return nil
}

// explainSearchPath returns err, when the target's own code (a trigger's
// function, a constraint's) did not find a name, with what to do about it:
// that code runs under siphon's search_path. It returns err otherwise. It
// names the function from the error's context, never more of the context:
// the lines after it (a COPY's) may quote the row.
func explainSearchPath(err error) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || !pgerr.Is(err, pgerrcode.UndefinedTable, pgerrcode.UndefinedFunction, pgerrcode.UndefinedObject) {
		return err
	}
	where, _, _ := strings.Cut(pgErr.Where, "\n")
	if !strings.HasPrefix(where, "PL/pgSQL function ") && !strings.HasPrefix(where, "SQL function ") {
		return err
	}
	return fmt.Errorf("%w: the target's own code (%s) did not find it, and siphon's sessions run with search_path = %s "+
		"(PostgreSQL's own apply workers run with an empty one): where that code names it without its schema, name the schema "+
		"or give the function SET search_path; a search_path in the target's DSN (search_path=public) serves too, "+
		"where only roles you trust may create objects in its schemas", err, where, sessionSettings["search_path"])
}
