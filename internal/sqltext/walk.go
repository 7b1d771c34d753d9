package sqltext

import (
	pg "github.com/pganalyze/pg_query_go/v6"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// nodeName returns the name of the node n holds, as PostgreSQL names
// its type ("CreateStmt", "SelectStmt"...), or "" for an empty node.
func nodeName(n *pg.Node) string {
	m := n.ProtoReflect()
	fd := m.WhichOneof(m.Descriptor().Oneofs().ByName("node"))
	if fd == nil || fd.Message() == nil {
		return ""
	}
	return string(fd.Message().Name())
}

// walk calls visit for every message in the tree under m, m included,
// depth first, until visit returns false.
func walk(m proto.Message, visit func(proto.Message) bool) bool {
	if !visit(m) {
		return false
	}
	more := true
	m.ProtoReflect().Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.Message() == nil:
		case fd.IsList():
			for i := 0; i < v.List().Len() && more; i++ {
				more = walk(v.List().Get(i).Message().Interface(), visit)
			}
		case fd.IsMap():
			// The parse tree has no maps.
		default:
			more = walk(v.Message().Interface(), visit)
		}
		return more
	})
	return more
}
