package pgdump

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
)

// Version is a PostgreSQL release number, for example 15.4 or 9.6.24.
// Releases from 10 on have two numbers (major.minor); older ones three
// (9.6 is a major version). The zero Version means "unknown".
type Version struct {
	Major, Minor, Patch int
}

// ErrInvalidVersion is returned (wrapped) by [ParseVersion] for text that
// holds no PostgreSQL version number.
var ErrInvalidVersion = errors.New("pgdump: not a PostgreSQL version")

// versionPattern finds the first version number in text such as
// "pg_dump (PostgreSQL) 15.18 (Debian 15.18-0+deb12u1)", "16beta1" or
// "17devel".
var versionPattern = regexp.MustCompile(`(\d+)(?:\.(\d+))?(?:\.(\d+))?(devel|alpha\d*|beta\d*|rc\d*)?`)

// ParseVersion reads the first PostgreSQL version number in s: a bare
// version ("15.4", "9.6.24", "16beta1"), the server_version setting
// ("15.4 (Debian 15.4-1)") or a program's --version line
// ("pg_dump (PostgreSQL) 15.4"). A pre-release counts as its major's .0.
func ParseVersion(s string) (Version, error) {
	m := versionPattern.FindStringSubmatch(s)
	if m == nil {
		return Version{}, fmt.Errorf("%w: %q", ErrInvalidVersion, s)
	}
	var v Version
	v.Major, _ = strconv.Atoi(m[1])
	v.Minor, _ = strconv.Atoi(m[2])
	v.Patch, _ = strconv.Atoi(m[3])
	if v.Major == 0 {
		return Version{}, fmt.Errorf("%w: %q", ErrInvalidVersion, s)
	}
	return v, nil
}

// VersionFromNum converts the server_version_num setting (150004 for
// 15.4, 90624 for 9.6.24) to a Version.
func VersionFromNum(n int) Version {
	if n >= 100000 {
		return Version{Major: n / 10000, Minor: n % 10000}
	}
	return Version{Major: n / 10000, Minor: n / 100 % 100, Patch: n % 100}
}

// String formats v as PostgreSQL does: "15.4", "9.6.24".
func (v Version) String() string {
	if v.Major < 10 {
		return fmt.Sprintf("%d.%d.%d", v.Major, v.Minor, v.Patch)
	}
	return fmt.Sprintf("%d.%d", v.Major, v.Minor)
}

// IsZero reports whether v is the zero (unknown) Version.
func (v Version) IsZero() bool { return v == Version{} }

// Release returns v's major release as PostgreSQL names it: "15" for
// 15.4, "9.6" for 9.6.24.
func (v Version) Release() string {
	if v.Major < 10 {
		return fmt.Sprintf("%d.%d", v.Major, v.Minor)
	}
	return strconv.Itoa(v.Major)
}

// releaseKey orders major releases: 15 for 15.x, 9.06 scaled for 9.6.
func (v Version) releaseKey() int {
	if v.Major < 10 {
		return v.Major*100 + v.Minor
	}
	return v.Major * 100
}

// OlderRelease reports whether v's major release is older than w's: a
// pg_dump of an older release than its server refuses to dump it.
func (v Version) OlderRelease(w Version) bool { return v.releaseKey() < w.releaseKey() }

// Compare returns -1, 0 or +1 as v is older than, the same as, or newer
// than w.
func (v Version) Compare(w Version) int {
	for _, d := range [...]int{v.Major - w.Major, v.Minor - w.Minor, v.Patch - w.Patch} {
		switch {
		case d < 0:
			return -1
		case d > 0:
			return 1
		}
	}
	return 0
}
