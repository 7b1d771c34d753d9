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

// resumeFixture is a JetStream server with stream RESUME (prefix "r"), a
// Publisher of slot "s" for it, and publish, which stores by hand a
// message of transaction commit: a change, or its marker when end is not
// zero, as the Publisher would.
type resumeFixture struct {
	p       *Publisher
	s       jetstream.Stream
	publish func(commit, end canonical.Position, index int)
	// publishAsync publishes like publish, without waiting for JetStream's
	// answer.
	publishAsync func(commit, end canonical.Position, index int)
}

const resumeSystemID = "7000000000000000001"

func newResumeFixture(t *testing.T) *resumeFixture {
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
	f := &resumeFixture{}
	f.p, err = NewPublisher(nc, Config{Stream: "RESUME", Prefix: "r", Slot: "s"})
	require.NoError(t, err)
	f.s, err = f.p.js.CreateStream(ctx, StreamConfig("RESUME", "r"))
	require.NoError(t, err)
	var seq uint64
	msg := func(commit, end canonical.Position, index int) *nats.Msg {
		m := msgHeader{systemID: resumeSystemID, slot: "s", xid: uint32(commit), commit: commit, index: index, end: end, count: index}
		txh := newTxHeader(&m)
		subject := TableSubject("r", canonical.TableName{Schema: "public", Name: "items"})
		if end != 0 {
			subject = CommitSubject("r")
		}
		h := txh.header(&m, end != 0, seq)
		seq++
		return &nats.Msg{Subject: subject, Data: []byte("{}"), Header: h}
	}
	f.publish = func(commit, end canonical.Position, index int) {
		t.Helper()
		m := msg(commit, end, index)
		ack, err := f.p.js.PublishMsg(ctx, m)
		require.NoError(t, err)
		require.Equal(t, seq, ack.Sequence)
	}
	f.publishAsync = func(commit, end canonical.Position, index int) {
		t.Helper()
		_, err := f.p.js.PublishMsgAsync(msg(commit, end, index))
		require.NoError(t, err)
	}
	return f
}

// resumeFrom runs an attempt's resumeFrom on s.
func (f *resumeFixture) resumeFrom(t *testing.T, s jetstream.Stream) (canonical.Position, *attempt) {
	t.Helper()
	a := f.p.newAttempt(context.Background(), resumeSystemID)
	from, err := a.resumeFrom(s)
	require.NoError(t, err)
	return from, a
}

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
	f := newResumeFixture(t)
	f.publish(0x100, 0, 0)
	f.publish(0x100, 0x110, 1) // transaction 1, ending at 0/110
	f.publish(0x200, 0, 0)     // transaction 2's change

	from, a := f.resumeFrom(t, f.s)
	require.Equal(t, canonical.Position(0x110), from, "streams from transaction 1's end")
	require.Equal(t, msgKey{0x200, 0}, a.held, "holds transaction 2's change")
	require.Equal(t, uint64(3), a.seq)

	from, a = f.resumeFrom(t, &growingStream{Stream: f.s, arriving: func() { f.publish(0x200, 0x210, 1) }})
	require.Equal(t, canonical.Position(0x210), from, "streams from transaction 2's end")
	require.Equal(t, msgKey{0x200, 1}, a.held, "holds transaction 2's marker")
	require.Equal(t, uint64(4), a.seq, "its next message is stored after the marker")
}

// TestResumeWaitsForMessagesOnTheirWay: messages sent before an attempt
// starts (an earlier attempt's, JetStream's answer not yet come) are in
// what the attempt reads, each time.
func TestResumeWaitsForMessagesOnTheirWay(t *testing.T) {
	f := newResumeFixture(t)
	for i := range 5000 {
		commit := canonical.Position(0x1000 * (i + 1))
		f.publishAsync(commit, commit+0x10, 0)
		a := f.p.newAttempt(context.Background(), resumeSystemID)
		from, err := a.resume()
		require.NoError(t, err)
		require.Equal(t, commit+0x10, from, "transaction %d", i)
		require.Equal(t, uint64(i+1), a.seq, "transaction %d", i)
	}
}
