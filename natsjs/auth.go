package natsjs

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/siphondb/siphon"
	"github.com/siphondb/siphon/canonical"
)

// Schema changes are code: a consumer that applies them runs their
// statements. Anyone who may publish on a stream's subjects could publish
// one, so a Publisher given a key ([Config].Key) signs each schema change
// message, and [Consume] delivers only those signed with one of its keys
// ([ConsumeConfig].Keys), unless [ConsumeConfig].UnauthenticatedSchemaChanges.
const (
	// HeaderKeyID, on a signed schema change message, names the key that
	// signed it (see [canonical.KeyID]).
	HeaderKeyID = "Siphon-Key"
	// HeaderMAC, on a signed schema change message, is the HMAC-SHA-256,
	// in lowercase hex, under that key, of the message's subject, its
	// place (system identifier, slot, commit Position and index: its
	// [MsgID]), its transaction's xid and commit time, and its body, each
	// preceded by its length as 4 bytes big-endian, after the text
	// "siphon natsjs ddl v1".
	HeaderMAC = "Siphon-Mac"
)

// ddlMAC computes a schema change message's MAC under key.
func ddlMAC(key []byte, subject string, h *msgHeader, data []byte) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte("siphon natsjs ddl v1"))
	for _, field := range [][]byte{[]byte(subject), []byte(MsgID(h.systemID, h.slot, h.commit, h.index)),
		strconv.AppendUint(nil, uint64(h.xid), 10), []byte(h.commitTime.UTC().Format(time.RFC3339Nano)), data} {
		var n [4]byte
		binary.BigEndian.PutUint32(n[:], uint32(len(field)))
		m.Write(n[:])
		m.Write(field)
	}
	return m.Sum(nil)
}

// sign adds the key id and MAC of a schema change message to hdr.
func sign(hdr nats.Header, key []byte, subject string, h *msgHeader, data []byte) {
	hdr[HeaderKeyID] = []string{canonical.KeyID(key)}
	hdr[HeaderMAC] = []string{hex.EncodeToString(ddlMAC(key, subject, h, data))}
}

// checkSignature refuses a schema change message not signed with one of
// keys, unless allowed.
func checkSignature(msg *nats.Msg, h *msgHeader, keys [][]byte, allowed bool) error {
	if allowed {
		return nil
	}
	id := msg.Header.Get(HeaderKeyID)
	for _, k := range keys {
		if canonical.KeyID(k) != id {
			continue
		}
		got, err := hex.DecodeString(msg.Header.Get(HeaderMAC))
		if err == nil && hmac.Equal(got, ddlMAC(k, msg.Subject, h, msg.Data)) {
			return nil
		}
		return fmt.Errorf("a schema change of the transaction committed at %v whose signature by key %s does not verify: "+
			"it was changed, or forged, by someone without the key: %w", h.commit, id, siphon.ErrUnauthenticatedSchemaChange)
	}
	why := "not signed"
	if id != "" {
		why = fmt.Sprintf("signed with key %s, which is not among ConsumeConfig.Keys", id)
	}
	return fmt.Errorf("a schema change of the transaction committed at %v %s: "+
		"give the Publisher Config.Key and the consumer ConsumeConfig.Keys, or set ConsumeConfig.UnauthenticatedSchemaChanges "+
		"for a stream only trusted publishers may write: %w", h.commit, why, siphon.ErrUnauthenticatedSchemaChange)
}
