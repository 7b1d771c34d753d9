package canonical

import (
	"fmt"
)

// recordType is the internal classification of a line's "t".
type recordType uint8

const (
	rtHeader recordType = iota + 1
	rtTable
	rtRow
	rtChange
	rtEnd
	rtSequence
)

// The members each record type reads, and those it requires.
var (
	headerFields = fields(fT, fFormat, fVersion, fKind, fEngine, fPosition, fEnd, fSystemID,
		fTimeline, fSlot, fServerVersion, fCreated, fChecksum, fPrevious, fAuth, fKey)
	headerRequired = fields(fFormat, fVersion, fKind, fPosition)
	tableFields    = fields(fT, fSchema, fName, fColumns, fPrimaryKey, fIdentityKey,
		fReplicaIdentity, fPartitioned, fPartitionOf)
	tableRequired     = fields(fSchema, fName, fColumns)
	rowFields         = fields(fT, fSchema, fTable, fValues)
	rowRequired       = fields(fSchema, fTable, fValues)
	txFields          = fields(fT, fXID, fPosition, fCommitTime)
	txRequired        = fields(fXID, fPosition, fCommitTime)
	rowChangeFields   = fields(fT, fSchema, fTable, fXID, fPosition, fNew, fOld, fUnchanged, fOldUnchanged)
	rowChangeRequired = fields(fSchema, fTable, fXID, fPosition)
	truncateFields    = fields(fT, fXID, fPosition, fTables, fCascade, fRestartIdentity)
	truncateRequired  = fields(fXID, fPosition, fTables)
	messageFields     = fields(fT, fXID, fPosition, fTransactional, fPrefix, fContent)
	messageRequired   = fields(fXID, fPosition, fTransactional, fPrefix, fContent)
	ddlFields         = fields(fT, fXID, fPosition, fTag, fStatement, fSearchPath, fRole, fProblem, fObjects, fSessionRole, fSuperuser, fInstaller)
	ddlRequired       = fields(fXID, fPosition, fTag, fStatement, fSearchPath)
	sequenceFields    = fields(fT, fSchema, fName, fValue, fCalled)
	sequenceRequired  = fields(fSchema, fName, fValue, fCalled)
	endFields         = fields(fT, fPosition, fRecords)
	endRequired       = fields(fPosition, fRecords)
)

// record decodes one line after the header's.
func (d *Decoder) record(line []byte) (Record, error) {
	d.sc.reset(line)
	typ, op, name, err := d.recordType()
	if err != nil {
		return Record{}, d.fail(err, "")
	}
	if err := d.checkOrder(typ, name); err != nil {
		return Record{}, d.fail(err, name)
	}
	var rec Record
	switch typ {
	case rtHeader:
		err = d.headerRecord()
	case rtTable:
		rec, err = d.tableRecord()
	case rtRow:
		rec, err = d.rowRecord()
	case rtChange:
		rec, err = d.changeRecord(op)
	case rtEnd:
		rec, err = d.endRecord()
	case rtSequence:
		rec, err = d.sequenceRecord()
	}
	if err != nil {
		return Record{}, d.fail(err, name)
	}
	return rec, nil
}

// recordType reads the line's "t" member: first, as the Encoder writes it,
// or anywhere in the object.
func (d *Decoder) recordType() (recordType, Op, string, error) {
	s := &d.sc
	if s.peek() == 0 && s.pos == len(s.data) {
		return 0, 0, "", s.syntax("blank line")
	}
	if err := s.expect('{'); err != nil {
		return 0, 0, "", err
	}
	var typ []byte
	first := true
	more, err := s.next(&first, '}')
	if err != nil {
		return 0, 0, "", err
	}
	key := []byte(nil)
	if more {
		if key, err = s.key(); err != nil {
			return 0, 0, "", err
		}
	}
	if string(key) == "t" {
		if typ, err = d.stringField(); err != nil {
			return 0, 0, "", fmt.Errorf("t: %w", err)
		}
	} else {
		if err := d.scanFields(fT.bit()); err != nil {
			return 0, 0, "", err
		}
		if d.f.seen&fT.bit() == 0 {
			return 0, 0, "", fmt.Errorf("%w: no \"t\" member (the record type)", ErrInvalidRecord)
		}
		typ = d.f.typ
	}
	switch string(typ) {
	case "header":
		return rtHeader, 0, "header", nil
	case "table":
		return rtTable, 0, "table", nil
	case "row":
		return rtRow, 0, "row", nil
	case "end":
		return rtEnd, 0, "end", nil
	case "sequence":
		return rtSequence, 0, "sequence", nil
	}
	if op, ok := ParseOp(string(typ)); ok {
		return rtChange, op, op.String(), nil
	}
	return 0, 0, "", fmt.Errorf("%w: unknown record type %q", ErrInvalidRecord, truncateText(typ))
}

// checkOrder checks that a record of this type may come here.
func (d *Decoder) checkOrder(typ recordType, name string) error {
	switch {
	case !d.haveHeader && typ != rtHeader:
		return fmt.Errorf("%w: the stream starts with a %s record, not a header", ErrOrder, name)
	case d.haveHeader && typ == rtHeader:
		return fmt.Errorf("%w: a second header", ErrOrder)
	case typ == rtRow && !d.header.Kind.holdsRows():
		return fmt.Errorf("%w: a row in a %s stream (rows belong in snapshots)", ErrOrder, d.header.Kind)
	case typ == rtChange && d.header.Kind.holdsRows():
		return fmt.Errorf("%w: a %s record in a snapshot stream", ErrOrder, name)
	}
	return nil
}

// require reports the first field of mask the record lacks.
func (d *Decoder) require(mask uint64) error {
	missing := mask &^ d.f.seen
	if missing == 0 {
		return nil
	}
	for f := field(0); f < fUnknown; f++ {
		if missing&f.bit() != 0 {
			return fmt.Errorf("%w: missing field %q", ErrInvalidRecord, f)
		}
	}
	return nil
}

// scan reads the record's members and checks the required ones.
func (d *Decoder) scan(allowed, required uint64) error {
	if err := d.scanFields(allowed); err != nil {
		return err
	}
	return d.require(required)
}

func (d *Decoder) headerRecord() error {
	// The version comes first: a later version may change anything else.
	if err := d.scan(fields(fT, fFormat, fVersion), fields(fFormat, fVersion)); err != nil {
		return err
	}
	f := &d.f
	if string(f.format) != FormatName {
		return fmt.Errorf("%w: format %q, want %q", ErrInvalidRecord, truncateText(f.format), FormatName)
	}
	if string(f.version) != "1" {
		return fmt.Errorf("%w: version %s (this package reads version %d; a newer siphon may read it)",
			ErrUnsupportedVersion, truncateText(f.version), FormatVersion)
	}
	if err := d.scan(headerFields, headerRequired); err != nil {
		return err
	}
	h := Header{
		Kind:          Kind(f.kind),
		Engine:        string(f.engine),
		Start:         f.position,
		End:           f.end,
		SystemID:      string(f.systemID),
		Timeline:      f.timeline,
		Slot:          string(f.slot),
		ServerVersion: string(f.serverVersion),
		Created:       f.created,
		Previous:      string(f.previous),
		Checked:       d.summed,
		KeyID:         string(f.key),
	}
	if !h.Kind.valid() {
		return fmt.Errorf("%w: kind %q is not snapshot, incremental or changes", ErrInvalidRecord, truncateText(f.kind))
	}
	switch named := f.seen&fChecksum.bit() != 0; {
	case d.summed && string(f.checksum) != checksumName:
		return fmt.Errorf("%w: checksum %q, want %q", ErrChecksum, truncateText(f.checksum), checksumName)
	case named && !d.summed:
		return fmt.Errorf("%w: the header names %s checksums but carries no sum: it was changed", ErrChecksum, truncateText(f.checksum))
	}
	if err := d.checkAuthMembers(); err != nil {
		return err
	}
	d.header = h
	d.haveHeader = true
	return nil
}

func (d *Decoder) tableRecord() (Record, error) {
	if err := d.scan(tableFields, tableRequired); err != nil {
		return Record{}, err
	}
	f := &d.f
	t := &Table{
		Schema:          string(f.schema),
		Name:            string(f.name),
		Columns:         f.columns,
		PrimaryKey:      f.primaryKey,
		IdentityKey:     f.identityKey,
		ReplicaIdentity: ReplicaIdentity(f.replicaIdentity),
		Partitioned:     f.partitioned,
		PartitionOf:     f.partitionOf,
	}
	if len(t.Columns) == 0 {
		t.Columns = nil
	}
	if err := checkColumns(t.Columns); err != nil {
		return Record{}, fmt.Errorf("columns of %s: %w", t.TableName(), err)
	}
	for _, k := range [...]struct {
		f    field
		cols []string
	}{{fPrimaryKey, t.PrimaryKey}, {fIdentityKey, t.IdentityKey}} {
		for _, c := range k.cols {
			if t.ColumnIndex(c) < 0 {
				return Record{}, fmt.Errorf("%w: %s names %q, not a column of %s", ErrInvalidRecord, k.f, c, t.TableName())
			}
		}
	}
	m := d.tables[t.Schema]
	if m == nil {
		m = make(map[string]*Table)
		d.tables[t.Schema] = m
	}
	m[t.Name] = t
	d.last = t
	d.count++
	return Record{Type: RecordTable, Table: t}, nil
}

// lookup returns the latest table record for a table, or nil.
func (d *Decoder) lookup(schema, name []byte) *Table {
	if t := d.last; t != nil && t.Name == string(name) && t.Schema == string(schema) {
		return t
	}
	t := d.tables[string(schema)][string(name)]
	if t != nil {
		d.last = t
	}
	return t
}

// tableOf returns the table a row or row change names.
func (d *Decoder) tableOf(what string) (*Table, error) {
	t := d.lookup(d.f.schema, d.f.table)
	if t == nil {
		return nil, fmt.Errorf("%w: %s for %s before any table record for it", ErrUnknownTable, what,
			TableName{Schema: string(d.f.schema), Name: string(d.f.table)})
	}
	return t, nil
}

func (d *Decoder) rowRecord() (Record, error) {
	if err := d.scan(rowFields, rowRequired); err != nil {
		return Record{}, err
	}
	t, err := d.tableOf("a row")
	if err != nil {
		return Record{}, err
	}
	if len(d.newSpans) != len(t.Columns) {
		return Record{}, fmt.Errorf("%w: %d values for the %d columns of %s", ErrInvalidRecord,
			len(d.newSpans), len(t.Columns), t.TableName())
	}
	d.count++
	return Record{Type: RecordRow, Table: t, Row: makeRow(d.newSpans, string(d.arena))}, nil
}

// makeRow builds a Row whose texts share one string.
func makeRow(spans []span, text string) Row {
	row := make(Row, len(spans))
	for i, sp := range spans {
		row[i] = Value{text: text[sp.start:sp.end], state: sp.state}
	}
	return row
}

func (d *Decoder) sequenceRecord() (Record, error) {
	if err := d.scan(sequenceFields, sequenceRequired); err != nil {
		return Record{}, err
	}
	if d.inTx {
		return Record{}, fmt.Errorf("%w: a sequence inside a transaction", ErrOrder)
	}
	f := &d.f
	d.count++
	return Record{Type: RecordSequence, Sequence: &Sequence{
		Schema: string(f.schema), Name: string(f.name), Value: f.value, Called: f.called}}, nil
}

func (d *Decoder) endRecord() (Record, error) {
	if err := d.scan(endFields, endRequired); err != nil {
		return Record{}, err
	}
	if d.inTx {
		return Record{}, fmt.Errorf("%w: the stream ends inside a transaction (begin without commit)", ErrOrder)
	}
	if d.f.records != d.count {
		return Record{}, fmt.Errorf("%w: the end record counts %d records, the stream has %d",
			ErrInvalidRecord, d.f.records, d.count)
	}
	d.ended, d.endPos = true, d.f.position
	return Record{Type: RecordEnd, Position: d.f.position, Count: d.count}, nil
}
