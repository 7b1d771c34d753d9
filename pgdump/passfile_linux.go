package pgdump

import (
	"fmt"
	"os"
)

// inheritedPassfile is where the program finds the password file: its
// descriptor 3, the first of [exec.Cmd.ExtraFiles]. On Linux, opening
// /proc/self/fd/N opens the file anew, deleted or not, and stat gives
// the file's own mode, so libpq's checks (a plain file, 0600) pass; the
// parallel workers pg_dump and pg_restore fork inherit the descriptor.
const inheritedPassfile = "/proc/self/fd/3"

// writePassfile writes password to a password file in dir for one run of
// a program and returns the value of PGPASSFILE, the file the program
// inherits (as its first extra file), and the function that releases
// what is left once the program is gone. The file is unlinked before the
// program starts: it has a name only between its creation and that
// unlink, so a process killed while a program runs leaves no password on
// disk (one killed within that moment leaves a held file, which the next
// password file made in dir sweeps).
func writePassfile(dir, password string) (env string, inherit *os.File, release func(), err error) {
	path, held, err := createPassfile(dir, password)
	if err != nil {
		return "", nil, nil, err
	}
	if err := os.Remove(path); err != nil {
		held.Close()
		return "", nil, nil, fmt.Errorf("unlink password file: %w", err)
	}
	return inheritedPassfile, held, func() { held.Close() }, nil
}
