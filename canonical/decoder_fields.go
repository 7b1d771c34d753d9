package canonical

import (
	"fmt"
	"strconv"
	"time"
)

// field identifies a known member of a record.
type field uint8

const (
	fT field = iota
	fFormat
	fVersion
	fKind
	fEngine
	fPosition
	fEnd
	fSystemID
	fTimeline
	fSlot
	fServerVersion
	fCreated
	fSchema
	fName
	fColumns
	fPrimaryKey
	fIdentityKey
	fReplicaIdentity
	fPartitioned
	fPartitionOf
	fTable
	fValues
	fXID
	fCommitTime
	fNew
	fOld
	fUnchanged
	fOldUnchanged
	fTables
	fCascade
	fRestartIdentity
	fTransactional
	fPrefix
	fContent
	fRecords
	fChecksum
	fPrevious
	fTag
	fStatement
	fSearchPath
	fObjects
	fValue
	fCalled
	fRole
	fProblem
	fSessionRole
	fSuperuser
	fInstaller
	fAuth
	fKey
	fUnknown
)

var fieldNames = [...]string{
	fT: "t", fFormat: "format", fVersion: "version", fKind: "kind", fEngine: "engine",
	fPosition: "position", fEnd: "end", fSystemID: "system_id", fTimeline: "timeline",
	fSlot: "slot", fServerVersion: "server_version", fCreated: "created",
	fSchema: "schema", fName: "name", fColumns: "columns", fPrimaryKey: "primary_key",
	fIdentityKey: "identity_key", fReplicaIdentity: "replica_identity",
	fPartitioned: "partitioned", fPartitionOf: "partition_of", fTable: "table",
	fValues: "values", fXID: "xid", fCommitTime: "commit_time", fNew: "new", fOld: "old",
	fUnchanged: "unchanged", fOldUnchanged: "old_unchanged", fTables: "tables",
	fCascade: "cascade", fRestartIdentity: "restart_identity",
	fTransactional: "transactional", fPrefix: "prefix", fContent: "content",
	fRecords: "records", fChecksum: "checksum", fPrevious: "previous",
	fTag: "tag", fStatement: "statement", fSearchPath: "search_path", fObjects: "objects",
	fValue: "value", fCalled: "called", fRole: "role", fProblem: "problem",
	fSessionRole: "session_role", fSuperuser: "superuser", fInstaller: "installer",
	fAuth: "auth", fKey: "key", fUnknown: "?",
}

func (f field) String() string { return fieldNames[f] }

func (f field) bit() uint64 { return 1 << f }

func fields(fs ...field) uint64 {
	var m uint64
	for _, f := range fs {
		m |= f.bit()
	}
	return m
}

// lookupField maps a key to its field; the switch does not allocate.
func lookupField(key []byte) field {
	switch string(key) {
	case "t":
		return fT
	case "format":
		return fFormat
	case "version":
		return fVersion
	case "kind":
		return fKind
	case "engine":
		return fEngine
	case "position":
		return fPosition
	case "end":
		return fEnd
	case "system_id":
		return fSystemID
	case "timeline":
		return fTimeline
	case "slot":
		return fSlot
	case "server_version":
		return fServerVersion
	case "created":
		return fCreated
	case "schema":
		return fSchema
	case "name":
		return fName
	case "columns":
		return fColumns
	case "primary_key":
		return fPrimaryKey
	case "identity_key":
		return fIdentityKey
	case "replica_identity":
		return fReplicaIdentity
	case "partitioned":
		return fPartitioned
	case "partition_of":
		return fPartitionOf
	case "table":
		return fTable
	case "values":
		return fValues
	case "xid":
		return fXID
	case "commit_time":
		return fCommitTime
	case "new":
		return fNew
	case "old":
		return fOld
	case "unchanged":
		return fUnchanged
	case "old_unchanged":
		return fOldUnchanged
	case "tables":
		return fTables
	case "cascade":
		return fCascade
	case "restart_identity":
		return fRestartIdentity
	case "transactional":
		return fTransactional
	case "prefix":
		return fPrefix
	case "content":
		return fContent
	case "records":
		return fRecords
	case "checksum":
		return fChecksum
	case "previous":
		return fPrevious
	case "tag":
		return fTag
	case "statement":
		return fStatement
	case "search_path":
		return fSearchPath
	case "objects":
		return fObjects
	case "value":
		return fValue
	case "called":
		return fCalled
	case "role":
		return fRole
	case "problem":
		return fProblem
	case "session_role":
		return fSessionRole
	case "superuser":
		return fSuperuser
	case "installer":
		return fInstaller
	case "auth":
		return fAuth
	case "key":
		return fKey
	}
	return fUnknown
}

// recordFields holds the members of one record line as they are read. Byte
// slices point into the line or the scanner's scratch: valid for the line.
type recordFields struct {
	seen uint64

	typ, format, version, kind, engine, systemID, slot, serverVersion []byte
	checksum, previous, auth, key                                     []byte
	schema, name, table, replicaIdentity, prefix, content             []byte
	tag, statement, searchPath, role, problem                         []byte
	sessionRole, installer                                            []byte

	position, end        Position
	timeline, xid        uint32
	records              uint64
	created, commitTime  time.Time
	partitioned, cascade bool
	restartIdentity      bool
	transactional        bool
	called               bool
	superuser            bool
	value                int64

	columns     []Column
	primaryKey  []string
	identityKey []string
	partitionOf *TableName
	tables      []TableName
	objects     []DDLObject
}

// span locates one decoded value in the Decoder's arena.
type span struct {
	start, end int
	state      valueState
}

// scanFields reads the line's object from the start, parsing the members in
// allowed into d.f and skipping the others (unknown members are ignored, so
// later format revisions can add optional fields).
func (d *Decoder) scanFields(allowed uint64) error {
	s := &d.sc
	s.pos = 0
	s.scratch = s.scratch[:0]
	d.f = recordFields{}
	d.arena = d.arena[:0]
	d.newSpans = d.newSpans[:0]
	d.oldSpans = d.oldSpans[:0]
	d.names = d.names[:0]
	d.unchanged = d.unchanged[:0]
	d.oldUnchanged = d.oldUnchanged[:0]
	if err := s.expect('{'); err != nil {
		return err
	}
	for first := true; ; {
		more, err := s.next(&first, '}')
		if err != nil {
			return err
		}
		if !more {
			return s.end()
		}
		key, err := s.key()
		if err != nil {
			return err
		}
		f := lookupField(key)
		if f == fUnknown || allowed&f.bit() == 0 {
			if err := s.skip(0); err != nil {
				return err
			}
			continue
		}
		if d.f.seen&f.bit() != 0 {
			return s.errAt(s.pos, ErrInvalidRecord, "duplicate field %q", f)
		}
		d.f.seen |= f.bit()
		if err := d.parseField(f); err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
	}
}

// parseField reads the value of member f into d.f.
func (d *Decoder) parseField(f field) error {
	s := &d.sc
	r := &d.f
	var err error
	switch f {
	case fT:
		r.typ, err = d.stringField()
	case fFormat:
		r.format, err = d.stringField()
	case fVersion:
		s.ws()
		start := s.pos
		err = s.skip(0)
		r.version = s.data[start:s.pos]
	case fKind:
		r.kind, err = d.stringField()
	case fEngine:
		r.engine, err = d.stringField()
	case fSystemID:
		r.systemID, err = d.stringField()
	case fSlot:
		r.slot, err = d.stringField()
	case fServerVersion:
		r.serverVersion, err = d.stringField()
	case fChecksum:
		r.checksum, err = d.stringField()
	case fPrevious:
		r.previous, err = d.stringField()
	case fAuth:
		r.auth, err = d.stringField()
	case fKey:
		r.key, err = d.stringField()
	case fSchema:
		r.schema, err = d.stringField()
	case fName:
		r.name, err = d.stringField()
	case fTable:
		r.table, err = d.stringField()
	case fReplicaIdentity:
		r.replicaIdentity, err = d.stringField()
	case fPrefix:
		r.prefix, err = d.stringField()
	case fContent:
		r.content, err = d.stringField()
	case fTag:
		r.tag, err = d.stringField()
	case fStatement:
		r.statement, err = d.stringField()
	case fSearchPath:
		r.searchPath, err = d.stringField()
	case fRole:
		r.role, err = d.stringField()
	case fProblem:
		r.problem, err = d.stringField()
	case fSessionRole:
		r.sessionRole, err = d.stringField()
	case fInstaller:
		r.installer, err = d.stringField()
	case fSuperuser:
		r.superuser, err = d.boolean()
	case fObjects:
		r.objects, err = d.ddlObjects()
	case fValue:
		r.value, err = d.int64()
	case fCalled:
		r.called, err = d.boolean()
	case fPosition:
		r.position, err = d.position()
	case fEnd:
		r.end, err = d.position()
	case fTimeline:
		r.timeline, err = d.uint32()
	case fXID:
		r.xid, err = d.uint32()
	case fRecords:
		r.records, err = d.uint(64)
	case fCreated:
		r.created, err = d.time()
	case fCommitTime:
		r.commitTime, err = d.time()
	case fPartitioned:
		r.partitioned, err = d.boolean()
	case fCascade:
		r.cascade, err = d.boolean()
	case fRestartIdentity:
		r.restartIdentity, err = d.boolean()
	case fTransactional:
		r.transactional, err = d.boolean()
	case fColumns:
		r.columns, err = d.columns()
	case fPrimaryKey:
		r.primaryKey, err = d.strings()
	case fIdentityKey:
		r.identityKey, err = d.strings()
	case fPartitionOf:
		var n TableName
		n, err = d.tableName()
		r.partitionOf = &n
	case fTables:
		err = d.array(func() error {
			n, err := d.tableName()
			r.tables = append(r.tables, n)
			return err
		})
	case fValues, fNew:
		d.newSpans, err = d.values(d.newSpans)
	case fOld:
		d.oldSpans, err = d.values(d.oldSpans)
	case fUnchanged:
		d.unchanged, err = d.nameList(d.unchanged)
	case fOldUnchanged:
		d.oldUnchanged, err = d.nameList(d.oldUnchanged)
	}
	return err
}

func (d *Decoder) stringField() ([]byte, error) {
	if !d.sc.isString() {
		return nil, d.typeError("a string")
	}
	return d.sc.stringBytes()
}

// typeError reports a well-formed value of the wrong type (or a syntax
// error, when the value is not well-formed either).
func (d *Decoder) typeError(want string) error {
	s := &d.sc
	s.ws()
	start := s.pos
	if err := s.skip(0); err != nil {
		return err
	}
	return s.errAt(start, ErrInvalidRecord, "%s is not %s", truncateText(s.data[start:s.pos]), want)
}

// truncateText shortens b for an error message.
func truncateText(b []byte) string {
	const limit = 40
	if len(b) > limit {
		return string(b[:limit]) + "..."
	}
	return string(b)
}

func (d *Decoder) position() (Position, error) {
	start := d.sc.pos
	b, err := d.stringField()
	if err != nil {
		return 0, err
	}
	p, ok := parsePositionBytes(b)
	if !ok {
		_, perr := ParsePosition(string(b))
		return 0, &colError{off: start, err: fmt.Errorf("%w: %w", ErrInvalidRecord, perr)}
	}
	return p, nil
}

func (d *Decoder) uint32() (uint32, error) {
	v, err := d.uint(32)
	return uint32(v), err
}

// uint reads an unsigned integer of at most bits bits.
func (d *Decoder) uint(bits int) (uint64, error) {
	if c := d.sc.peek(); c != '-' && (c < '0' || c > '9') {
		return 0, d.typeError("an unsigned integer")
	}
	return d.sc.uint(bits)
}

// int64 reads a signed 64-bit integer.
func (d *Decoder) int64() (int64, error) {
	if c := d.sc.peek(); c != '-' && (c < '0' || c > '9') {
		return 0, d.typeError("an integer")
	}
	start := d.sc.pos
	num, err := d.sc.number()
	if err != nil {
		return 0, err
	}
	v, err := strconv.ParseInt(string(num), 10, 64)
	if err != nil {
		return 0, d.sc.errAt(start, ErrInvalidRecord, "%s is not a 64-bit integer", truncateText(num))
	}
	return v, nil
}

func (d *Decoder) boolean() (bool, error) {
	if c := d.sc.peek(); c != 't' && c != 'f' {
		return false, d.typeError("true or false")
	}
	return d.sc.boolean()
}

func (d *Decoder) time() (time.Time, error) {
	start := d.sc.pos
	b, err := d.stringField()
	if err != nil {
		return time.Time{}, err
	}
	t, err := time.Parse(time.RFC3339Nano, string(b))
	if err != nil || !timeEncodable(t) {
		return time.Time{}, &colError{off: start, err: fmt.Errorf("%w: %q is not an RFC 3339 time with a UTC year in 0-9999", ErrInvalidRecord, truncateText(b))}
	}
	return t.UTC(), nil
}

// array calls elem for each element of an array.
func (d *Decoder) array(elem func() error) error {
	s := &d.sc
	if s.peek() != '[' {
		return d.typeError("an array")
	}
	s.pos++
	for first := true; ; {
		more, err := s.next(&first, ']')
		if err != nil || !more {
			return err
		}
		if err := elem(); err != nil {
			return err
		}
	}
}

// object calls member for each member of an object.
func (d *Decoder) object(member func(key []byte) error) error {
	s := &d.sc
	if s.peek() != '{' {
		return d.typeError("an object")
	}
	s.pos++
	for first := true; ; {
		more, err := s.next(&first, '}')
		if err != nil || !more {
			return err
		}
		key, err := s.key()
		if err != nil {
			return err
		}
		if err := member(key); err != nil {
			return err
		}
	}
}

// strings reads an array of strings.
func (d *Decoder) strings() ([]string, error) {
	var out []string
	err := d.array(func() error {
		b, err := d.stringField()
		out = append(out, string(b))
		return err
	})
	return out, err
}

// nameList reads an array of column names into d.names.
func (d *Decoder) nameList(spans []span) ([]span, error) {
	err := d.array(func() error {
		if !d.sc.isString() {
			return d.typeError("a column name")
		}
		start := len(d.names)
		var err error
		d.names, err = d.sc.appendString(d.names)
		spans = append(spans, span{start: start, end: len(d.names)})
		return err
	})
	return spans, err
}

// values reads an array of values (strings or null) into d.arena. It is the
// hot path of row decoding, so it does not go through array.
func (d *Decoder) values(spans []span) ([]span, error) {
	s := &d.sc
	if s.peek() != '[' {
		return spans, d.typeError("an array")
	}
	s.pos++
	for first := true; ; {
		more, err := s.next(&first, ']')
		if err != nil || !more {
			return spans, err
		}
		switch s.peek() {
		case '"':
			start := len(d.arena)
			if d.arena, err = s.appendString(d.arena); err != nil {
				return spans, err
			}
			spans = append(spans, span{start: start, end: len(d.arena), state: statePresent})
		case 'n':
			if err := s.literal("null"); err != nil {
				return spans, err
			}
			spans = append(spans, span{state: stateNull})
		default:
			return spans, d.typeError("a value (a string or null)")
		}
	}
}

// tableName reads {"schema": ..., "name": ...}.
func (d *Decoder) tableName() (TableName, error) {
	var n TableName
	var seen uint64
	err := d.object(func(key []byte) error {
		f := lookupField(key)
		if f != fSchema && f != fName {
			return d.sc.skip(0)
		}
		if seen&f.bit() != 0 {
			return d.sc.errAt(d.sc.pos, ErrInvalidRecord, "duplicate field %q", f)
		}
		seen |= f.bit()
		b, err := d.stringField()
		if f == fSchema {
			n.Schema = string(b)
		} else {
			n.Name = string(b)
		}
		return err
	})
	if err == nil && seen != fields(fSchema, fName) {
		err = d.sc.errAt(d.sc.pos, ErrInvalidRecord, "a table name needs schema and name")
	}
	return n, err
}

// ddlObjects reads the objects of a ddl record.
func (d *Decoder) ddlObjects() ([]DDLObject, error) {
	var objects []DDLObject
	err := d.array(func() error {
		var o DDLObject
		var seen uint8
		err := d.object(func(key []byte) error {
			var f uint8
			switch string(key) {
			case "type":
				f = 1
			case "identity":
				f = 2
			case "dropped":
				f = 4
			default:
				return d.sc.skip(0)
			}
			if seen&f != 0 {
				return d.sc.errAt(d.sc.pos, ErrInvalidRecord, "duplicate field %q", key)
			}
			seen |= f
			var b []byte
			var err error
			switch f {
			case 1:
				b, err = d.stringField()
				o.Type = string(b)
			case 2:
				b, err = d.stringField()
				o.Identity = string(b)
			case 4:
				o.Dropped, err = d.boolean()
			}
			return err
		})
		if err == nil && seen&3 != 3 {
			err = d.sc.errAt(d.sc.pos, ErrInvalidRecord, "object %d needs type and identity", len(objects)+1)
		}
		objects = append(objects, o)
		return err
	})
	return objects, err
}

// columns reads the columns of a table record.
func (d *Decoder) columns() ([]Column, error) {
	cols := []Column{}
	err := d.array(func() error {
		var c Column
		var seen uint64
		err := d.object(func(key []byte) error {
			var f uint64
			switch string(key) {
			case "name":
				f = 1
			case "type":
				f = 2
			case "type_oid":
				f = 4
			case "nullable":
				f = 8
			case "default":
				f = 16
			default:
				return d.sc.skip(0)
			}
			if seen&f != 0 {
				return d.sc.errAt(d.sc.pos, ErrInvalidRecord, "duplicate field %q", key)
			}
			seen |= f
			var b []byte
			var err error
			switch f {
			case 1:
				b, err = d.stringField()
				c.Name = string(b)
			case 2:
				b, err = d.stringField()
				c.Type = string(b)
			case 4:
				c.TypeOID, err = d.uint32()
			case 8:
				c.Nullable, err = d.boolean()
			case 16:
				c.Default, err = d.boolean()
			}
			return err
		})
		if err == nil && seen&11 != 11 {
			err = d.sc.errAt(d.sc.pos, ErrInvalidRecord, "column %d needs name, type and nullable", len(cols)+1)
		}
		cols = append(cols, c)
		return err
	})
	return cols, err
}
