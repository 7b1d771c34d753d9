package canonical

// OldValue returns the old value of the named column, from the old row of
// an update or delete, and whether the change holds one: false when the
// change has no old row (an insert, or an update the source sent without
// old values) or no such column.
//
// Which old values the source sends depends on the table's replica
// identity (see [Table].ReplicaIdentity): under FULL, every column's;
// under DEFAULT or INDEX, only the identity key's, and only when an update
// changed the key (a delete always sends them), the other columns of the
// old row being NULL. A NULL old value is therefore only a NULL under FULL;
// otherwise it may just not have been sent.
func (c *Change) OldValue(column string) (Value, bool) {
	if c.Old == nil {
		return Value{}, false
	}
	for i := range c.Columns {
		if c.Columns[i].Name == column && i < len(c.Old) {
			return c.Old[i], true
		}
	}
	return Value{}, false
}
