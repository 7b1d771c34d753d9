package siphon_test

import (
	"context"
	"fmt"

	"github.com/siphondb/siphon"
	"github.com/siphondb/siphon/siphontest"
)

// A base slot pins WAL from the start of a base backup until it is dropped.
// Slots lists siphon's slots for monitoring: alert on WALStatus and
// RetainedBytes before a forgotten slot fills the server's disk.
func ExampleConn_Slots() {
	ctx := context.Background()
	srv, err := siphontest.Launch(ctx) // a throwaway server; use your own DSN
	if err != nil {
		fmt.Println(err)
		return
	}
	defer srv.Close()
	c, err := siphon.Connect(ctx, srv.DSN())
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()

	// While the base backup is taken, a temporary slot of c's pins the WAL:
	// a crashed backup leaves nothing. Capturing the end makes it permanent.
	base, err := c.CreateBaseSlot(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := c.CaptureBaseEnd(ctx, base); err != nil {
		fmt.Println(err)
		return
	}
	slots, err := c.Slots(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, s := range slots {
		if s.WALStatus == "unreserved" || s.WALStatus == "lost" || s.RetainedBytes > 10<<30 {
			fmt.Println("alert:", s.Name, s.WALStatus, s.RetainedBytes)
		}
		fmt.Println(s.Kind, s.WALStatus, s.Active, s.Temporary, s.RestartPosition == base.WALStart)
	}

	// The chain that started with this base is sealed: its slot goes.
	if err := c.DropSlot(ctx, base.Slot); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("dropped")
	// Output:
	// base reserved false false true
	// dropped
}
