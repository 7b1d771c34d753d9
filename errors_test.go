package siphon_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/siphondb/siphon"
	"github.com/siphondb/siphon/canonical"
)

// TestRetryable: what a retry loop may try again as it is, and what needs
// a fix first.
func TestRetryable(t *testing.T) {
	t.Parallel()
	retry := map[string]error{
		"interrupted stream":    &siphon.StreamInterruptedError{Err: io.EOF},
		"slot in use":           fmt.Errorf("siphon: stream changes: slot %q: %w", "s", siphon.ErrSlotInUse),
		"apply in progress":     fmt.Errorf("siphon: consume canonical: %w", siphon.ErrApplyInProgress),
		"slot creation blocked": fmt.Errorf("create slot: %w", &siphon.SlotBlockedError{Slot: "s"}),
		"backup conflict":       &siphon.BackupConflictError{Table: canonical.TableName{Schema: "public", Name: "t"}, Problem: "rewritten"},
		"server shutting down":  &pgconn.PgError{Code: "57P01"},
		"too many connections":  &pgconn.PgError{Code: "53300"},
		"connection lost":       fmt.Errorf("read: %w", io.ErrUnexpectedEOF),
	}
	for name, err := range retry {
		assert.True(t, siphon.Retryable(err), name)
	}
	fix := map[string]error{
		"nil":                nil,
		"resume gap":         &siphon.ResumeGapError{Slot: "s", Reason: siphon.GapSlotLost},
		"schema change":      &siphon.SchemaChangeError{Statement: "ALTER TABLE t ADD c int", Err: errors.New("boom")},
		"schema mismatch":    &siphon.SchemaIncompatibleError{Problem: "no such column"},
		"bad option":         &siphon.OptionError{Option: "WithSlot"},
		"unique violation":   &pgconn.PgError{Code: "23505"},
		"cancelled":          context.Canceled,
		"deadline":           fmt.Errorf("siphon: stream changes: %w", context.DeadlineExceeded),
		"closed Conn":        siphon.ErrClosed,
		"already streaming":  siphon.ErrAlreadyStreaming,
		"unchecked stream":   siphon.ErrUnchecked,
		"not canonical data": siphon.ErrNotCanonical,
	}
	for name, err := range fix {
		assert.False(t, siphon.Retryable(err), name)
	}
}

// TestErrorsSaySiphonOnce calls the API where errors wrap siphon's own
// (a closed Conn, a slot of the wrong kind, a malformed stream): each
// message starts with "siphon: " and says it only there.
func TestErrorsSaySiphonOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn, admin := newDatabase(t)
	physical := streamSlot(t)
	execSQL(t, admin, "CREATE TABLE t (id int PRIMARY KEY)", "SELECT pg_create_physical_replication_slot('"+physical+"')")
	defer execSQL(t, admin, "SELECT pg_drop_replication_slot('"+physical+"')")

	wrongSlot := connect(t, dsn, siphon.WithSlot(physical))
	open := connect(t, dsn, siphon.WithSlot(streamSlot(t)))
	closed := connect(t, dsn, siphon.WithSlot(streamSlot(t)))
	require.NoError(t, closed.Close())
	noop := func(canonical.Change) error { return nil }
	errs := map[string]error{}
	_, errs["stream from a physical slot"] = wrongSlot.StreamChanges(ctx, 0, noop)
	_, errs["position of a physical slot"] = wrongSlot.CurrentPosition(ctx)
	_, errs["incremental from a physical slot"] = wrongSlot.BackupIncremental(ctx, 0, io.Discard)
	errs["consume a pg_dump file"] = open.ConsumeCanonical(ctx, strings.NewReader("PGDMP\x01\x0e"))
	errs["consume garbage"] = open.ConsumeCanonical(ctx, strings.NewReader("not json\n"))
	_, errs["stream after Close"] = closed.StreamChanges(ctx, 0, noop)
	errs["backup after Close"] = closed.Backup(ctx, siphon.BackupOptions{}, io.Discard)
	_, errs["snapshot after Close"] = closed.TakeSnapshot(ctx)
	_, errs["base slot after Close"] = closed.CreateBaseSlot(ctx)
	errs["detach after Close"] = closed.Detach(ctx)
	_, errs["replicate after Close"] = closed.Replicate(ctx, open, siphon.ReplicateOptions{})
	for what, err := range errs {
		require.Error(t, err, what)
		msg := err.Error()
		assert.True(t, strings.HasPrefix(msg, "siphon: "), "%s: %q", what, msg)
		assert.Equal(t, 1, strings.Count(msg, "siphon: "), "%s: %q", what, msg)
	}
	assert.ErrorIs(t, errs["backup after Close"], siphon.ErrClosed, "wrapping keeps errors.Is")
	var config *siphon.SlotConfigError
	assert.ErrorAs(t, errs["stream from a physical slot"], &config, "wrapping keeps errors.As")
	require.NoError(t, open.Close())
	require.NoError(t, wrongSlot.Close())
	assertNoLeaks(t, dsn)
}
