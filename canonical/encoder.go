package canonical

import (
	"bufio"
	"encoding/hex"
	"fmt"
	"hash/crc32"
	"io"
	"slices"
	"strconv"
)

// Encoder writes a JSONL stream: a header, table records, rows or changes,
// and an end record. It buffers its output; [Encoder.WriteEnd] flushes, and
// so does [Encoder.Flush].
//
// The Encoder checks what it is given and refuses, with an [*EncodeError]
// and without writing anything, a record the [Decoder] would reject: text
// that is not valid UTF-8, a row of the wrong length, a record out of order
// (see [ErrOrder]). An error of the underlying writer is final: every later
// call returns it.
//
// The stream is checked: the header, every commit, every change outside a
// transaction, every sequence, the end record and, in snapshots, a row
// every 256 KiB
// carry a running CRC-32C of the stream (see [Header].Checked), which the
// Decoder verifies as it reads. With a key ([Encoder.SetKey]) the stream
// is also authenticated: those checkpoints and every ddl record carry an
// HMAC-SHA-256 of the stream so far (see [Header].KeyID).
//
// Rows and changes are written without reflection or per-value allocation.
// An Encoder is not safe for concurrent use.
type Encoder struct {
	w    *bufio.Writer
	buf  []byte // the record being built; reused
	tbuf []byte // a table record written ahead of a change; reused
	err  error  // the writer's error, final

	crc        uint32 // CRC-32C of every byte written
	sinceCheck int    // bytes written since the last checkpoint
	lastSum    uint32 // the last checkpoint's sum
	end        Position

	// Authentication (see auth.go): the chain of MACs when a key is set,
	// its key id, and the last checkpoint's MAC in hex.
	mac     *macChain
	keyID   string
	lastMAC [64]byte

	kind    Kind
	started bool // header written
	ended   bool // end record written
	inTx    bool // between begin and commit
	count   uint64

	tables map[TableName]*encTable
	last   *encTable
}

// encTable is the latest table record written for a table.
type encTable struct {
	t *Table
	// names is `"schema":"...","table":"..."`, escaped once.
	names []byte
}

// NewEncoder returns an Encoder that writes to w through a buffer.
func NewEncoder(w io.Writer) *Encoder {
	return &Encoder{
		w:      bufio.NewWriterSize(w, 64<<10),
		buf:    make([]byte, 0, 4<<10),
		tables: make(map[TableName]*encTable),
	}
}

// SetKey makes the stream authenticated with key (see [Header].KeyID):
// the header names the key by its [KeyID], and every checkpoint, and every
// ddl record, carries an HMAC-SHA-256 of the stream so far, which a
// [Decoder] holding the key verifies. It must be called before the header
// is written; key must be at least [MinKeyBytes] long (an error wrapping
// [ErrAuthentication] otherwise). The Encoder keeps no reference to key.
func (e *Encoder) SetKey(key []byte) error {
	if e.started {
		return &EncodeError{Record: "header", Err: fmt.Errorf("%w: set the key before the header is written", ErrOrder)}
	}
	if err := checkKey(key); err != nil {
		return err
	}
	e.mac, e.keyID = newMACChain(key), KeyID(key)
	return nil
}

// Count returns the number of records written after the header (the count
// the end record carries).
func (e *Encoder) Count() uint64 { return e.count }

// Flush writes buffered records to the underlying writer.
func (e *Encoder) Flush() error {
	if e.err != nil {
		return e.err
	}
	if err := e.w.Flush(); err != nil {
		e.err = fmt.Errorf("canonical: write: %w", err)
	}
	return e.err
}

// emit writes the record in e.buf, followed by a newline.
func (e *Encoder) emit() error {
	e.buf = append(e.buf, '\n')
	return e.write(e.buf)
}

// emitChecked writes the record in e.buf as a checkpoint: with the sum of
// the stream up to it.
func (e *Encoder) emitChecked() error {
	if e.mac != nil {
		return e.emitAuthenticated()
	}
	e.buf, e.lastSum = checked(e.buf, e.crc)
	if err := e.emit(); err != nil {
		return err
	}
	e.sinceCheck = 0
	return nil
}

// emitAuthenticated writes the record in e.buf as a checkpoint of an
// authenticated stream: with its MAC, then its sum.
func (e *Encoder) emitAuthenticated() error {
	b := append(e.buf[:len(e.buf)-1], macKey...)
	head := len(b)
	hex.Encode(e.lastMAC[:], e.mac.checkpoint(b))
	b = append(append(b, e.lastMAC[:]...), '"', '}')
	b, e.lastSum = checked(b, e.crc)
	e.buf = append(b, '\n')
	if err := e.writeFrom(e.buf, head); err != nil {
		return err
	}
	e.sinceCheck = 0
	return nil
}

// Link identifies the stream once [Encoder.WriteEnd] has written its end
// record, as [Decoder.Link] does when it reads it back: the next backup of
// a chain records it as its [Header].Previous. It is empty before that.
func (e *Encoder) Link() string {
	switch {
	case !e.ended:
		return ""
	case e.mac != nil:
		return authLink(e.keyID, e.lastMAC[:], e.end)
	}
	return link(e.lastSum, e.end)
}

func (e *Encoder) write(b []byte) error { return e.writeFrom(b, 0) }

// writeFrom writes b, whose bytes before macFrom the MAC chain has taken
// already.
func (e *Encoder) writeFrom(b []byte, macFrom int) error {
	if _, err := e.w.Write(b); err != nil {
		e.err = fmt.Errorf("canonical: write: %w", err)
		return e.err
	}
	e.crc = crc32.Update(e.crc, castagnoli, b)
	if e.mac != nil {
		e.mac.h.Write(b[macFrom:])
	}
	e.sinceCheck += len(b)
	return nil
}

// begin starts a record of type t in e.buf after checking the stream's state.
func (e *Encoder) begin(t string, body bool) error {
	if e.err != nil {
		return e.err
	}
	switch {
	case e.ended:
		return &EncodeError{Record: t, Err: fmt.Errorf("%w: the end record was written", ErrOrder)}
	case !e.started && body:
		return &EncodeError{Record: t, Err: fmt.Errorf("%w: no header written yet", ErrOrder)}
	}
	e.buf = append(e.buf[:0], `{"t":"`...)
	e.buf = append(e.buf, t...)
	e.buf = append(e.buf, '"')
	return nil
}

// WriteHeader writes the header, which must come first, once. h.Kind is
// required.
func (e *Encoder) WriteHeader(h Header) error {
	const rec = "header"
	if err := e.begin(rec, false); err != nil {
		return err
	}
	fail := func(field string, err error) error {
		return &EncodeError{Record: rec, Err: fmt.Errorf("%s: %w", field, err)}
	}
	if e.started {
		return &EncodeError{Record: rec, Err: fmt.Errorf("%w: the header was already written", ErrOrder)}
	}
	if !h.Kind.valid() {
		return fail("kind", fmt.Errorf("%w: %q is not a known kind (snapshot, incremental, changes)", ErrInvalidRecord, h.Kind))
	}
	b := appendKey(e.buf, "format")
	b = append(b, `"`+FormatName+`"`...)
	b = appendKey(b, "version")
	b = appendUint(b, FormatVersion)
	b = appendKey(b, "checksum")
	b = append(b, `"`+checksumName+`"`...)
	if e.mac != nil {
		b = append(appendKey(b, "auth"), `"`+authName+`"`...)
		b, _ = appendString(appendKey(b, "key"), e.keyID)
	}
	b = appendKey(b, "kind")
	b, _ = appendString(b, string(h.Kind))
	var err error
	if b, err = appendOptString(b, "engine", h.Engine); err != nil {
		return fail("engine", err)
	}
	b = appendQuotedPosition(appendKey(b, "position"), h.Start)
	if !h.End.IsZero() {
		b = appendQuotedPosition(appendKey(b, "end"), h.End)
	}
	if b, err = appendOptString(b, "system_id", h.SystemID); err != nil {
		return fail("system_id", err)
	}
	if h.Timeline != 0 {
		b = appendUint(appendKey(b, "timeline"), uint64(h.Timeline))
	}
	if b, err = appendOptString(b, "slot", h.Slot); err != nil {
		return fail("slot", err)
	}
	if b, err = appendOptString(b, "server_version", h.ServerVersion); err != nil {
		return fail("server_version", err)
	}
	if b, err = appendOptString(b, "previous", h.Previous); err != nil {
		return fail("previous", err)
	}
	if !h.Created.IsZero() {
		if !timeEncodable(h.Created) {
			return fail("created", fmt.Errorf("%w: year of %v is outside 0-9999", ErrInvalidRecord, h.Created))
		}
		b = appendTime(appendKey(b, "created"), h.Created)
	}
	e.buf = append(b, '}')
	if err := e.emitChecked(); err != nil {
		return err
	}
	e.started = true
	e.kind = h.Kind
	return nil
}

// WriteTable writes a table record: the description of t's columns (and keys)
// that the rows and changes of t written next are aligned with. It must be
// written before the first row of a table; [Encoder.WriteChange] writes one
// itself when needed. The Encoder keeps a copy of t.
func (e *Encoder) WriteTable(t *Table) error {
	const rec = "table"
	if err := e.begin(rec, true); err != nil {
		return err
	}
	if t == nil {
		return &EncodeError{Record: rec, Err: fmt.Errorf("%w: nil table", ErrInvalidRecord)}
	}
	t = cloneTable(t)
	b, err := appendTable(e.buf[:0], t)
	if err != nil {
		return err
	}
	e.buf = b
	if err := e.emit(); err != nil {
		return err
	}
	e.register(newEncTable(t))
	return nil
}

// appendTable appends the table record of t to b.
func appendTable(b []byte, t *Table) ([]byte, error) {
	const rec = "table"
	name := t.TableName()
	fail := func(column string, err error) error {
		return &EncodeError{Record: rec, Table: name, Column: column, Err: err}
	}
	if err := checkColumns(t.Columns); err != nil {
		return b, fail("", err)
	}
	b = append(b, `{"t":"table",`...)
	b, err := appendTableNames(b, "name", name)
	if err != nil {
		return b, fail("", err)
	}
	b = append(appendKey(b, "columns"), '[')
	for i, c := range t.Columns {
		if i > 0 {
			b = append(b, ',')
		}
		var bad int
		if b, bad = appendString(append(b, `{"name":`...), c.Name); bad >= 0 {
			return b, fail(c.Name, fmt.Errorf("name: %w", utf8Error(bad)))
		}
		if b, bad = appendString(appendKey(b, "type"), c.Type); bad >= 0 {
			return b, fail(c.Name, fmt.Errorf("type: %w", utf8Error(bad)))
		}
		if c.TypeOID != 0 {
			b = appendUint(appendKey(b, "type_oid"), uint64(c.TypeOID))
		}
		b = appendBool(appendKey(b, "nullable"), c.Nullable)
		if c.Default {
			b = appendBool(appendKey(b, "default"), true)
		}
		b = append(b, '}')
	}
	b = append(b, ']')
	for _, k := range [...]struct {
		key  string
		cols []string
	}{{"primary_key", t.PrimaryKey}, {"identity_key", t.IdentityKey}} {
		if len(k.cols) == 0 {
			continue
		}
		b = append(appendKey(b, k.key), '[')
		for i, col := range k.cols {
			if i > 0 {
				b = append(b, ',')
			}
			if t.ColumnIndex(col) < 0 {
				return b, fail(col, fmt.Errorf("%w: %s names no column of the table", ErrInvalidRecord, k.key))
			}
			b, _ = appendString(b, col)
		}
		b = append(b, ']')
	}
	if t.ReplicaIdentity != "" {
		var bad int
		if b, bad = appendString(appendKey(b, "replica_identity"), string(t.ReplicaIdentity)); bad >= 0 {
			return b, fail("", fmt.Errorf("replica_identity: %w", utf8Error(bad)))
		}
	}
	if t.Partitioned {
		b = appendBool(appendKey(b, "partitioned"), true)
	}
	if t.PartitionOf != nil {
		if b, err = appendTableNames(append(appendKey(b, "partition_of"), '{'), "name", *t.PartitionOf); err != nil {
			return b, fail("", fmt.Errorf("partition_of: %w", err))
		}
		b = append(b, '}')
	}
	return append(b, '}'), nil
}

// newEncTable prepares the Encoder's state for t, which it owns.
func newEncTable(t *Table) *encTable {
	names, _ := appendTableNames(nil, "table", t.TableName())
	return &encTable{t: t, names: names}
}

// register makes et its table's latest description, once its record is
// written.
func (e *Encoder) register(et *encTable) {
	e.tables[et.t.TableName()] = et
	e.last = et
	e.count++
}

// checkColumns refuses duplicate column names, which would make the
// "unchanged" lists ambiguous.
func checkColumns(cols []Column) error {
	if len(cols) < 2 {
		return nil
	}
	seen := make(map[string]struct{}, len(cols))
	for _, c := range cols {
		if _, dup := seen[c.Name]; dup {
			return fmt.Errorf("%w: duplicate column name %q", ErrInvalidRecord, c.Name)
		}
		seen[c.Name] = struct{}{}
	}
	return nil
}

// appendTableNames appends `"schema":"...","<key>":"..."`.
func appendTableNames(b []byte, key string, n TableName) ([]byte, error) {
	var bad int
	if b, bad = appendString(append(b, `"schema":`...), n.Schema); bad >= 0 {
		return b, fmt.Errorf("schema name: %w", utf8Error(bad))
	}
	if b, bad = appendString(appendKey(b, key), n.Name); bad >= 0 {
		return b, fmt.Errorf("table name: %w", utf8Error(bad))
	}
	return b, nil
}

// cloneTable copies t deeply enough that the caller may change or reuse it.
func cloneTable(t *Table) *Table {
	c := *t
	c.Columns = slices.Clone(t.Columns)
	c.PrimaryKey = slices.Clone(t.PrimaryKey)
	c.IdentityKey = slices.Clone(t.IdentityKey)
	if t.PartitionOf != nil {
		p := *t.PartitionOf
		c.PartitionOf = &p
	}
	return &c
}

// table returns the latest table record written for name, or nil.
func (e *Encoder) table(name TableName) *encTable {
	if l := e.last; l != nil && l.t.Name == name.Name && l.t.Schema == name.Schema {
		return l
	}
	et := e.tables[name]
	if et != nil {
		e.last = et
	}
	return et
}

// WriteRow writes a snapshot row of the named table, whose table record must
// have been written; row must have one value per column, none of them
// [Unchanged].
func (e *Encoder) WriteRow(table TableName, row Row) error {
	const rec = "row"
	if err := e.begin(rec, true); err != nil {
		return err
	}
	if !e.kind.holdsRows() {
		return &EncodeError{Record: rec, Table: table, Err: fmt.Errorf("%w: a %s stream holds changes, not rows", ErrOrder, e.kind)}
	}
	et := e.table(table)
	if et == nil {
		return &EncodeError{Record: rec, Table: table, Err: fmt.Errorf("%w: write its table record first", ErrUnknownTable)}
	}
	if len(row) != len(et.t.Columns) {
		return &EncodeError{Record: rec, Table: table, Err: fmt.Errorf("%w: %d values for %d columns", ErrInvalidRecord, len(row), len(et.t.Columns))}
	}
	b := append(e.buf, ',')
	b = append(b, et.names...)
	b = appendKey(b, "values")
	b, err := appendValues(b, rec, et.t, row, false)
	if err != nil {
		return err
	}
	e.buf = append(b, '}')
	emit := e.emit
	if e.sinceCheck >= checkpointBytes {
		emit = e.emitChecked
	}
	if err := emit(); err != nil {
		return err
	}
	e.count++
	return nil
}

// appendValues appends row as a JSON array: text as strings, NULL and
// unchanged values as null (unchanged refused unless allowUnchanged).
func appendValues(b []byte, rec string, t *Table, row Row, allowUnchanged bool) ([]byte, error) {
	b = append(b, '[')
	for i, v := range row {
		if i > 0 {
			b = append(b, ',')
		}
		switch v.state {
		case statePresent:
			var bad int
			if b, bad = appendString(b, v.text); bad >= 0 {
				return b, &EncodeError{Record: rec, Table: t.TableName(), Column: t.Columns[i].Name, Err: utf8Error(bad)}
			}
		case stateUnchanged:
			if !allowUnchanged {
				return b, &EncodeError{Record: rec, Table: t.TableName(), Column: t.Columns[i].Name,
					Err: fmt.Errorf("%w: an unchanged TOAST value has no place here", ErrInvalidRecord)}
			}
			b = append(b, "null"...)
		default:
			b = append(b, "null"...)
		}
	}
	return append(b, ']'), nil
}

// WriteSequence writes the state of a source sequence, outside any
// transaction, in a stream of any kind (see [Sequence]).
func (e *Encoder) WriteSequence(s Sequence) error {
	const rec = "sequence"
	if err := e.begin(rec, true); err != nil {
		return err
	}
	name := s.TableName()
	if e.inTx {
		return &EncodeError{Record: rec, Table: name, Err: fmt.Errorf("%w: a sequence inside a transaction", ErrOrder)}
	}
	b, err := appendTableNames(append(e.buf, ','), "name", name)
	if err != nil {
		return &EncodeError{Record: rec, Table: name, Err: err}
	}
	b = strconv.AppendInt(appendKey(b, "value"), s.Value, 10)
	e.buf = append(appendBool(appendKey(b, "called"), s.Called), '}')
	if err := e.emitChecked(); err != nil {
		return err
	}
	e.count++
	return nil
}

// WriteEnd writes the end record, which closes the stream: end is where the
// stream ends (the Position to resume from). It then flushes. No transaction
// may be open.
func (e *Encoder) WriteEnd(end Position) error {
	const rec = "end"
	if err := e.begin(rec, true); err != nil {
		return err
	}
	if e.inTx {
		return &EncodeError{Record: rec, Err: fmt.Errorf("%w: a transaction is open (begin without commit)", ErrOrder)}
	}
	b := appendQuotedPosition(appendKey(e.buf, "position"), end)
	b = appendUint(appendKey(b, "records"), e.count)
	e.buf = append(b, '}')
	if err := e.emitChecked(); err != nil {
		return err
	}
	e.ended, e.end = true, end
	return e.Flush()
}

// WriteRecord writes a record as [Decoder.Next] returns it, so a stream can
// be filtered or copied: a RecordTable with WriteTable, a RecordRow with
// WriteRow, a RecordChange with WriteChange, a RecordSequence with
// WriteSequence and a RecordEnd with WriteEnd.
func (e *Encoder) WriteRecord(r Record) error {
	switch r.Type {
	case RecordTable:
		return e.WriteTable(r.Table)
	case RecordRow:
		return e.WriteRow(r.TableName(), r.Row)
	case RecordChange:
		if r.Change == nil {
			return &EncodeError{Record: "change", Err: fmt.Errorf("%w: nil change", ErrInvalidRecord)}
		}
		return e.WriteChange(r.Change)
	case RecordEnd:
		return e.WriteEnd(r.Position)
	case RecordSequence:
		if r.Sequence == nil {
			return &EncodeError{Record: "sequence", Err: fmt.Errorf("%w: nil sequence", ErrInvalidRecord)}
		}
		return e.WriteSequence(*r.Sequence)
	}
	return &EncodeError{Record: r.Type.String(), Err: fmt.Errorf("%w: unknown record type", ErrInvalidRecord)}
}

// appendOptString appends a string member unless val is empty.
func appendOptString(b []byte, key, val string) ([]byte, error) {
	if val == "" {
		return b, nil
	}
	b, bad := appendString(appendKey(b, key), val)
	if bad >= 0 {
		return b, utf8Error(bad)
	}
	return b, nil
}

func utf8Error(off int) error { return fmt.Errorf("%w at byte %d", ErrInvalidUTF8, off) }
