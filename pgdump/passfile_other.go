//go:build !linux

package pgdump

import "os"

// writePassfile writes password to a password file in dir for one run of
// a program and returns the value of PGPASSFILE, the file the program
// inherits (none here: the program opens the file by its path), and the
// function that removes the file once the program is gone. The file is
// held (see holdTemp): if this process dies first, the next password file
// made in dir removes it.
func writePassfile(dir, password string) (env string, inherit *os.File, release func(), err error) {
	path, held, err := createPassfile(dir, password)
	if err != nil {
		return "", nil, nil, err
	}
	return path, nil, func() {
		os.Remove(path)
		held.Close()
	}, nil
}
