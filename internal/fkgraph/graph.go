// Package fkgraph orders tables by their foreign keys: referenced tables
// before the tables that reference them, so that rows loaded in that order
// pass foreign-key checks. It is pure: the caller reads the edges from the
// catalog.
package fkgraph

import (
	"slices"

	"github.com/siphondb/siphon/canonical"
)

// Edge is one foreign key: Child references Parent.
type Edge struct {
	Child, Parent canonical.TableName
	Constraint    string
	// Deferrable is true for a DEFERRABLE constraint, which a transaction
	// can have checked at its commit.
	Deferrable bool
}

// Order returns tables with every table after the tables it references,
// keeping the given order wherever the foreign keys allow. References to a
// table's own rows, and to tables not in tables, do not constrain the
// order; tables in a cycle keep their given order among themselves (no
// order satisfies a cycle).
func Order(tables []canonical.TableName, edges []Edge) []canonical.TableName {
	index := make(map[canonical.TableName]int, len(tables))
	for i, t := range tables {
		index[t] = i
	}
	parents := make([][]int, len(tables))
	for _, e := range edges {
		c, okC := index[e.Child]
		p, okP := index[e.Parent]
		if okC && okP && c != p {
			parents[c] = append(parents[c], p)
		}
	}
	// Depth-first, parents first, visiting tables in their given order: a
	// table already on the path (a cycle) is not waited for.
	const (
		unseen = iota
		onPath
		placed
	)
	state := make([]int, len(tables))
	out := make([]canonical.TableName, 0, len(tables))
	var visit func(i int)
	visit = func(i int) {
		if state[i] != unseen {
			return
		}
		state[i] = onPath
		ps := slices.Clone(parents[i])
		slices.Sort(ps)
		for _, p := range ps {
			visit(p)
		}
		state[i] = placed
		out = append(out, tables[i])
	}
	for i := range tables {
		visit(i)
	}
	return out
}

// Backward returns the first edge (in edges' order) whose child comes
// before its parent in order, and whether there is one. Edges from a table
// to itself, or with an end not in order, are not backward.
func Backward(order []canonical.TableName, edges []Edge) (Edge, bool) {
	pos := make(map[canonical.TableName]int, len(order))
	for i, t := range order {
		pos[t] = i
	}
	for _, e := range edges {
		c, okC := pos[e.Child]
		p, okP := pos[e.Parent]
		if okC && okP && c < p {
			return e, true
		}
	}
	return Edge{}, false
}

// Path returns a chain of references that leads from one table to another
// (from references the first table of the chain, ... the last references
// to), or nil when there is none.
func Path(edges []Edge, from, to canonical.TableName) []Edge {
	seen := map[canonical.TableName]bool{from: true}
	var walk func(at canonical.TableName) []Edge
	walk = func(at canonical.TableName) []Edge {
		for _, e := range edges {
			if e.Child != at || e.Parent == e.Child || seen[e.Parent] {
				continue
			}
			if e.Parent == to {
				return []Edge{e}
			}
			seen[e.Parent] = true
			if rest := walk(e.Parent); rest != nil {
				return append([]Edge{e}, rest...)
			}
		}
		return nil
	}
	return walk(from)
}
