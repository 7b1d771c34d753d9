package pgdump

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/siphondb/siphon/internal/dsn"
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
	// SSLRootCert, SSLCert, SSLKey, SSLCRL and SSLCRLDir are file and
	// directory paths, as libpq's sslrootcert, sslcert, sslkey, sslcrl and
	// sslcrldir.
	SSLRootCert, SSLCert, SSLKey, SSLCRL, SSLCRLDir string
	// SSLSNI, SSLMinProtocolVersion and SSLMaxProtocolVersion are libpq's
	// sslsni, ssl_min_protocol_version and ssl_max_protocol_version.
	SSLSNI, SSLMinProtocolVersion, SSLMaxProtocolVersion string
	// GSSEncMode, ChannelBinding, KerberosServiceName and RequirePeer are
	// libpq's gssencmode, channel_binding, krbsrvname and requirepeer.
	GSSEncMode, ChannelBinding, KerberosServiceName, RequirePeer string
	// TargetSessionAttrs is libpq's target_session_attrs (any,
	// read-write, read-only, primary, standby, prefer-standby).
	TargetSessionAttrs string
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
// quotes the string, which may hold a password; it says which part is
// wrong. It is the same error as siphon.ErrInvalidDSN.
var ErrInvalidDSN = dsn.ErrInvalid

// ParseDSN fills a Conn from a connection string, URL
// ("postgres://user:pw@host:5432/db?sslmode=require") or keyword/value
// ("host=... dbname=..."), resolved the way pgx resolves it: PG*
// environment variables, the password file and service files fill what
// the string leaves out.
func ParseDSN(s string) (Conn, error) {
	config, err := pgconn.ParseConfig(s)
	if err != nil {
		// The parse error may quote the DSN, password included.
		return Conn{}, fmt.Errorf("pgdump: %w: %s", ErrInvalidDSN, dsn.Problem(s))
	}
	raw, err := rawSettings(s)
	if err != nil {
		return Conn{}, fmt.Errorf("pgdump: %w: %v", ErrInvalidDSN, err)
	}
	c := Conn{
		Host:            config.Host,
		Port:            config.Port,
		Database:        config.Database,
		User:            config.User,
		Password:        config.Password,
		ApplicationName: config.RuntimeParams["application_name"],
	}
	for _, s := range c.settings() {
		if v, ok := raw[s.keyword]; ok {
			*s.value = v
		} else {
			*s.value = os.Getenv(s.env)
		}
	}
	return c, nil
}

// setting is a Conn field that is one libpq keyword, and the environment
// variable that sets it.
type setting struct {
	keyword, env string
	value        *string
}

// settings lists c's fields that ParseDSN takes from the connection
// string's keyword, or else from this process's environment variable, and
// that reach the program through that variable.
func (c *Conn) settings() []setting {
	return []setting{
		{"sslmode", "PGSSLMODE", &c.SSLMode},
		{"sslrootcert", "PGSSLROOTCERT", &c.SSLRootCert},
		{"sslcert", "PGSSLCERT", &c.SSLCert},
		{"sslkey", "PGSSLKEY", &c.SSLKey},
		{"sslcrl", "PGSSLCRL", &c.SSLCRL},
		{"sslcrldir", "PGSSLCRLDIR", &c.SSLCRLDir},
		{"sslsni", "PGSSLSNI", &c.SSLSNI},
		{"ssl_min_protocol_version", "PGSSLMINPROTOCOLVERSION", &c.SSLMinProtocolVersion},
		{"ssl_max_protocol_version", "PGSSLMAXPROTOCOLVERSION", &c.SSLMaxProtocolVersion},
		{"gssencmode", "PGGSSENCMODE", &c.GSSEncMode},
		{"channel_binding", "PGCHANNELBINDING", &c.ChannelBinding},
		{"krbsrvname", "PGKRBSRVNAME", &c.KerberosServiceName},
		{"requirepeer", "PGREQUIREPEER", &c.RequirePeer},
		{"target_session_attrs", "PGTARGETSESSIONATTRS", &c.TargetSessionAttrs},
		{"options", "PGOPTIONS", &c.Options},
		{"connect_timeout", "PGCONNECT_TIMEOUT", &c.ConnectTimeout},
	}
}

// rawSettings reads the keywords a connection string sets, without
// resolving anything. Errors name no value.
func rawSettings(s string) (map[string]string, error) {
	if strings.HasPrefix(s, "postgres://") || strings.HasPrefix(s, "postgresql://") {
		u, err := url.Parse(s)
		if err != nil {
			return nil, errors.New("not a valid URL")
		}
		settings := map[string]string{}
		for k, v := range u.Query() {
			settings[k] = v[len(v)-1]
		}
		return settings, nil
	}
	return keywordValues(s)
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

// otherConnVariables are the libpq environment variables that choose a
// connection beyond Conn.settings' (which also choose one); the child gets
// only those Conn sets.
var otherConnVariables = []string{
	"PGHOST", "PGHOSTADDR", "PGPORT", "PGDATABASE", "PGUSER", "PGPASSWORD", "PGPASSFILE",
	"PGSERVICE", "PGSERVICEFILE", "PGREQUIRESSL", "PGAPPNAME", "PGGSSLIB", "PGSSLCOMPRESSION",
}

// environ returns this process's environment without its connection
// variables, plus c's (the password excepted: see passfile).
func (c Conn) environ(passfile string) []string {
	settings := c.settings()
	env := make([]string, 0, len(os.Environ())+len(settings)+6)
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if !isConnVariable(name, settings) {
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
	add("PGAPPNAME", c.ApplicationName)
	for _, s := range settings {
		add(s.env, *s.value)
	}
	// Without a password, point PGPASSFILE at nothing so that the user's
	// ~/.pgpass cannot answer for a role Conn did not give a password.
	if passfile == "" {
		passfile = os.DevNull
	}
	add("PGPASSFILE", passfile)
	return env
}

func isConnVariable(name string, settings []setting) bool {
	for _, s := range settings {
		if name == s.env {
			return true
		}
	}
	return slices.Contains(otherConnVariables, name)
}
