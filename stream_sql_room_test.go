package siphon_test

import (
	"log/slog"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/siphondb/siphon/siphontest"
)

// catchUpNoRoom is the log message of a stream that found no room for a
// copy of its slot.
const catchUpNoRoom = "stream not catching up through the SQL interface: no free replication slot or connection for a copy of the slot"

// TestCatchUpWithRoomForFewerWorkers catches up on servers whose
// max_replication_slots leaves room for one copy of the slot, and for
// none, where the catch-up asks for two: with one, it reads the backlog
// with the one worker it could open; with none, the walsender reads it.
// Both deliver every transaction in order and leave no slot or session
// behind.
func TestCatchUpWithRoomForFewerWorkers(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, maxSlots, log, want string
	}{
		{name: "room for one copy", maxSlots: "2", log: catchUpStarted, want: "workers=1"},
		{name: "room for none", maxSlots: "1", log: catchUpNoRoom, want: "all replication slots are in use"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := siphontest.Start(t, siphontest.WithPrivateServer(), siphontest.WithSetting("max_replication_slots", tc.maxSlots))
			dsn := srv.NewDatabase(t)
			admin := connectOrFail(t, dsn)
			execSQL(t, admin, "CREATE TABLE wide (id int PRIMARY KEY, pad text)")
			c, logs, slot, start := catchUpConnAt(t, dsn)
			insertWide(t, admin, 50, 100)
			emitMarker(t, admin, "end")

			changes, _ := collectUntilEnd(t, c, start, nil)
			requireWide(t, changes, 50, 100)
			if found := logs.find(slog.LevelInfo, tc.log); assert.Len(t, found, 1) {
				assert.Contains(t, found[0], tc.want)
			}
			require.NoError(t, c.Close())
			assertNoLeaks(t, dsn, slot)
		})
	}
}
