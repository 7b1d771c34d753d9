package fkgraph

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/siphondb/siphon/canonical"
)

func tn(name string) canonical.TableName { return canonical.TableName{Schema: "public", Name: name} }

func names(ts []canonical.TableName) []string {
	out := make([]string, len(ts))
	for i, t := range ts {
		out[i] = t.Name
	}
	return out
}

func TestOrderPutsParentsFirst(t *testing.T) {
	tables := []canonical.TableName{tn("a_lines"), tn("b_orders"), tn("c_customers"), tn("d_free")}
	edges := []Edge{
		{Child: tn("a_lines"), Parent: tn("b_orders")},
		{Child: tn("b_orders"), Parent: tn("c_customers")},
		{Child: tn("c_customers"), Parent: tn("c_customers")}, // self-reference
		{Child: tn("a_lines"), Parent: tn("elsewhere")},       // not loaded
	}
	assert.Equal(t, []string{"c_customers", "b_orders", "a_lines", "d_free"}, names(Order(tables, edges)))
	_, back := Backward(Order(tables, edges), edges)
	assert.False(t, back)
	e, back := Backward(tables, edges)
	assert.True(t, back)
	assert.Equal(t, tn("a_lines"), e.Child)
}

func TestOrderKeepsTheGivenOrderWithoutReferences(t *testing.T) {
	tables := []canonical.TableName{tn("z"), tn("y"), tn("x")}
	assert.Equal(t, []string{"z", "y", "x"}, names(Order(tables, nil)))
}

func TestCycles(t *testing.T) {
	tables := []canonical.TableName{tn("a"), tn("b"), tn("c")}
	edges := []Edge{
		{Child: tn("a"), Parent: tn("b"), Constraint: "a_b"},
		{Child: tn("b"), Parent: tn("c"), Constraint: "b_c"},
		{Child: tn("c"), Parent: tn("a"), Constraint: "c_a"},
	}
	order := Order(tables, edges)
	assert.Len(t, order, 3, "every table is placed once")
	e, back := Backward(order, edges)
	assert.True(t, back, "no order satisfies a cycle")
	path := Path(edges, e.Parent, e.Child)
	if assert.NotEmpty(t, path) {
		assert.Equal(t, e.Parent, path[0].Child)
		assert.Equal(t, e.Child, path[len(path)-1].Parent)
	}
	assert.Nil(t, Path(edges[:1], tn("b"), tn("a")), "no way back without the rest of the cycle")
}
