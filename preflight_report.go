package siphon

import (
	"fmt"
	"strings"
)

// CheckName names a check of [Conn.Preflight] (and of the checks Connect
// makes itself).
type CheckName string

// The checks.
const (
	CheckWALLevel        CheckName = "wal_level"
	CheckEncoding        CheckName = "encoding"
	CheckTables          CheckName = "tables"
	CheckReplicationRole CheckName = "replication privilege"
	CheckSlots           CheckName = "replication slots"
	CheckWALSenders      CheckName = "WAL senders"
	CheckSlotWALLimit    CheckName = "max_slot_wal_keep_size"
	CheckPublication     CheckName = "publication"
	CheckReplicaIdentity CheckName = "replica identity"
	CheckSlot            CheckName = "slot"
	CheckPgDump          CheckName = "pg_dump"
	CheckDumpPrivileges  CheckName = "pg_dump privileges"
	CheckPgRestore       CheckName = "pg_restore"
	CheckOrigins         CheckName = "replication origins"
	CheckApplyRole       CheckName = "session_replication_role"
	CheckTableOwners     CheckName = "table owners"
	CheckRelease         CheckName = "release"
	CheckSchemaCapture   CheckName = "schema capture"
)

// CheckStatus says how a check came out.
type CheckStatus string

// The statuses of a check.
const (
	// CheckOK: siphon can do what the check is about.
	CheckOK CheckStatus = "ok"
	// CheckWarning: it can, with a limit or a risk the check describes.
	CheckWarning CheckStatus = "warning"
	// CheckFailed: it cannot until the fix is applied.
	CheckFailed CheckStatus = "failed"
)

// Check is one thing [Conn.Preflight] looked at.
type Check struct {
	Name   CheckName
	Status CheckStatus
	// Found says what the server has, for example "wal_level is replica".
	Found string
	// Needed says what needs it, for example "streaming, snapshots and
	// aligned backups".
	Needed string
	// Fix says exactly what to change; empty when Status is CheckOK.
	Fix string
}

func (c Check) String() string {
	s := fmt.Sprintf("%-8s %s: %s", c.Status, c.Name, c.Found)
	if c.Needed != "" {
		s += " (for " + c.Needed + ")"
	}
	if c.Fix != "" {
		s += "; fix: " + c.Fix
	}
	return s
}

// PreflightReport says what siphon can and cannot do on a server, check by
// check, each failed or risky one with its fix.
type PreflightReport struct {
	// ServerVersion is the server's version, for example "15.18".
	ServerVersion string
	Checks        []Check
}

// Failed returns the checks that failed.
func (r *PreflightReport) Failed() []Check { return r.with(CheckFailed) }

// Warnings returns the checks that passed with a limit or a risk.
func (r *PreflightReport) Warnings() []Check { return r.with(CheckWarning) }

func (r *PreflightReport) with(status CheckStatus) []Check {
	var out []Check
	for _, c := range r.Checks {
		if c.Status == status {
			out = append(out, c)
		}
	}
	return out
}

// Check returns the named check, if the report has it.
func (r *PreflightReport) Check(name CheckName) (Check, bool) {
	for _, c := range r.Checks {
		if c.Name == name {
			return c, true
		}
	}
	return Check{}, false
}

// String lists the checks, one a line.
func (r *PreflightReport) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "PostgreSQL %s\n", r.ServerVersion)
	for _, c := range r.Checks {
		b.WriteString(c.String())
		b.WriteByte('\n')
	}
	return b.String()
}
