// Package natsjs carries a siphon change stream through NATS JetStream, for
// consumers that outgrow one process reading one replication slot: many
// services reacting to the same changes, replays for new consumers,
// consumers in other regions. A [Publisher] streams a slot into a
// JetStream stream (replicated, clustered, deduplicated by message id);
// [Consume] reads the stream back as the same change stream, whole
// transactions in commit order. The root package siphon does not depend on
// NATS; this one does (github.com/nats-io/nats.go).
//
//	nc, _ := nats.Connect(url)
//	js, _ := jetstream.New(nc)
//	_, err := js.CreateOrUpdateStream(ctx, natsjs.StreamConfig("SHOP", "shop"))
//	pub, _ := natsjs.NewPublisher(nc, natsjs.Config{Stream: "SHOP", Prefix: "shop", Slot: "shop_cdc"})
//	last, err := pub.Run(ctx, dsn)                 // until ctx is cancelled
//
//	stream, _ := js.Stream(ctx, "SHOP")            // elsewhere, any number of times
//	_, err = natsjs.Consume(ctx, stream, natsjs.ConsumeConfig{Prefix: "shop", After: stored},
//		func(ch canonical.Change) error { ... })  // as StreamChanges' emit
//
// # Messages
//
// One stream per slot, capturing Prefix+".>" (see [StreamConfig]), written
// by that slot's Publisher alone. Each change is one message (or travels
// with its neighbours in one: see Messages of several changes below):
//
//   - an insert, update or delete on <prefix>.<schema>.<table> (see
//     [TableSubject]);
//   - a TRUNCATE as one message per truncated table, on that table's
//     subject, each the truncation of that table alone (with the
//     statement's CASCADE and RESTART IDENTITY);
//   - a transactional logical decoding message (pg_logical_emit_message
//     with transactional true) on <prefix>.message ([MessageSubject]);
//   - a schema change ([canonical.OpDDL]) on <prefix>.ddl ([DDLSubject]);
//   - after a transaction's changes, a commit marker on <prefix>.commit
//     ([CommitSubject]).
//
// Non-transactional logical decoding messages are not published: they
// belong to no transaction and have no commit Position to order and
// deduplicate them by. Every transaction the slot delivers gets its marker,
// even one with nothing else to publish (PostgreSQL sends none for a
// transaction that changed no published table), so the stream's last
// marker is never behind the slot.
//
// A message's body is the change as canonical JSONL (see
// [canonical.AppendChange]): the lines a siphon JSONL stream holds for it,
// that is, for a row change, the table record giving its columns and the
// change record; for a marker, the commit record, whose "position" is the
// transaction's end Position. So each message reads on its own with
// [canonical.ParseChange]. Its headers: Nats-Msg-Id (see [MsgID]),
// [HeaderSystemID], [HeaderSlot], [HeaderXID], [HeaderCommit] (the commit
// Position), [HeaderCommitTime], [HeaderIndex] (its place in the
// transaction), [HeaderChanges] on a message of several changes, and on a
// marker [HeaderEnd], [HeaderCount] and [HeaderPrevEnd].
//
// Subject tokens are names escaped reversibly ([SubjectToken]): ASCII
// letters, digits, '-' and '_' stand for themselves, every other byte is
// '%' and two upper-case hexadecimal digits, so any table name (quotes,
// spaces, dots, Unicode) makes a valid subject, public."Order Items" is
// <prefix>.public.Order%20Items, and a table's subject never collides with
// another's or with commit and message, which have one token where tables
// have two. <prefix>.*.* reads every table, <prefix>.> everything.
//
// # Messages of several changes
//
// A Publisher's work, and JetStream's, goes by the message: a message per
// change makes a transaction of many rows cost as many messages, stored
// and acknowledged one by one. With [Config].MaxChangesPerMessage above
// one, consecutive changes of a transaction on the same subject (the rows
// a statement writes to one table, say) travel together in one message of
// up to that many changes, split where a message would pass the largest
// the server and the stream take (max_payload, MaxMsgSize); schema changes
// and commit markers are always messages of their own. Such a message
// carries [HeaderChanges], the number of changes it holds, and
// [HeaderIndex] and its Nats-Msg-Id name its first change. Its body is
// the records a siphon JSONL stream holds for its changes: a row change's
// table record comes before it when it is not the last table record of
// the message (so a run of rows of one table has one), then each change
// record, one a line. The message still reads on its own, and a consumer
// of some tables still receives only theirs. [Consume] reads such a
// message whole, and refuses one a Publisher does not write, before
// delivering any of its changes. Code that reads the messages itself must
// know this form: upgrade the consumers before the Publishers.
//
// # Ordering
//
// The stream holds the messages in commit order: the transactions in the
// order of their commits, each transaction's messages in the order of its
// changes, then its marker, the transactions never interleaved. So the
// stream sequence is the global commit order across all subjects, and on
// any one subject (or set of subjects read by one consumer) the messages
// are in commit order too. Consumers that read in parallel (several pull
// consumers sharing a durable, a work queue) give up that order across
// their messages, as with any JetStream stream.
//
// # Transactions
//
// Every message of a transaction carries its commit Position and its index
// (that of its first change, counting the transaction's changes 0, 1, 2,
// ...), and the marker comes last, with the number of changes before it. A consumer that reads only some subjects recognises a
// transaction's end by its marker, even when the transaction changed none
// of its tables: it filters on its tables' subjects and <prefix>.commit.
// [Consume] does this and delivers OpBegin, the changes, OpCommit, as
// siphon.Conn.StreamChanges does; reading every subject it also checks
// that each transaction is whole.
//
// # Schema changes are signed
//
// A schema change is code: a consumer that applies it runs its statement,
// and anyone who may publish on the stream's subjects could publish one on
// <prefix>.ddl (or any subject). So a Publisher given a key ([Config].Key,
// 32 random bytes or more) signs every schema change message: [HeaderKeyID]
// names the key ([canonical.KeyID]) and [HeaderMAC] holds an HMAC-SHA-256
// over its subject, its place (system identifier, slot, commit Position,
// index) and transaction, and its body. [Consume] delivers a schema change
// only when it is signed with one of [ConsumeConfig].Keys (the
// Publisher's key, and previous ones while keys rotate); any other stops
// it with a [*MessageError] wrapping siphon.ErrUnauthenticatedSchemaChange,
// before the schema change or its transaction's commit is delivered,
// unless [ConsumeConfig].UnauthenticatedSchemaChanges says every publisher
// on the stream is trusted. Row changes are not signed: they are data, and
// an apply binds them as parameters; restrict who may publish on the
// stream's subjects with NATS permissions.
//
// # Exactly once
//
// The slot is acknowledged to a transaction's end only once JetStream has
// acknowledged every one of its messages, its commit marker last: they
// are published asynchronously, at most Config.MaxPending (and
// Config.MaxPendingBytes) unacknowledged at a time, so memory stays
// bounded however large a transaction is. The acknowledgements are
// awaited in order beside the publishing, which goes on into the next
// transactions meanwhile; the slot learns what is stored through
// siphon.StreamOptions.Durable, every status interval. (When Run stops,
// the acknowledgements still on their way are not awaited: the slot may
// then stand up to Config.MaxPending messages behind what the stream
// holds, which the next Run reads again and does not publish twice.)
//
// Each message expects the stream's last sequence to be the one before it
// (Nats-Expected-Last-Sequence): if one is lost (a leader change, a node
// stopped, a connection cut), every later one is refused, so the stream
// never holds a gap or a reordering.
//
// A Publisher (re)starts from what the stream holds, not from a position
// kept elsewhere: after the last transaction whose marker it holds, and,
// when the stream ends inside a transaction (a publisher killed half way
// through), it streams that transaction again without publishing the
// changes the stream holds of it (by their index, so this holds even when
// MaxChangesPerMessage changed in between). The Nats-Msg-Id, derived from the
// system identifier, the slot, the commit Position and the index, is the
// same each time a transaction is read, so JetStream also drops a message
// it already holds when one is sent twice (an acknowledgement lost, a
// straggler from a stopped attempt), but only within the stream's
// duplicate window (Duplicates, two minutes by default): a replay of
// messages older than that would be stored twice. A message JetStream
// answers as a duplicate counts as stored only when the message the stream
// holds under its ID is the same (subject, siphon's headers, data): the ID
// names a message's first change, and a stopped process's message cut
// differently (another MaxChangesPerMessage) is a failure the next
// attempt resumes from, never taken for this one. Resuming from the
// stream's own last message is what keeps the Publisher independent of
// the window, whatever time passes between a crash and the restart.
// Before it reads where the stream stands, a Publisher waits until the
// stream has handled every message it sent before (an earlier attempt's,
// still in the NATS client's buffers or JetStream's queue after a
// reconnection): it sends an empty message on <prefix>.commit that the
// stream refuses (it expects a last sequence no stream reaches) and waits
// for the refusal. The stream never stores it; a core NATS subscriber of
// <prefix>.commit receives it, and should read the stream instead.
//
// No commit waits for its acknowledgements, so a workload of small
// transactions is not bound by the round trip to the stream's leader: what
// bounds a Publisher is the work per message, which MaxChangesPerMessage
// divides for large transactions (docs/performance.md in the repository
// has the figures).
//
// On the consuming side, a consumer that records the end Position of the
// last transaction it handled, and resumes with it ([ConsumeConfig.After]),
// handles each transaction once, exactly as with StreamChanges. The
// stream's retention (MaxAge, MaxMsgs, MaxBytes) bounds how long a consumer
// may stay away: one resuming after a Position older than what the stream
// still holds gets a [*HistoryGapError] (each marker names the end of the
// transaction before it, so Consume can tell), never a silent skip.
//
// # Tested on a real cluster
//
// TestClusterSurvivesKillsAndNodeLoss runs three nats-server nodes (in the
// test process, on loopback ports) with a stream of three replicas; while a
// workload commits, the publisher, a child process, is SIGKILLed several
// times (some kills inside a transaction, inside a message of several
// changes), and the stream's leader node is stopped and started again while
// it publishes. The stream then holds every change exactly once in commit
// order, checked message by message against a second slot read directly,
// and a consumer started afterwards replays it all. NATSJS_CLUSTER_KILLS
// sets the number of kills.
package natsjs
