package canonical

// DDL is a schema change captured on the source, the payload of an
// [OpDDL] change: a statement that created, altered or dropped objects,
// at its place among the row changes of its transaction.
type DDL struct {
	// Tag is the statement's command tag, for example "ALTER TABLE".
	Tag string
	// Statement is the SQL the target runs to make the same change: one
	// statement, as the source ran it (taken out of a multi-statement
	// query, or out of the function or DO block it ran in), with
	// CONCURRENTLY left out where it cannot run in a transaction.
	Statement string
	// SearchPath is the source's effective schemas (current_schemas(false)),
	// each quoted, comma-separated: "$user" expanded on the source. Empty:
	// run with pg_catalog only.
	SearchPath string
	// Role is the role that ran the statement (current_user at the DDL;
	// the identity to replay under).
	Role string
	// SessionRole is session_user (who logged in; trust is decided on it).
	SessionRole string
	// Superuser: SessionRole was a superuser on the source when the
	// statement ran.
	Superuser bool
	// Installer: the role that installed the capture (trusted by default).
	Installer string
	// Problem, when set, says why the statement cannot be replayed with
	// certainty (see SECURITY.md): Statement then holds the query the
	// source ran, for information (or nothing, where it may carry a
	// secret), and an apply stops there.
	Problem string
	// Objects lists what the statement created, altered or dropped, as
	// PostgreSQL identifies them (pg_event_trigger_ddl_commands and
	// pg_event_trigger_dropped_objects): for information, the target does
	// not need them.
	Objects []DDLObject
}

// DDLObject is one object a schema change touched.
type DDLObject struct {
	// Type is the object's kind as PostgreSQL names it: "table", "index",
	// "table column", "type", "sequence"...
	Type string
	// Identity is the object's qualified identity, for example
	// "public.orders" or "public.orders.status".
	Identity string
	// Dropped is true for an object the statement dropped.
	Dropped bool
}

// Sequence is the state of a source sequence, as a [RecordSequence]
// carries it: what pg_sequences shows as last_value, and whether nextval
// has been called since the sequence was created or reset (setval's
// is_called). A snapshot carries every sequence's state read at or after
// its Position, an incremental the state read at or after its end: never
// behind the keys the rows before it used.
type Sequence struct {
	Schema string
	Name   string
	// Value is the sequence's last_value.
	Value int64
	// Called is setval's is_called: the next value is Value plus the
	// increment when true, Value itself when false.
	Called bool
}

// TableName returns the sequence's schema and name.
func (s *Sequence) TableName() TableName { return TableName{Schema: s.Schema, Name: s.Name} }
