package pgdump

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// Conn says which database a program connects to, and as whom. Every
// field reaches the program through its environment (PGHOST, PGPORT,
// PGUSER, PGDATABASE, PGSSLMODE...), never its argv; the password goes in
// a password file readable by the owner only (PGPASSFILE): on Linux one
// the program inherits open and that is unlinked before it starts,
// elsewhere one removed when the program exits. The connection variables
// of this process's own environment (PGHOST, PGSERVICE, PGPASSWORD...) are
// not passed on: Conn alone decides. Empty fields are left to libpq's
// defaults.
type Conn struct {
	// Host is a host name, an IP address, or a Unix-domain socket directory.
	Host string
	// Port is the server's port; 0 means libpq's default (5432).
	Port uint16
	// Database is the database name, taken as a name (never expanded as
	// a connection string).
	Database string
	// User is the role to connect as.
	User string
	// Password is the role's password; empty for none.
	Password string
	// SSLMode is libpq's sslmode (disable, allow, prefer, require,
	// verify-ca, verify-full); empty means libpq's default, prefer.
	SSLMode string
	// SSLRootCert, SSLCert, SSLKey and SSLCRL are file paths, as libpq's
	// sslrootcert, sslcert, sslkey and sslcrl.
	SSLRootCert, SSLCert, SSLKey, SSLCRL string
	// ApplicationName is shown in pg_stat_activity.
	ApplicationName string
	// Options are libpq's options: command-line options for the server
	// session, such as "-c search_path=app".
	Options string
	// ConnectTimeout is libpq's connect_timeout, in seconds; empty means
	// wait indefinitely.
	ConnectTimeout string
}

// ErrInvalidDSN means a connection string does not parse. The error never
// quotes the string, which may hold a password.
var ErrInvalidDSN = errors.New("pgdump: invalid connection string")

// ParseDSN fills a Conn from a connection string, URL
// ("postgres://user:pw@host:5432/db?sslmode=require") or keyword/value
// ("host=... dbname=..."), resolved the way pgx resolves it: PG*
// environment variables, the password file and service files fill what
// the string leaves out.
func ParseDSN(dsn string) (Conn, error) {
	config, err := pgconn.ParseConfig(dsn)
	if err != nil {
		return Conn{}, fmt.Errorf("%w: write it as postgres://user@host:5432/dbname?sslmode=require or host=h dbname=d user=u", ErrInvalidDSN)
	}
	raw, err := rawSettings(dsn)
	if err != nil {
		return Conn{}, fmt.Errorf("%w: %v", ErrInvalidDSN, err)
	}
	setting := func(key, env string) string {
		if v, ok := raw[key]; ok {
			return v
		}
		return os.Getenv(env)
	}
	return Conn{
		Host:            config.Host,
		Port:            config.Port,
		Database:        config.Database,
		User:            config.User,
		Password:        config.Password,
		SSLMode:         setting("sslmode", "PGSSLMODE"),
		SSLRootCert:     setting("sslrootcert", "PGSSLROOTCERT"),
		SSLCert:         setting("sslcert", "PGSSLCERT"),
		SSLKey:          setting("sslkey", "PGSSLKEY"),
		SSLCRL:          setting("sslcrl", "PGSSLCRL"),
		ApplicationName: config.RuntimeParams["application_name"],
		Options:         setting("options", "PGOPTIONS"),
		ConnectTimeout:  setting("connect_timeout", "PGCONNECT_TIMEOUT"),
	}, nil
}

// rawSettings reads the keywords a connection string sets, without
// resolving anything. Errors name no value.
func rawSettings(dsn string) (map[string]string, error) {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		u, err := url.Parse(dsn)
		if err != nil {
			return nil, errors.New("not a valid URL")
		}
		settings := map[string]string{}
		for k, v := range u.Query() {
			settings[k] = v[len(v)-1]
		}
		return settings, nil
	}
	return keywordValues(dsn)
}

// keywordValues parses libpq's keyword = value syntax: values are bare
// words or single-quoted, with backslash escapes in both.
func keywordValues(s string) (map[string]string, error) {
	settings := map[string]string{}
	s = strings.TrimSpace(s)
	for s != "" {
		key, rest, ok := strings.Cut(s, "=")
		if !ok {
			return nil, errors.New(`a keyword without "="`)
		}
		key = strings.TrimSpace(key)
		rest = strings.TrimLeft(rest, " \t\n\r\v\f")
		quoted := strings.HasPrefix(rest, "'")
		if quoted {
			rest = rest[1:]
		}
		var b strings.Builder
		i := 0
		for ; i < len(rest); i++ {
			c := rest[i]
			if quoted && c == '\'' || !quoted && strings.IndexByte(" \t\n\r\v\f", c) >= 0 {
				break
			}
			if c == '\\' && i+1 < len(rest) {
				i++
				c = rest[i]
			}
			b.WriteByte(c)
		}
		if quoted {
			if i == len(rest) {
				return nil, fmt.Errorf("unterminated quoted value of %s", strconv.Quote(key))
			}
			i++
		}
		settings[key] = b.String()
		s = strings.TrimLeft(rest[i:], " \t\n\r\v\f")
	}
	return settings, nil
}

// connVariables are the libpq environment variables that choose a
// connection; the child gets only the ones Conn sets.
var connVariables = []string{
	"PGHOST", "PGHOSTADDR", "PGPORT", "PGDATABASE", "PGUSER", "PGPASSWORD", "PGPASSFILE",
	"PGSERVICE", "PGSERVICEFILE", "PGSSLMODE", "PGREQUIRESSL", "PGSSLROOTCERT", "PGSSLCERT",
	"PGSSLKEY", "PGSSLCRL", "PGSSLCRLDIR", "PGAPPNAME", "PGTARGETSESSIONATTRS", "PGOPTIONS",
	"PGCONNECT_TIMEOUT",
}

// environ returns this process's environment without its connection
// variables, plus c's (the password excepted: see passfile).
func (c Conn) environ(passfile string) []string {
	env := make([]string, 0, len(os.Environ())+10)
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if !isConnVariable(name) {
			env = append(env, kv)
		}
	}
	add := func(name, value string) {
		if value != "" {
			env = append(env, name+"="+value)
		}
	}
	add("PGHOST", c.Host)
	if c.Port != 0 {
		add("PGPORT", strconv.Itoa(int(c.Port)))
	}
	add("PGDATABASE", c.Database)
	add("PGUSER", c.User)
	add("PGSSLMODE", c.SSLMode)
	add("PGSSLROOTCERT", c.SSLRootCert)
	add("PGSSLCERT", c.SSLCert)
	add("PGSSLKEY", c.SSLKey)
	add("PGSSLCRL", c.SSLCRL)
	add("PGAPPNAME", c.ApplicationName)
	add("PGOPTIONS", c.Options)
	add("PGCONNECT_TIMEOUT", c.ConnectTimeout)
	// Without a password, point PGPASSFILE at nothing so that the user's
	// ~/.pgpass cannot answer for a role Conn did not give a password.
	if passfile == "" {
		passfile = os.DevNull
	}
	add("PGPASSFILE", passfile)
	return env
}

func isConnVariable(name string) bool {
	for _, v := range connVariables {
		if name == v {
			return true
		}
	}
	return false
}
