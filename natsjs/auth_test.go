package natsjs_test

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/siphondb/siphon"
	"github.com/siphondb/siphon/canonical"
	"github.com/siphondb/siphon/natsjs"
)

// forgeDDL publishes a transaction into a stream with prefix, as anyone
// who may publish on its subjects can: a schema change on <prefix>.ddl
// (with the headers sign returns for its body), then its commit marker.
func forgeDDL(t *testing.T, js jetstream.JetStream, prefix string, sign func(data []byte) nats.Header) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const systemID, slot = "7300000000000000024", "forged"
	commit, now := canonical.Position(0x5000), forgedTime
	ddl := &canonical.Change{Op: canonical.OpDDL, XID: 999, Position: commit - 0x10, DDL: &canonical.DDL{Tag: "COPY",
		Statement: "COPY (SELECT 1) TO PROGRAM 'touch /tmp/pwned'", SearchPath: "public"}}
	done := &canonical.Change{Op: canonical.OpCommit, XID: 999, Position: commit + 0x30, CommitTime: now}
	for i, m := range []struct {
		subject string
		ch      *canonical.Change
	}{{natsjs.DDLSubject(prefix), ddl}, {natsjs.CommitSubject(prefix), done}} {
		data, err := canonical.AppendChange(nil, m.ch)
		require.NoError(t, err)
		h := nats.Header{}
		h.Set(nats.MsgIdHdr, natsjs.MsgID(systemID, slot, commit, i))
		h.Set(natsjs.HeaderSystemID, systemID)
		h.Set(natsjs.HeaderSlot, slot)
		h.Set(natsjs.HeaderXID, "999")
		h.Set(natsjs.HeaderCommit, commit.String())
		h.Set(natsjs.HeaderCommitTime, now.Format(time.RFC3339Nano))
		h.Set(natsjs.HeaderIndex, strconv.Itoa(i))
		if i == 1 {
			h.Set(natsjs.HeaderEnd, done.Position.String())
			h.Set(natsjs.HeaderCount, "1")
			h.Set(natsjs.HeaderPrevEnd, "0/0")
		} else {
			for k, v := range sign(data) {
				h[k] = v
			}
		}
		_, err = js.PublishMsg(ctx, &nats.Msg{Subject: m.subject, Header: h, Data: data})
		require.NoError(t, err)
	}
}

// forgedTime is the commit time of forgeDDL's transaction.
var forgedTime = time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)

// TestConsumeRefusesUnsignedSchemaChanges: schema changes a Publisher
// signed with its key are delivered to a consumer holding the key (among
// others: rotation); one without the key, or with another, stops at the
// first with an error wrapping siphon.ErrUnauthenticatedSchemaChange,
// having delivered nothing of that transaction past its begin, unless it
// opted in. A schema change forged on <prefix>.ddl by someone who may
// publish there (unsigned, claiming the key with a made-up MAC, signed
// with another key, or signed for another place) is never delivered, nor
// its commit; the same message signed with the key is.
func TestConsumeRefusesUnsignedSchemaChanges(t *testing.T) {
	t.Parallel()
	other := bytes.Repeat([]byte{1}, 32)
	s, changes := publishWork(t)
	end := changes[len(changes)-1].Position
	all := throughStream(changes, nil)
	require.True(t, containsDDL(all), "the workload has a schema change")

	got, _ := consumeUntil(t, s, natsjs.ConsumeConfig{Prefix: "c", Keys: [][]byte{other, workKey}}, end)
	assert.Equal(t, all, got, "rotation: the Publisher's key among the consumer's")
	got, _ = consumeUntil(t, s, natsjs.ConsumeConfig{Prefix: "c", UnauthenticatedSchemaChanges: true}, end)
	assert.Equal(t, all, got)
	for name, cfg := range map[string]natsjs.ConsumeConfig{
		"no key":      {Prefix: "c"},
		"another key": {Prefix: "c", Keys: [][]byte{other}},
	} {
		got, err := consumeErr(t, s, cfg)
		require.ErrorIs(t, err, siphon.ErrUnauthenticatedSchemaChange, name)
		var me *natsjs.MessageError
		require.ErrorAs(t, err, &me, name)
		assert.Equal(t, "c.ddl", me.Subject, name)
		assert.False(t, containsDDL(got), name)
		assert.NotEqual(t, canonical.OpCommit, got[len(got)-1].Op, "%s: the refused transaction is not committed", name)
	}

	srv := startNATS(t)
	_, js := connectNATS(t, srv.ClientURL())
	signed := func(key []byte, commit canonical.Position, prefix string) func([]byte) nats.Header {
		return func(data []byte) nats.Header {
			mac := natsjs.SignForTest(key, natsjs.DDLSubject(prefix), "7300000000000000024", "forged", 999, commit, forgedTime, 0, data)
			return nats.Header{natsjs.HeaderKeyID: {canonical.KeyID(key)}, natsjs.HeaderMAC: {mac}}
		}
	}
	for i, forgery := range []struct {
		name string
		sign func([]byte) nats.Header
	}{
		{"unsigned", func([]byte) nats.Header { return nil }},
		{"claims the key", func([]byte) nats.Header {
			return nats.Header{natsjs.HeaderKeyID: {canonical.KeyID(workKey)}, natsjs.HeaderMAC: {strings.Repeat("ab", 32)}}
		}},
		{"signed with another key", signed(other, 0x5000, "f2")},
		{"signed for another place", signed(workKey, 0x4000, "f3")},
		{"signed for another subject", signed(workKey, 0x5000, "c")},
	} {
		prefix := fmt.Sprintf("f%d", i)
		fs := createStream(t, js, "FORGED"+prefix, prefix, 1)
		forgeDDL(t, js, prefix, forgery.sign)
		got, err := consumeErr(t, fs, natsjs.ConsumeConfig{Prefix: prefix, Keys: [][]byte{workKey}})
		require.ErrorIs(t, err, siphon.ErrUnauthenticatedSchemaChange, forgery.name)
		assert.Equal(t, []canonical.Op{canonical.OpBegin}, ops(got), "%s: nothing but the begin delivered", forgery.name)
	}
	fs := createStream(t, js, "SIGNED", "s", 1)
	forgeDDL(t, js, "s", signed(workKey, 0x5000, "s"))
	got, _ = consumeUntil(t, fs, natsjs.ConsumeConfig{Prefix: "s", Keys: [][]byte{workKey}}, 0x5030)
	assert.Equal(t, []canonical.Op{canonical.OpBegin, canonical.OpDDL, canonical.OpCommit}, ops(got), "the same message signed with the key")
}

// consumeErr runs Consume to its error (a minute at most).
func consumeErr(t *testing.T, s jetstream.Stream, cfg natsjs.ConsumeConfig) ([]canonical.Change, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var got []canonical.Change
	_, err := natsjs.Consume(ctx, s, cfg, func(ch canonical.Change) error {
		got = append(got, ch)
		return nil
	})
	require.Error(t, err, "Consume stopped on its own")
	return got, err
}

func containsDDL(changes []canonical.Change) bool {
	for _, ch := range changes {
		if ch.Op == canonical.OpDDL {
			return true
		}
	}
	return false
}

func ops(changes []canonical.Change) []canonical.Op {
	var out []canonical.Op
	for _, ch := range changes {
		out = append(out, ch.Op)
	}
	return out
}
