package siphontest

import (
	"os"
	"sort"
	"time"
)

// Option configures [Start] and [Launch].
type Option func(*config)

type config struct {
	private      bool
	tls          bool
	settings     map[string]string
	startTimeout time.Duration
	serverBin    string // a directory holding initdb and postgres; "" searches
}

func newConfig(opts []Option) config {
	cfg := config{
		startTimeout: 2 * time.Minute,
		serverBin:    os.Getenv(EnvServerBin),
		settings: map[string]string{
			"wal_level":             "logical",
			"max_replication_slots": "64",
			"max_wal_senders":       "64",
			"max_connections":       "200",
			"fsync":                 "off",
			"synchronous_commit":    "off",
			"full_page_writes":      "off",
			"wal_init_zero":         "off",
			"listen_addresses":      "127.0.0.1",
		},
	}
	for _, opt := range opts {
		opt(&cfg)
	}
	return cfg
}

// WithPrivateServer makes [Start] launch a server for the calling test alone,
// stopped when the test ends, instead of returning the shared one. Use it for
// tests that change server-wide state (settings, physical slots, restarts).
// It has no effect on [Launch], which always starts a new server.
func WithPrivateServer() Option { return func(c *config) { c.private = true } }

// WithSetting sets a server configuration parameter of a server that
// siphontest starts (ignored for SIPHON_TEST_DSN). Combine it with
// [WithPrivateServer] in tests, since the shared server is started once with
// the options of its first caller. wal_level defaults to logical; another
// value is for testing how code copes with a server that cannot decode
// changes.
func WithSetting(name, value string) Option {
	return func(c *config) { c.settings[name] = value }
}

// WithTLS makes a server that siphontest starts from local binaries accept
// SSL connections (ssl=on), with a self-signed ECDSA certificate for
// 127.0.0.1 and localhost made for it ([Server.CertFile]). The server
// accepts connections with and without SSL, so the DSN's sslmode decides;
// [Server.DSN] says sslmode=disable: change it to require (or to
// verify-full, with sslrootcert). Combine it with [WithPrivateServer] in
// tests. A server from SIPHON_TEST_DSN or Docker is used as it is; check
// SHOW ssl. Defaults to off: the server refuses SSL.
func WithTLS() Option { return func(c *config) { c.tls = true } }

// WithStartTimeout bounds how long starting a server may take. Defaults to
// 2 minutes.
func WithStartTimeout(d time.Duration) Option { return func(c *config) { c.startTimeout = d } }

// WithServerBin names the directory holding the initdb and postgres
// binaries of the server that siphontest starts, instead of the search on
// PATH and under /usr/lib/postgresql/*/bin: to test on another PostgreSQL
// release than the one installed. Without initdb and postgres there, starting
// fails (it never falls back to other binaries). When the test runs as root,
// the unprivileged user the server runs as must be able to read and execute
// the directory, its parents and the libraries beside it. Combine it with
// [WithPrivateServer] in tests, since the shared server is started once with
// the options of its first caller. Ignored for SIPHON_TEST_DSN. Defaults to
// the directory SIPHON_TEST_SERVER_BIN names ([EnvServerBin]), or when that
// is unset, the search.
func WithServerBin(dir string) Option { return func(c *config) { c.serverBin = dir } }

// sortedSettings returns the settings as "name=value", sorted by name.
func (c config) sortedSettings() []string {
	out := make([]string, 0, len(c.settings))
	for name, value := range c.settings {
		out = append(out, name+"="+value)
	}
	sort.Strings(out)
	return out
}
