package siphon

import (
	"slices"
	"strconv"
	"strings"

	"github.com/siphondb/siphon/canonical"
)

// CTID is a row version's physical location in its table's current file (a
// relfilenode): a heap block and a line pointer. Copies read tables in CTID
// order, so a CTID marks how far a copy has come. CTIDs mean nothing across
// a table rewrite (VACUUM FULL, CLUSTER, TRUNCATE, a rewriting ALTER TABLE).
type CTID struct {
	Block  uint32
	Offset uint16
}

// maxCTID is past every real row version: it stands for "the end of the
// table".
var maxCTID = CTID{Block: 1<<32 - 1}

// String prints c as PostgreSQL's tid literal, "(block,offset)".
func (c CTID) String() string {
	return "(" + strconv.FormatUint(uint64(c.Block), 10) + "," + strconv.FormatUint(uint64(c.Offset), 10) + ")"
}

// MarshalText implements [encoding.TextMarshaler] with [CTID.String].
func (c CTID) MarshalText() ([]byte, error) { return []byte(c.String()), nil }

// UnmarshalText implements [encoding.TextUnmarshaler]: it reads "(block,offset)".
func (c *CTID) UnmarshalText(text []byte) error {
	s := string(text)
	inner, ok := strings.CutPrefix(s, "(")
	if inner, ok2 := strings.CutSuffix(inner, ")"); ok && ok2 {
		if b, o, ok := strings.Cut(inner, ","); ok {
			block, err1 := strconv.ParseUint(b, 10, 32)
			off, err2 := strconv.ParseUint(o, 10, 16)
			if err1 == nil && err2 == nil {
				*c = CTID{Block: uint32(block), Offset: uint16(off)}
				return nil
			}
		}
	}
	return errorf("siphon: %q is not a ctid (block,offset)", s)
}

func (c CTID) less(d CTID) bool {
	return c.Block < d.Block || (c.Block == d.Block && c.Offset < d.Offset)
}

// next returns the smallest CTID after c.
func (c CTID) next() CTID {
	if c.Offset == 1<<16-1 {
		return CTID{Block: c.Block + 1}
	}
	return CTID{Block: c.Block, Offset: c.Offset + 1}
}

// CTIDRange is the half-open range of row locations [From, To). A To of
// (4294967295,0) means "to the end of the table".
type CTIDRange struct {
	From CTID `json:"from"`
	To   CTID `json:"to"`
}

// CopyCheckpoint records how far a copy ([Snapshot.CopyTables]) has come:
// for each relation it reads, which ranges of rows were passed to the
// RowFunc. It marshals to JSON; persist it with the rows it covers and pass
// it as [CopyOptions].Resume to continue an interrupted copy.
//
// Once the copy is complete, stream changes from Position (the earliest of
// the tables' Positions) and skip those that [CopyCheckpoint.Covers].
type CopyCheckpoint struct {
	// Position is where the change stream must start so that every copied
	// row is brought up to date: the earliest Position of Tables.
	Position canonical.Position `json:"position"`
	Tables   []TableCheckpoint  `json:"tables"`
}

// TableCheckpoint records the copy of one relation: a table, or a leaf
// partition whose rows are delivered under a partitioned table.
type TableCheckpoint struct {
	// Table is the table of the schema the rows are delivered as.
	Table canonical.TableName `json:"table"`
	// Relation is the relation the rows are read from: Table itself, or one
	// of its leaf partitions.
	Relation canonical.TableName `json:"relation"`
	// Position is the Position of the snapshot the relation's copy started
	// in: the copied rows reflect every transaction committed before it.
	Position canonical.Position `json:"position"`
	// Relfilenode is the relation's file when its copy started; Copied ranges
	// locate rows in that file.
	Relfilenode uint32 `json:"relfilenode"`
	// TOASTEmpty is true when the relation had no out-of-line (TOAST) values
	// when its copy started, a condition for resuming it.
	TOASTEmpty bool `json:"toast_empty"`
	// Copied lists the row ranges already delivered, sorted, not
	// overlapping.
	Copied []CTIDRange `json:"copied,omitempty"`
	// Done is true once every row of the relation was delivered.
	Done bool `json:"done,omitempty"`
}

// Covers reports whether the copied rows of relation (a table or leaf
// partition, as the change stream names it) already reflect a transaction
// that committed at commit, the Position a row change or truncate carries.
// Apply a streamed change only when Covers is false. It is true only for
// relations whose copy restarted in a later snapshot than the checkpoint's
// Position. A partitioned table the stream names itself
// ([WithPartitionRoots]), whose rows were copied from its partitions, is
// covered only when the copy of every one of them is.
func (cp *CopyCheckpoint) Covers(relation canonical.TableName, commit canonical.Position) bool {
	for i := range cp.Tables {
		if cp.Tables[i].Relation == relation {
			return commit < cp.Tables[i].Position
		}
	}
	covered := false
	for i := range cp.Tables {
		if cp.Tables[i].Table == relation {
			if commit >= cp.Tables[i].Position {
				return false
			}
			covered = true
		}
	}
	return covered
}

// clone copies t deeply.
func (t TableCheckpoint) clone() TableCheckpoint {
	t.Copied = slices.Clone(t.Copied)
	return t
}

// addRange merges r into the sorted, disjoint ranges rs.
func addRange(rs []CTIDRange, r CTIDRange) []CTIDRange {
	if !r.From.less(r.To) {
		return rs
	}
	i := 0
	for i < len(rs) && rs[i].To.less(r.From) {
		i++
	}
	j := i
	for j < len(rs) && !r.To.less(rs[j].From) {
		if rs[j].From.less(r.From) {
			r.From = rs[j].From
		}
		if r.To.less(rs[j].To) {
			r.To = rs[j].To
		}
		j++
	}
	return slices.Replace(rs, i, j, r)
}

// missingRanges returns the ranges of the whole table not in the sorted,
// disjoint ranges rs.
func missingRanges(rs []CTIDRange) []CTIDRange {
	var out []CTIDRange
	at := CTID{}
	for _, r := range rs {
		if at.less(r.From) {
			out = append(out, CTIDRange{From: at, To: r.From})
		}
		if at.less(r.To) {
			at = r.To
		}
	}
	if at.less(maxCTID) {
		out = append(out, CTIDRange{From: at, To: maxCTID})
	}
	return out
}
