package siphon

import (
	"context"
	"regexp"
	"time"

	"github.com/siphondb/siphon/canonical"
	"github.com/siphondb/siphon/internal/ulid"
)

// What the external tests of slots.go need from the inside.

// SnapshotSlot is the snapshot slot type, for tests.
type SnapshotSlot = snapshotSlot

// EnsureSlotForTest runs ensureSlot.
func (c *Conn) EnsureSlotForTest(ctx context.Context) (created bool, consistentPoint canonical.Position, err error) {
	s, err := c.ensureSlot(ctx)
	return s.Created, s.ConsistentPoint, err
}

// EnsurePublicationForTest runs ensurePublication.
func (c *Conn) EnsurePublicationForTest(ctx context.Context) error {
	_, err := c.ensurePublication(ctx)
	return err
}

// CreateSnapshotSlotForTest runs createSnapshotSlot.
func (c *Conn) CreateSnapshotSlotForTest(ctx context.Context) (*SnapshotSlot, error) {
	return c.createSnapshotSlot(ctx, true)
}

// DropOrphansForTest drops the named slots as a sweep does after its scan,
// under the slot-management lock: it lets a test make a slot active between
// the scan and the drop.
func (c *Conn) DropOrphansForTest(ctx context.Context, names []string) ([]string, error) {
	lock, err := c.lockSlots(ctx, time.Now().Add(time.Minute))
	if err != nil {
		return nil, err
	}
	defer lock.release()
	return dropOrphans(ctx, lock.conn, names)
}

// NewULIDForTest and ULIDTimeForTest expose the ULID helpers.
var (
	NewULIDForTest = ulid.New
)

// SlotLockKeyForTest is the slot-management advisory lock key.
const SlotLockKeyForTest = slotLockKey

// BaseSlotPatternForTest is the pattern sweeping matches.
var BaseSlotPatternForTest = regexp.MustCompile(baseSlotPattern.String())
