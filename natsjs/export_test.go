package natsjs

import (
	"encoding/hex"
	"time"

	"github.com/siphondb/siphon/canonical"
)

// SignForTest is the MAC a Publisher with key puts on a schema change
// message (see HeaderMAC), for tests that publish by hand.
func SignForTest(key []byte, subject, systemID, slot string, xid uint32, commit canonical.Position, commitTime time.Time, index int, data []byte) string {
	h := msgHeader{systemID: systemID, slot: slot, xid: xid, commit: commit, commitTime: commitTime, index: index}
	return hex.EncodeToString(ddlMAC(key, subject, &h, data))
}

// ParseChangesForTest reads the n changes of a message that holds several,
// as Consume does.
func ParseChangesForTest(data []byte, n int) ([]canonical.Change, error) {
	return parseChanges(data, n)
}
