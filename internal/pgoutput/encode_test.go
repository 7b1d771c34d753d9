package pgoutput

import (
	"encoding/binary"
	"time"
)

// msg builds pgoutput messages byte by byte, the way the walsender writes
// them (src/backend/replication/logical/proto.c).
type msg []byte

func newMsg(t byte) msg { return msg{t} }

func (m msg) u8(v byte) msg      { return append(m, v) }
func (m msg) u16(v uint16) msg   { return binary.BigEndian.AppendUint16(m, v) }
func (m msg) u32(v uint32) msg   { return binary.BigEndian.AppendUint32(m, v) }
func (m msg) u64(v uint64) msg   { return binary.BigEndian.AppendUint64(m, v) }
func (m msg) str(s string) msg   { return append(append(m, s...), 0) }
func (m msg) raw(b []byte) msg   { return append(m, b...) }
func (m msg) ts(t time.Time) msg { return m.u64(uint64(t.UnixMicro() - pgEpoch)) }

type col struct {
	key    bool
	name   string
	oid    uint32
	typmod int32
}

func relationMsg(id uint32, schema, name string, identity byte, cols ...col) msg {
	m := newMsg(MsgRelation).u32(id).str(schema).str(name).u8(identity).u16(uint16(len(cols)))
	for _, c := range cols {
		var flags byte
		if c.key {
			flags = 1
		}
		m = m.u8(flags).str(c.name).u32(c.oid).u32(uint32(c.typmod))
	}
	return m
}

func typeMsg(oid uint32, schema, name string) msg {
	return newMsg(MsgType).u32(oid).str(schema).str(name)
}

func beginMsg(finalLSN uint64, at time.Time, xid uint32) msg {
	return newMsg(MsgBegin).u64(finalLSN).ts(at).u32(xid)
}

func commitMsg(commitLSN, endLSN uint64, at time.Time) msg {
	return newMsg(MsgCommit).u8(0).u64(commitLSN).u64(endLSN).ts(at)
}

func originMsg(lsn uint64, name string) msg { return newMsg(MsgOrigin).u64(lsn).str(name) }

// val is a tuple column: nil is NULL, unchanged is an unchanged TOAST value,
// any other string is text.
type val *string

var unchanged = new(string)

func txt(s string) val { return &s }

func tuple(m msg, vals ...val) msg {
	m = m.u16(uint16(len(vals)))
	for _, v := range vals {
		switch {
		case v == nil:
			m = m.u8('n')
		case v == unchanged:
			m = m.u8('u')
		default:
			m = m.u8('t').u32(uint32(len(*v))).raw([]byte(*v))
		}
	}
	return m
}

func insertMsg(rel uint32, vals ...val) msg {
	return tuple(newMsg(MsgInsert).u32(rel).u8('N'), vals...)
}

func updateMsg(rel uint32, oldKind byte, old []val, vals ...val) msg {
	m := newMsg(MsgUpdate).u32(rel)
	if oldKind != 0 {
		m = tuple(m.u8(oldKind), old...)
	}
	return tuple(m.u8('N'), vals...)
}

func deleteMsg(rel uint32, oldKind byte, old ...val) msg {
	return tuple(newMsg(MsgDelete).u32(rel).u8(oldKind), old...)
}

func truncateMsg(opts byte, rels ...uint32) msg {
	m := newMsg(MsgTruncate).u32(uint32(len(rels))).u8(opts)
	for _, r := range rels {
		m = m.u32(r)
	}
	return m
}

func messageMsg(transactional bool, lsn uint64, prefix string, content []byte) msg {
	var flags byte
	if transactional {
		flags = 1
	}
	return newMsg(MsgMessage).u8(flags).u64(lsn).str(prefix).u32(uint32(len(content))).raw(content)
}
