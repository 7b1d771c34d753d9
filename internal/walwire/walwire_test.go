package walwire

import (
	"encoding/binary"
	"sync/atomic"
	"testing"

	"github.com/jackc/pglogrepl"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/siphondb/siphon/canonical"
)

// keepalive is a walsender's keepalive message naming walEnd.
func keepalive(walEnd canonical.Position) []byte {
	msg := make([]byte, 1+8+8+1)
	msg[0] = pglogrepl.PrimaryKeepaliveMessageByteID
	binary.BigEndian.PutUint64(msg[1:], uint64(walEnd))
	return msg
}

// What the status updates confirm, as the walsender's keepalives come in:
// the slot's position at the session's start, until the walsender has
// reached the acknowledged position, then that. Never a position in
// between, nothing vouches for (the acknowledged position lies past the
// walsender's reach when the SQL catch-up read ahead of it), and never
// one behind the slot's, which a walsender reading up from the slot's
// restart_lsn names in its keepalives until it reaches it (a walsender
// takes a confirmation behind the slot's position as it is).
func TestReportedIsTheSlotsOrAnAcknowledgedPosition(t *testing.T) {
	t.Parallel()
	var acked atomic.Uint64
	acked.Store(0x3000)
	w := New(Config{Acked: &acked, Confirmed: 0x2000, Probing: new(atomic.Bool)})
	assert.Equal(t, canonical.Position(0x2000), w.reported(), "at the start: the slot's position")

	require.NoError(t, w.copyData(keepalive(0x1000)))
	assert.Equal(t, canonical.Position(0x2000), w.reported(), "the walsender reads behind the slot's position")

	require.NoError(t, w.copyData(keepalive(0x2800)))
	assert.Equal(t, canonical.Position(0x2000), w.reported(), "past it, but short of the acknowledged position")

	require.NoError(t, w.copyData(keepalive(0x4000)))
	assert.Equal(t, canonical.Position(0x3000), w.reported(), "the acknowledged position, once the walsender read past it")

	acked.Store(0x5000)
	require.NoError(t, w.copyData(keepalive(0x4800)))
	assert.Equal(t, canonical.Position(0x3000), w.reported(), "the last one it reached, while it reads up to the next")
}
