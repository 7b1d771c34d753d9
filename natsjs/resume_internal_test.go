package natsjs

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/siphondb/siphon/canonical"
)

// growingStream is a stream that, right after its first read of the last
// message, stores the messages of arriving (as an earlier attempt's do
// when they reach JetStream late).
type growingStream struct {
	jetstream.Stream
	arriving func()
}

func (s *growingStream) GetLastMsgForSubject(ctx context.Context, subject string) (*jetstream.RawStreamMsg, error) {
	m, err := s.Stream.GetLastMsgForSubject(ctx, subject)
	if s.arriving != nil {
		s.arriving()
		s.arriving = nil
	}
	return m, err
}

// TestResumeReadsOneStateOfTheStream: the stream ends inside transaction
// 2 when the attempt reads its last message, and transaction 2's marker is
// stored before it reads the last marker. The attempt must not take the
// last message from before the marker and the marker from after it: it
// would stream from transaction 2's end expecting the stream to end at
// the change, so that transaction 3's change would be refused and its
// marker, sent before the refusal came back, stored in the change's place
// (as TestPublisherSurvivesNATSRestart once saw, under load, after NATS
// restarted).
func TestResumeReadsOneStateOfTheStream(t *testing.T) {
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true,
		StoreDir: t.TempDir(), NoLog: true, NoSigs: true})
	require.NoError(t, err)
	srv.Start()
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	require.True(t, srv.ReadyForConnections(10*time.Second))
	nc, err := nats.Connect(srv.ClientURL())
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	ctx := context.Background()
	p, err := NewPublisher(nc, Config{Stream: "RESUME", Prefix: "r", Slot: "s"})
	require.NoError(t, err)
	s, err := p.js.CreateStream(ctx, StreamConfig("RESUME", "r"))
	require.NoError(t, err)

	const systemID = "7000000000000000001"
	var seq uint64
	publish := func(commit, end canonical.Position, index int) {
		t.Helper()
		m := msgHeader{systemID: systemID, slot: "s", xid: uint32(commit), commit: commit, index: index, end: end, count: index}
		txh := newTxHeader(&m)
		subject := TableSubject("r", canonical.TableName{Schema: "public", Name: "items"})
		if end != 0 {
			subject = CommitSubject("r")
		}
		ack, err := p.js.PublishMsg(ctx, &nats.Msg{Subject: subject, Data: []byte("{}"), Header: txh.header(&m, end != 0, seq)})
		require.NoError(t, err)
		seq++
		require.Equal(t, seq, ack.Sequence)
	}
	publish(0x100, 0, 0)
	publish(0x100, 0x110, 1) // transaction 1, ending at 0/110
	publish(0x200, 0, 0)     // transaction 2's change

	read := func(s jetstream.Stream) (canonical.Position, *attempt) {
		t.Helper()
		a := p.newAttempt(ctx, systemID)
		from, err := a.resumeFrom(s)
		require.NoError(t, err)
		return from, a
	}
	from, a := read(s)
	require.Equal(t, canonical.Position(0x110), from, "streams from transaction 1's end")
	require.Equal(t, msgKey{0x200, 0}, a.held, "holds transaction 2's change")
	require.Equal(t, uint64(3), a.seq)

	from, a = read(&growingStream{Stream: s, arriving: func() { publish(0x200, 0x210, 1) }})
	require.Equal(t, canonical.Position(0x210), from, "streams from transaction 2's end")
	require.Equal(t, msgKey{0x200, 1}, a.held, "holds transaction 2's marker")
	require.Equal(t, uint64(4), a.seq, "its next message is stored after the marker")
}
