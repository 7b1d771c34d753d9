package canonical_test

import (
	"bytes"
	"context"
	"fmt"
	"time"

	"github.com/siphondb/siphon/canonical"
)

// Record a change stream once, then replay it into a handler with no
// server: the handler receives what StreamChanges delivered, and a replay
// from the Position a consumer stored resumes with nothing twice.
func ExampleReplay() {
	var recording bytes.Buffer // a file under testdata, in a real test
	rec := canonical.NewRecorder(&recording, 0x1000)
	// Live, the recorder goes between the stream and the handler:
	//	c.StreamChanges(ctx, from, rec.Tee(handler))
	// Here it records hand-made changes.
	cols := []canonical.Column{{Name: "id", Type: "integer"}, {Name: "total", Type: "numeric(12,2)"}}
	at := time.Date(2026, 11, 30, 5, 0, 0, 0, time.UTC)
	for _, ch := range []canonical.Change{
		{Op: canonical.OpBegin, XID: 700, Position: 0x1100, CommitTime: at},
		{Op: canonical.OpInsert, XID: 700, Position: 0x1100, CommitTime: at, Schema: "shop", Table: "orders", Columns: cols,
			New: canonical.Row{canonical.Text("1"), canonical.Text("10.50")}},
		{Op: canonical.OpCommit, XID: 700, Position: 0x1130, CommitTime: at},
		{Op: canonical.OpBegin, XID: 701, Position: 0x1200, CommitTime: at},
		{Op: canonical.OpUpdate, XID: 701, Position: 0x1200, CommitTime: at, Schema: "shop", Table: "orders", Columns: cols,
			New: canonical.Row{canonical.Text("1"), canonical.Text("12.00")}, Old: canonical.Row{canonical.Text("1"), canonical.Text("10.50")}},
		{Op: canonical.OpCommit, XID: 701, Position: 0x1230, CommitTime: at},
	} {
		if err := rec.Emit(ch); err != nil {
			fmt.Println(err)
			return
		}
	}
	if err := rec.Close(); err != nil {
		fmt.Println(err)
		return
	}

	handle := func(ch canonical.Change) error {
		switch ch.Op {
		case canonical.OpBegin, canonical.OpCommit:
			fmt.Println(ch.Op, ch.XID, "at", ch.Position)
		default:
			total, _ := ch.Value("total")
			was, _ := ch.OldValue("total")
			fmt.Printf("  %v %s.%s total %v (was %v)\n", ch.Op, ch.Schema, ch.Table, total, was)
		}
		return nil
	}
	ctx := context.Background()
	resume, err := canonical.Replay(ctx, bytes.NewReader(recording.Bytes()), 0, handle)
	fmt.Println("resume from", resume, err)

	// A consumer that stored 0/1130, the end of the first transaction,
	// gets the second one only.
	resume, err = canonical.Replay(ctx, bytes.NewReader(recording.Bytes()), 0x1130, handle)
	fmt.Println("resume from", resume, err)
	// Output:
	// begin 700 at 0/1100
	//   insert shop.orders total 10.50 (was NULL)
	// commit 700 at 0/1130
	// begin 701 at 0/1200
	//   update shop.orders total 12.00 (was 10.50)
	// commit 701 at 0/1230
	// resume from 0/1230 <nil>
	// begin 701 at 0/1200
	//   update shop.orders total 12.00 (was 10.50)
	// commit 701 at 0/1230
	// resume from 0/1230 <nil>
}

// Hand a snapshot's rows to the handler of the change stream: they arrive
// as one transaction (XID zero) that commits at the snapshot's Position,
// from which the change stream continues.
func ExampleSnapshotChanges() {
	handle := func(ch canonical.Change) error {
		id, _ := ch.Value("id")
		fmt.Println(ch.Op, "xid", ch.XID, "at", ch.Position, id)
		return nil
	}
	orders := &canonical.Table{Schema: "shop", Name: "orders", Columns: []canonical.Column{{Name: "id", Type: "integer"}}}
	sc := canonical.NewSnapshotChanges(0x5000, handle)
	// Live: snap.CopyTables(ctx, schema, siphon.CopyOptions{}, sc.Row)
	for _, id := range []string{"1", "2"} {
		if err := sc.Row(orders, canonical.Row{canonical.Text(id)}); err != nil {
			fmt.Println(err)
			return
		}
	}
	if err := sc.Commit(); err != nil {
		fmt.Println(err)
	}
	// Then: c.StreamChanges(ctx, snap.Position(), handle)
	// Output:
	// begin xid 0 at 0/5000 NULL
	// insert xid 0 at 0/5000 1
	// insert xid 0 at 0/5000 2
	// commit xid 0 at 0/5000 NULL
}
