// Package pgoutput decodes the messages of PostgreSQL's pgoutput logical
// decoding plugin (protocol version 1, text values) into canonical changes.
//
// It is pure: no server, no I/O. A [Decoder] keeps the state the protocol
// needs (the relation cache, the open transaction) and turns each message
// into at most one [canonical.Change]. Type names, which pgoutput does not
// send, come from a [Resolver] the caller supplies.
package pgoutput

import (
	"encoding/binary"
	"time"

	"github.com/siphondb/siphon/canonical"
)

// Message types of pgoutput protocol version 1.
const (
	MsgBegin    = 'B'
	MsgCommit   = 'C'
	MsgOrigin   = 'O'
	MsgRelation = 'R'
	MsgType     = 'Y'
	MsgInsert   = 'I'
	MsgUpdate   = 'U'
	MsgDelete   = 'D'
	MsgTruncate = 'T'
	MsgMessage  = 'M'
)

// Relation is a table as the latest Relation message described it.
type Relation struct {
	ID     uint32
	Schema string
	Name   string
	// ReplicaIdentity is pgoutput's replica identity setting: 'd' default,
	// 'n' nothing, 'f' full, 'i' index.
	ReplicaIdentity byte
	// Columns are shared by every change of this relation version; a
	// [Resolver] fills in Type and Nullable.
	Columns []canonical.Column
	// TypeModifiers holds each column's atttypmod, in column order.
	TypeModifiers []int32
	// Key marks the columns that are part of the replica identity.
	Key []bool
}

// TypeName is a type's schema and name, from a Type message.
type TypeName struct {
	Schema string
	Name   string
}

// Resolver completes a relation's columns (Type and Nullable) when a
// Relation message arrives, before any change of it is decoded. types holds
// the names of the non-built-in types Type messages announced so far. An
// error stops decoding and is returned wrapped in a [*DecodeError].
type Resolver func(rel *Relation, types map[uint32]TypeName) error

// Decoder turns pgoutput messages into canonical changes. The zero value is
// not usable: call [NewDecoder]. A Decoder is not safe for concurrent use.
type Decoder struct {
	// Resolve completes each relation's column types. When nil, Type stays
	// empty and Nullable true.
	Resolve Resolver

	rels  map[uint32]*Relation
	types map[uint32]TypeName

	inTx       bool
	xid        uint32
	commitLSN  canonical.Position // the commit LSN the Begin announced
	commitTime time.Time
}

// NewDecoder returns a Decoder with an empty relation cache.
func NewDecoder(resolve Resolver) *Decoder {
	return &Decoder{
		Resolve: resolve,
		rels:    make(map[uint32]*Relation),
		types:   make(map[uint32]TypeName),
	}
}

// Relation returns the cached relation with the given id, or nil.
func (d *Decoder) Relation(id uint32) *Relation { return d.rels[id] }

// InTransaction reports whether a Begin was decoded and its Commit not yet.
func (d *Decoder) InTransaction() bool { return d.inTx }

// Decode decodes one pgoutput message (the payload of an XLogData message).
// When the message is a change it overwrites *ch and returns true; Relation,
// Type and Origin messages only update the Decoder's state and return
// false.
//
// Changes carry the open transaction's XID and commit time. OpBegin, row
// changes, truncates and transactional messages carry the commit LSN that
// Begin announced; OpCommit carries the transaction's end LSN (the point to
// resume from); a non-transactional message carries its own LSN.
//
// Values are copied out of msg, which the caller may reuse: the row values
// of one tuple share a single string allocation. Errors are
// [*DecodeError]s.
func (d *Decoder) Decode(msg []byte, ch *canonical.Change) (bool, error) {
	if len(msg) == 0 {
		return false, &DecodeError{Err: ErrTruncated}
	}
	r := reader{buf: msg, off: 1}
	var err error
	switch t := msg[0]; t {
	case MsgBegin:
		err = d.begin(&r, ch)
	case MsgCommit:
		err = d.commit(&r, ch)
	case MsgRelation:
		err = d.relation(&r)
		if err == nil {
			return false, nil
		}
	case MsgType:
		err = d.typ(&r)
		if err == nil {
			return false, nil
		}
	case MsgOrigin:
		err = d.origin(&r)
		if err == nil {
			return false, nil
		}
	case MsgInsert, MsgUpdate, MsgDelete:
		err = d.row(t, &r, ch)
	case MsgTruncate:
		err = d.truncate(&r, ch)
	case MsgMessage:
		err = d.message(&r, ch)
	default:
		err = ErrUnknownMessage
	}
	if err != nil {
		return false, &DecodeError{Type: msg[0], Offset: r.off, Err: err}
	}
	return true, nil
}

func (d *Decoder) begin(r *reader, ch *canonical.Change) error {
	if d.inTx {
		return ErrOutOfOrder
	}
	lsn, ts, xid := r.uint64(), r.int64(), r.uint32()
	if r.err != nil {
		return r.err
	}
	if err := r.end(); err != nil {
		return err
	}
	d.inTx, d.xid, d.commitLSN, d.commitTime = true, xid, canonical.Position(lsn), pgTime(ts)
	*ch = canonical.Change{Op: canonical.OpBegin, Position: d.commitLSN, XID: xid, CommitTime: d.commitTime}
	return nil
}

func (d *Decoder) commit(r *reader, ch *canonical.Change) error {
	if !d.inTx {
		return ErrOutOfOrder
	}
	_ = r.byte() // flags, unused
	_ = r.uint64()
	end, ts := r.uint64(), r.int64()
	if r.err != nil {
		return r.err
	}
	if err := r.end(); err != nil {
		return err
	}
	d.inTx = false
	*ch = canonical.Change{Op: canonical.OpCommit, Position: canonical.Position(end), XID: d.xid, CommitTime: pgTime(ts)}
	return nil
}

func (d *Decoder) origin(r *reader) error {
	_ = r.uint64()
	_ = r.cstring()
	if r.err != nil {
		return r.err
	}
	return r.end()
}

func (d *Decoder) typ(r *reader) error {
	oid := r.uint32()
	schema, name := r.cstring(), r.cstring()
	if r.err != nil {
		return r.err
	}
	if err := r.end(); err != nil {
		return err
	}
	d.types[oid] = TypeName{Schema: schema, Name: name}
	return nil
}

func (d *Decoder) relation(r *reader) error {
	rel := &Relation{ID: r.uint32(), Schema: r.cstring(), Name: r.cstring(), ReplicaIdentity: r.byte()}
	n := int(r.uint16())
	if r.err != nil {
		return r.err
	}
	if rel.Schema == "" {
		rel.Schema = "pg_catalog" // pgoutput sends pg_catalog as ""
	}
	// Each column takes at least 10 bytes: do not trust n further than that.
	if n > r.remaining()/10 {
		return ErrTruncated
	}
	rel.Columns = make([]canonical.Column, n)
	rel.TypeModifiers = make([]int32, n)
	rel.Key = make([]bool, n)
	for i := range n {
		flags := r.byte()
		rel.Columns[i] = canonical.Column{Name: r.cstring(), TypeOID: r.uint32(), Nullable: true}
		rel.TypeModifiers[i] = int32(r.uint32())
		rel.Key[i] = flags&1 != 0
	}
	if r.err != nil {
		return r.err
	}
	if err := r.end(); err != nil {
		return err
	}
	if d.Resolve != nil {
		if err := d.Resolve(rel, d.types); err != nil {
			return &ResolveError{Relation: canonical.TableName{Schema: rel.Schema, Name: rel.Name}, Err: err}
		}
	}
	d.rels[rel.ID] = rel
	return nil
}

func (d *Decoder) row(t byte, r *reader, ch *canonical.Change) error {
	if !d.inTx {
		return ErrOutOfOrder
	}
	id := r.uint32()
	if r.err != nil {
		return r.err
	}
	rel := d.rels[id]
	if rel == nil {
		return ErrUnknownRelation
	}
	*ch = canonical.Change{
		Position:   d.commitLSN,
		XID:        d.xid,
		CommitTime: d.commitTime,
		Schema:     rel.Schema,
		Table:      rel.Name,
		Columns:    rel.Columns,
	}
	var err error
	kind := r.byte()
	switch t {
	case MsgInsert:
		ch.Op = canonical.OpInsert
		if kind != 'N' && r.err == nil {
			return ErrInvalidTuple
		}
		ch.New, err = r.tuple(len(rel.Columns))
	case MsgUpdate:
		ch.Op = canonical.OpUpdate
		if kind == 'K' || kind == 'O' {
			if ch.Old, err = r.tuple(len(rel.Columns)); err != nil {
				return err
			}
			kind = r.byte()
		}
		if kind != 'N' && r.err == nil {
			return ErrInvalidTuple
		}
		ch.New, err = r.tuple(len(rel.Columns))
	case MsgDelete:
		ch.Op = canonical.OpDelete
		if kind != 'K' && kind != 'O' && r.err == nil {
			return ErrInvalidTuple
		}
		ch.Old, err = r.tuple(len(rel.Columns))
	}
	if err != nil {
		return err
	}
	return r.end()
}

func (d *Decoder) truncate(r *reader, ch *canonical.Change) error {
	if !d.inTx {
		return ErrOutOfOrder
	}
	n := int(r.uint32())
	opts := r.byte()
	if r.err != nil {
		return r.err
	}
	if n < 0 || n > r.remaining()/4 {
		return ErrTruncated
	}
	tables := make([]canonical.TableName, n)
	for i := range n {
		rel := d.rels[r.uint32()]
		if r.err != nil {
			return r.err
		}
		if rel == nil {
			return ErrUnknownRelation
		}
		tables[i] = canonical.TableName{Schema: rel.Schema, Name: rel.Name}
	}
	if err := r.end(); err != nil {
		return err
	}
	*ch = canonical.Change{
		Op:              canonical.OpTruncate,
		Position:        d.commitLSN,
		XID:             d.xid,
		CommitTime:      d.commitTime,
		Truncated:       tables,
		Cascade:         opts&1 != 0,
		RestartIdentity: opts&2 != 0,
	}
	return nil
}

func (d *Decoder) message(r *reader, ch *canonical.Change) error {
	flags := r.byte()
	lsn := r.uint64()
	prefix := r.cstring()
	n := int(r.uint32())
	if r.err != nil {
		return r.err
	}
	if n < 0 || n > r.remaining() {
		return ErrTruncated
	}
	content := make([]byte, n)
	copy(content, r.buf[r.off:r.off+n])
	r.off += n
	if err := r.end(); err != nil {
		return err
	}
	m := &canonical.Message{Transactional: flags&1 != 0, Prefix: prefix, Content: content}
	if m.Transactional {
		if !d.inTx {
			return ErrOutOfOrder
		}
		*ch = canonical.Change{Op: canonical.OpMessage, Position: d.commitLSN, XID: d.xid, CommitTime: d.commitTime, Message: m}
		return nil
	}
	*ch = canonical.Change{Op: canonical.OpMessage, Position: canonical.Position(lsn), Message: m}
	return nil
}

// pgEpoch is PostgreSQL's timestamp epoch, 2000-01-01 UTC, in Unix
// microseconds.
const pgEpoch = 946_684_800_000_000

// pgTime converts microseconds since 2000-01-01 UTC to a UTC time.
func pgTime(us int64) time.Time { return time.UnixMicro(us + pgEpoch).UTC() }

// reader reads big-endian protocol fields from buf. The first short read
// sets err (ErrTruncated) and every later read returns zero.
type reader struct {
	buf []byte
	off int
	err error
}

func (r *reader) remaining() int { return len(r.buf) - r.off }

func (r *reader) need(n int) bool {
	if r.err != nil {
		return false
	}
	if r.remaining() < n {
		r.err = ErrTruncated
		return false
	}
	return true
}

func (r *reader) byte() byte {
	if !r.need(1) {
		return 0
	}
	b := r.buf[r.off]
	r.off++
	return b
}

func (r *reader) uint16() uint16 {
	if !r.need(2) {
		return 0
	}
	v := binary.BigEndian.Uint16(r.buf[r.off:])
	r.off += 2
	return v
}

func (r *reader) uint32() uint32 {
	if !r.need(4) {
		return 0
	}
	v := binary.BigEndian.Uint32(r.buf[r.off:])
	r.off += 4
	return v
}

func (r *reader) uint64() uint64 {
	if !r.need(8) {
		return 0
	}
	v := binary.BigEndian.Uint64(r.buf[r.off:])
	r.off += 8
	return v
}

func (r *reader) int64() int64 { return int64(r.uint64()) }

// cstring reads a NUL-terminated string.
func (r *reader) cstring() string {
	if r.err != nil {
		return ""
	}
	for i := r.off; i < len(r.buf); i++ {
		if r.buf[i] == 0 {
			s := string(r.buf[r.off:i])
			r.off = i + 1
			return s
		}
	}
	r.err = ErrTruncated
	return ""
}

// end checks that the message has no bytes left.
func (r *reader) end() error {
	if r.err != nil {
		return r.err
	}
	if r.off != len(r.buf) {
		return ErrTrailingBytes
	}
	return nil
}

// tuple reads TupleData of want columns. Present values become substrings
// of one string holding the tuple's bytes, so a row costs two allocations
// (the Row and that string) however many columns it has.
func (r *reader) tuple(want int) (canonical.Row, error) {
	n := int(r.uint16())
	if r.err != nil {
		return nil, r.err
	}
	if n != want {
		return nil, ErrColumnCount
	}
	// First pass: validate and find the extent of the tuple.
	start := r.off
	for range n {
		switch r.byte() {
		case 'n', 'u':
		case 't':
			l := int(int32(r.uint32()))
			if r.err == nil && (l < 0 || l > r.remaining()) {
				r.err = ErrTruncated
			}
			if r.err == nil {
				r.off += l
			}
		case 'b':
			if r.err == nil {
				return nil, ErrBinaryValue
			}
		default:
			if r.err == nil {
				return nil, ErrInvalidTuple
			}
		}
		if r.err != nil {
			return nil, r.err
		}
	}
	// Second pass: slice the values out of one copy.
	data := string(r.buf[start:r.off])
	row := make(canonical.Row, n)
	p := 0
	for i := range n {
		kind := data[p]
		p++
		switch kind {
		case 'n':
			row[i] = canonical.Null()
		case 'u':
			row[i] = canonical.Unchanged()
		case 't':
			l := int(binary.BigEndian.Uint32(r.buf[start+p:]))
			p += 4
			row[i] = canonical.Text(data[p : p+l])
			p += l
		}
	}
	return row, nil
}
