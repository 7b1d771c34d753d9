package siphon_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"

	"github.com/siphondb/siphon"
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
