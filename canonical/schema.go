package canonical

// Schema describes the tables a snapshot, stream or backup covers.
type Schema struct {
	Tables []Table `json:"tables"`
}

// Table finds a table by schema and name. It returns nil when there is none.
func (s *Schema) Table(schema, name string) *Table {
	if s == nil {
		return nil
	}
	for i := range s.Tables {
		if s.Tables[i].Schema == schema && s.Tables[i].Name == name {
			return &s.Tables[i]
		}
	}
	return nil
}

// ReplicaIdentity says which old values the source logs for updates and
// deletes of a table (PostgreSQL's REPLICA IDENTITY).
type ReplicaIdentity string

// The replica identities PostgreSQL knows.
const (
	IdentityDefault ReplicaIdentity = "default" // the primary key, if any
	IdentityIndex   ReplicaIdentity = "index"   // the columns of a chosen unique index
	IdentityFull    ReplicaIdentity = "full"    // every column
	IdentityNothing ReplicaIdentity = "nothing" // no old values at all
)

// Table describes one table.
type Table struct {
	Schema  string   `json:"schema"`
	Name    string   `json:"name"`
	Columns []Column `json:"columns"`
	// PrimaryKey lists the primary key's column names in key order; empty when
	// the table has none.
	PrimaryKey []string `json:"primary_key,omitempty"`
	// IdentityKey lists the columns that identify a row in old values: the
	// primary key, the replica identity index's columns, or nothing.
	IdentityKey     []string        `json:"identity_key,omitempty"`
	ReplicaIdentity ReplicaIdentity `json:"replica_identity,omitempty"`
	// Partitioned is true for a partitioned parent, which holds no rows itself.
	Partitioned bool `json:"partitioned,omitempty"`
	// PartitionOf names the parent of a partition; nil for other tables.
	PartitionOf *TableName `json:"partition_of,omitempty"`
}

// TableName names a table by schema and name.
type TableName struct {
	Schema string `json:"schema"`
	Name   string `json:"name"`
}

// String returns "schema.name", unquoted, for messages.
func (n TableName) String() string { return n.Schema + "." + n.Name }

// TableName returns the table's schema and name.
func (t *Table) TableName() TableName { return TableName{Schema: t.Schema, Name: t.Name} }

// Column describes one column of a table.
type Column struct {
	Name string `json:"name"`
	// Type is the column's SQL type as the source prints it, with modifiers,
	// for example "numeric(12,2)" or "public.mood".
	Type string `json:"type"`
	// TypeOID is the source's type OID (PostgreSQL-specific, informative).
	TypeOID  uint32 `json:"type_oid,omitempty"`
	Nullable bool   `json:"nullable"`
	// Default is true when the source column has a default, an identity or
	// a value for the rows that existed when it was added: those rows may
	// hold values other than NULL. Set in change streams' table records; an
	// apply that adds a column the target lacks does so only without it.
	Default bool `json:"default,omitempty"`
}

// ColumnIndex returns the position of the named column, or -1.
func (t *Table) ColumnIndex(name string) int {
	for i := range t.Columns {
		if t.Columns[i].Name == name {
			return i
		}
	}
	return -1
}
