package canonical

import (
	"bytes"
	"encoding/hex"
	"fmt"
	"hash/crc32"
)

// Checksums. Every stream an [Encoder] writes is checked: a running
// CRC-32C (Castagnoli) covers every byte of the stream from the first byte
// of its header, and checkpoint records end with a member
//
//	,"sum":"xxxxxxxx"}
//
// whose eight lowercase hex digits are the running CRC-32C of the stream up
// to and including `"sum":"` of that line: the checkpoint vouches for
// itself and for everything before it. The header (which also names the
// algorithm, "checksum":"crc32c"), every commit, every change outside a
// transaction, every sequence, the end record and, in snapshots, a row
// every checkpointBytes are checkpoints. A stream is checked when its
// header carries a sum; the Decoder then verifies every checkpoint as it
// reads it and requires one on the header, commits, sequences and the end
// record, so any
// changed, missing, added or reordered byte (a record, a transaction, a
// digit) is found at the next checkpoint at the latest, before a reader
// that applies whole transactions has applied it. CRC-32C catches every
// change of up to 32 bits within the stream, and any other change with
// probability 1 - 2^-32, at a cost of well under a percent of encoding.

// checksumName is the algorithm a checked stream's header names.
const checksumName = "crc32c"

// checkpointBytes is how many bytes of rows a snapshot holds at most
// between two checkpoints.
const checkpointBytes = 256 << 10

// sumKey starts the sum member; sumTail is what follows it: eight hex
// digits, the closing quote and brace.
const (
	sumKey     = `,"sum":"`
	sumTailLen = 8 + len(`"}`)
	sumLen     = len(sumKey) + sumTailLen
)

// checked finishes a record that ends with '}' as a checkpoint: it appends
// the sum member, computed from running, the CRC-32C of the stream so far,
// and returns the line and the sum.
func checked(record []byte, running uint32) ([]byte, uint32) {
	line := append(record[:len(record)-1], sumKey...)
	sum := crc32.Update(running, castagnoli, line)
	line = hex.AppendEncode(line, []byte{byte(sum >> 24), byte(sum >> 16), byte(sum >> 8), byte(sum)})
	return append(line, '"', '}'), sum
}

// link is the Link of a checked stream that ends at end with the sum of
// its end record.
func link(sum uint32, end Position) string {
	return fmt.Sprintf("%s:%08x@%v", checksumName, sum, end)
}

// splitSum tells whether line ends with a sum member and returns the part
// its sum covers (through `"sum":"`) and the sum.
func splitSum(line []byte) (covered []byte, sum uint32, ok bool) {
	n := len(line)
	if n < sumLen || !bytes.Equal(line[n-sumLen:n-sumTailLen], []byte(sumKey)) || line[n-2] != '"' || line[n-1] != '}' {
		return nil, 0, false
	}
	var digits [4]byte
	if text := line[n-sumTailLen : n-2]; !isLowerHex(text) {
		return nil, 0, false
	} else if _, err := hex.Decode(digits[:], text); err != nil {
		return nil, 0, false
	}
	sum = uint32(digits[0])<<24 | uint32(digits[1])<<16 | uint32(digits[2])<<8 | uint32(digits[3])
	return line[:n-sumTailLen], sum, true
}

func isLowerHex(b []byte) bool {
	for _, c := range b {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}
