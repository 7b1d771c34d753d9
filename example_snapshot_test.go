package siphon_test

import (
	"bytes"
	"context"
	"fmt"
	"io"

	"github.com/jackc/pgx/v5"

	"github.com/siphondb/siphon"
	"github.com/siphondb/siphon/canonical"
	"github.com/siphondb/siphon/siphontest"
)

// A Snapshot shows the database at an exact Position. Copy its tables (in
// parallel sessions, each row as canonical text), hand its Name to pg_dump
// --snapshot, then stream changes from its Position to continue it with no
// gap and no duplicate.
func ExampleSnapshot_CopyTables() {
	ctx := context.Background()
	srv, err := siphontest.Launch(ctx) // a throwaway server; use your own DSN
	if err != nil {
		fmt.Println(err)
		return
	}
	defer srv.Close()
	if err := exampleTables(ctx, srv.DSN()); err != nil {
		fmt.Println(err)
		return
	}
	c, err := siphon.Connect(ctx, srv.DSN(), siphon.WithProgress(func(p siphon.Progress) {
		if p.Done {
			fmt.Println("copied", p.Table, p.Rows, "rows")
		}
	}))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	schema, err := c.InspectSchema(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}

	snap, err := c.TakeSnapshot(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer snap.Close(ctx)
	// Rows arrive on this goroutine, one at a time.
	err = snap.CopyTables(ctx, schema, siphon.CopyOptions{}, func(t *canonical.Table, row canonical.Row) error {
		fmt.Println(t.Name, row)
		return nil
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("stream from the snapshot's position:", snap.Position() != 0)
	// Output:
	// orders [1 2024-05-01 10:00:00+00 19.90 t {"sku": "A-1"}]
	// orders [2 2024-05-02 11:30:00.5+00 NaN f NULL]
	// copied public.orders 2 rows
	// stream from the snapshot's position: true
}

// EmitCanonical writes a snapshot as canonical JSONL: a header carrying the
// Position, the table records, the rows, and an end record.
func ExampleConn_EmitCanonical() {
	ctx := context.Background()
	srv, err := siphontest.Launch(ctx) // a throwaway server; use your own DSN
	if err != nil {
		fmt.Println(err)
		return
	}
	defer srv.Close()
	if err := exampleTables(ctx, srv.DSN()); err != nil {
		fmt.Println(err)
		return
	}
	c, err := siphon.Connect(ctx, srv.DSN())
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()

	var out bytes.Buffer
	pos, err := c.EmitCanonical(ctx, nil, &out) // nil: every published table
	if err != nil {
		fmt.Println(err)
		return
	}
	dec := canonical.NewDecoder(&out)
	h, err := dec.Header()
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(h.Kind, h.Start == pos)
	for {
		rec, err := dec.Next()
		if err == io.EOF {
			break
		} else if err != nil {
			fmt.Println(err)
			return
		}
		switch rec.Type {
		case canonical.RecordTable:
			fmt.Println("table", rec.TableName(), len(rec.Table.Columns), "columns")
		case canonical.RecordRow:
			fmt.Println("row", rec.Row)
		case canonical.RecordEnd:
			fmt.Println("end", rec.Position == pos)
		}
	}
	// Output:
	// snapshot true
	// table public.orders 5 columns
	// row [1 2024-05-01 10:00:00+00 19.90 t {"sku": "A-1"}]
	// row [2 2024-05-02 11:30:00.5+00 NaN f NULL]
	// end true
}

func exampleTables(ctx context.Context, dsn string) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, `
CREATE TABLE orders (id int PRIMARY KEY, placed timestamptz, total numeric(10,2), paid boolean, details jsonb);
INSERT INTO orders VALUES (1, '2024-05-01 10:00Z', 19.90, true, '{"sku": "A-1"}'),
                          (2, '2024-05-02 11:30:00.5Z', 'NaN', false, NULL)`)
	return err
}
