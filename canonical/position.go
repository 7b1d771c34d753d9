package canonical

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Position is a point on the source database's timeline: a PostgreSQL WAL
// location (LSN). Snapshots, change streams and backups all carry one, so they
// can be chained with no gap and no duplicate.
//
// A resume Position is the end of a committed transaction (the Position of an
// [OpCommit] change) or a snapshot's consistent point. The zero Position means
// "wherever the replication slot stands".
type Position uint64

// ErrInvalidPosition is returned (wrapped) by [ParsePosition] and
// [Position.UnmarshalText] for text that is not an LSN.
var ErrInvalidPosition = errors.New("invalid position")

// ParsePosition parses the PostgreSQL LSN notation "16/B374D848": two
// hexadecimal numbers of at most 8 digits each, the high and low 32 bits.
func ParsePosition(s string) (Position, error) {
	hi, lo, ok := strings.Cut(s, "/")
	if !ok || hi == "" || lo == "" || len(hi) > 8 || len(lo) > 8 {
		return 0, fmt.Errorf("%w: %q is not of the form XXXXXXXX/XXXXXXXX", ErrInvalidPosition, s)
	}
	h, err := strconv.ParseUint(hi, 16, 32)
	if err != nil {
		return 0, fmt.Errorf("%w: %q: high half is not hexadecimal", ErrInvalidPosition, s)
	}
	l, err := strconv.ParseUint(lo, 16, 32)
	if err != nil {
		return 0, fmt.Errorf("%w: %q: low half is not hexadecimal", ErrInvalidPosition, s)
	}
	return Position(h<<32 | l), nil
}

// String formats p the way PostgreSQL prints an LSN, for example "16/B374D848".
func (p Position) String() string {
	return fmt.Sprintf("%X/%X", uint32(p>>32), uint32(p))
}

// IsZero reports whether p is the zero Position.
func (p Position) IsZero() bool { return p == 0 }

// Compare returns -1 when p is before q, +1 when it is after, and 0 when they
// are equal.
func (p Position) Compare(q Position) int {
	switch {
	case p < q:
		return -1
	case p > q:
		return 1
	}
	return 0
}

// MarshalText implements [encoding.TextMarshaler] with [Position.String].
func (p Position) MarshalText() ([]byte, error) { return []byte(p.String()), nil }

// UnmarshalText implements [encoding.TextUnmarshaler] with [ParsePosition].
func (p *Position) UnmarshalText(text []byte) error {
	v, err := ParsePosition(string(text))
	if err != nil {
		return err
	}
	*p = v
	return nil
}

// AppendText implements [encoding.TextAppender]: it appends [Position.String]'s
// text to b without allocating.
func (p Position) AppendText(b []byte) ([]byte, error) { return appendPosition(b, p), nil }
