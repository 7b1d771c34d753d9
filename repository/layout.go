package repository

// The layout: the names of the repository's objects (see the package
// documentation, "Layout").

import (
	"crypto/rand"
	"encoding/base32"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/siphondb/siphon/canonical"
)

const (
	chainsDir      = "chains/"
	manifestPrefix = "manifest-"
	verifiedPrefix = "verified-"
	tombstoneName  = "expired.json"
	encSuffix      = ".enc"
	chainTimeFmt   = "20060102T150405.000Z"
)

var lowerBase32 = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// token returns n random lowercase base32 characters.
func token(n int) string {
	b := make([]byte, (n*5+7)/8)
	_, _ = rand.Read(b) // crypto/rand.Read never fails
	return lowerBase32.EncodeToString(b)[:n]
}

// newChainID returns a chain id that sorts by the time it was made: the
// UTC time to the millisecond, a dash and 6 random characters.
func newChainID(now time.Time) string {
	return now.UTC().Format(chainTimeFmt) + "-" + token(6)
}

// validChainID reports whether id looks like a chain id (it is used in
// object names).
func validChainID(id string) bool {
	t, rest, ok := strings.Cut(id, "-")
	if !ok || len(rest) != 6 {
		return false
	}
	if _, err := time.Parse(chainTimeFmt, t); err != nil {
		return false
	}
	for _, c := range rest {
		if !(c >= 'a' && c <= 'z' || c >= '2' && c <= '7') {
			return false
		}
	}
	return true
}

// chainPrefix is the prefix of the objects of chain id.
func chainPrefix(id string) string { return chainsDir + id + "/" }

// suffix is ".enc" for an encrypted repository, "" otherwise.
func suffix(encrypted bool) string {
	if encrypted {
		return encSuffix
	}
	return ""
}

// manifestName is the key of generation gen of chain id's manifest.
func manifestName(id string, gen int, encrypted bool) string {
	return fmt.Sprintf("%s%s%04d.json%s", chainPrefix(id), manifestPrefix, gen, suffix(encrypted))
}

// parseManifestName returns the generation of a manifest's base name
// ("manifest-0003.json" or "manifest-0003.json.enc").
func parseManifestName(base string) (gen int, encrypted, ok bool) {
	rest, found := strings.CutPrefix(base, manifestPrefix)
	if !found {
		return 0, false, false
	}
	rest, encrypted = strings.CutSuffix(rest, encSuffix)
	rest, isJSON := strings.CutSuffix(rest, ".json")
	if !isJSON {
		return 0, false, false
	}
	n, err := strconv.Atoi(rest)
	if err != nil || n < 1 || len(rest) < 4 {
		return 0, false, false
	}
	return n, encrypted, true
}

// linkObjectName is the key of link n of chain id: its number, its role,
// a token of the writer's attempt (two writers never write the same
// name), the format's extension, and ".enc" when encrypted.
func linkObjectName(id string, n int, kind canonical.Kind, body canonical.BodyFormat, compressed, encrypted bool) string {
	role, ext := "incr", "jsonl"
	if kind == canonical.KindDump {
		role, ext = "base", "dump"
		if body == canonical.BodyPgDumpDirectoryTar {
			ext = "tar"
		}
	}
	if compressed {
		ext += ".zst"
	}
	return fmt.Sprintf("%s%04d-%s-%s.%s%s", chainPrefix(id), n, role, token(6), ext, suffix(encrypted))
}

// verifiedName is the key of a verification record of chain id written at
// t.
func verifiedName(id string, t time.Time, encrypted bool) string {
	return fmt.Sprintf("%s%s%s-%s.json%s", chainPrefix(id), verifiedPrefix, t.UTC().Format("20060102T150405.000000000Z"), token(4), suffix(encrypted))
}

// objectName returns the part of a key the repository binds an object to:
// from "chains/" on, whatever prefix the bucket has.
func objectName(key string) string {
	if i := strings.Index(key, chainsDir); i > 0 {
		return key[i:]
	}
	return key
}

// baseName returns the last element of a key.
func baseName(key string) string {
	return key[strings.LastIndexByte(key, '/')+1:]
}
