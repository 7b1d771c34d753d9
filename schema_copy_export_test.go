package siphon

import "context"

// What the external tests of schema_copy.go need from the inside.

// InitialSchemaForTest returns what Replicate's initial snapshot runs, with
// CopySchema, once each of its snapshots is taken.
func (c *Conn) InitialSchemaForTest(target *Conn) func(context.Context, *Snapshot) error {
	return c.schemaCopier(target, &CopySchemaOptions{})
}
