package siphon

import (
	"context"
	"fmt"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/siphondb/siphon/pgdump"
)

// What the Conn knows of its server: release, system identifier,
// timeline, wal_level.

// serverVersion reads the server's version from a pooled session's
// parameters, without a round trip.
func (c *Conn) serverVersion(ctx context.Context) (pgdump.Version, error) {
	conn, err := c.pool.Acquire(ctx)
	if err != nil {
		return pgdump.Version{}, err
	}
	defer conn.Release()
	return pgdump.ParseVersion(conn.Conn().PgConn().ParameterStatus("server_version"))
}

// identifySystem reads the system identifier, timeline and server version
// with IDENTIFY_SYSTEM on a replication session of its own.
func (c *Conn) identifySystem(ctx context.Context) (streamInfo, error) {
	repl, err := c.newReplicationSession(ctx, nil)
	if err != nil {
		return streamInfo{}, err
	}
	defer closeSession(repl)
	return identifySource(ctx, repl)
}

// identifySource reads the system identifier, timeline and server version.
func identifySource(ctx context.Context, conn *pgconn.PgConn) (streamInfo, error) {
	sys, err := pglogrepl.IdentifySystem(ctx, conn)
	if err != nil {
		return streamInfo{}, fmt.Errorf("identify system: %w", err)
	}
	return streamInfo{systemID: sys.SystemID, timeline: uint32(sys.Timeline), serverVersion: conn.ParameterStatus("server_version")}, nil
}

// streamInfo describes the source, from IDENTIFY_SYSTEM.
type streamInfo struct {
	systemID      string
	timeline      uint32
	serverVersion string
}

// checkWALLevel returns the *PreflightError of a server whose wal_level is
// not logical, for the operations that read changes.
func (c *Conn) checkWALLevel() error {
	if c.walLevel.Status == CheckFailed {
		return &PreflightError{Check: c.walLevel}
	}
	return nil
}
