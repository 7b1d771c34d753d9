package sqltext

import (
	"slices"
	"testing"

	pg "github.com/pganalyze/pg_query_go/v6"
	"github.com/stretchr/testify/assert"
)

// TestNodeNames: every node the tables name is a statement node of the
// parse tree, and none is said both to fire and not to fire.
func TestNodeNames(t *testing.T) {
	t.Parallel()
	oneofs := (&pg.Node{}).ProtoReflect().Descriptor().Oneofs().ByName("node").Fields()
	nodes := map[string]bool{}
	for i := range oneofs.Len() {
		nodes[string(oneofs.Get(i).Message().Name())] = true
	}
	var names []string
	for name := range fixedTags {
		names = append(names, name)
	}
	names = append(names, ddlEventNodes...)
	names = append(names, noDDLEventNodes...)
	names = append(names, roleDependentNodes...)
	for _, name := range names {
		assert.True(t, nodes[name], "%s is not a node", name)
	}
	for _, name := range ddlEventNodes {
		assert.False(t, slices.Contains(noDDLEventNodes, name), name)
	}
}
