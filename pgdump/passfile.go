package pgdump

import (
	"fmt"
	"os"
	"strings"
)

// createPassfile writes a password file (pgpass format, matching any host,
// port, database and user) readable by the owner only, in dir, and returns
// its path and the file held open (see holdTemp): if this process dies
// while the file has a name, the next password file made in dir removes
// it. The caller removes it and closes the held file.
func createPassfile(dir, password string) (string, *os.File, error) {
	path, held, err := holdTemp(dir, "siphon-pgpass-*", func(path string) error {
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return err
		}
		// Made 0600 already (a umask only takes bits away); say it for
		// libpq, which ignores a password file others can read.
		err = f.Chmod(0o600)
		if err == nil {
			escaped := strings.NewReplacer(`\`, `\\`, `:`, `\:`).Replace(password)
			_, err = f.WriteString("*:*:*:*:" + escaped + "\n")
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			os.Remove(path)
		}
		return err
	})
	if err != nil {
		return "", nil, fmt.Errorf("write password file: %w", err)
	}
	return path, held, nil
}
