// Package dsn says what is wrong with a PostgreSQL connection string that
// does not parse, without ever quoting a part that may hold a password, and
// reads the search_path a connection string gives its sessions.
package dsn

import (
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
)

// ErrInvalid means a connection string does not parse. The siphon and
// pgdump packages export it as their ErrInvalidDSN, so that either name
// matches a bad DSN given to either package.
var ErrInvalid = errors.New("invalid DSN")

// Problem says which part of dsn keeps it from parsing, in words that can
// be shown to anyone: it quotes a URL scheme, a port or the name of a
// keyword, never a value that may be a password or a user name.
func Problem(dsn string) string {
	s := strings.TrimSpace(dsn)
	if s == "" {
		return "it is empty"
	}
	if scheme, _, ok := strings.Cut(s, "://"); ok && !strings.ContainsAny(scheme, " =@:/") {
		return urlProblem(scheme, s)
	}
	return keywordProblem(s)
}

func urlProblem(scheme, s string) string {
	if scheme != "postgres" && scheme != "postgresql" {
		return fmt.Sprintf("the URL scheme is %q: write postgres:// or postgresql://", scheme)
	}
	u, err := url.Parse(s)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			return "the URL does not parse: " + ue.Err.Error()
		}
		return "the URL does not parse"
	}
	for _, host := range strings.Split(u.Host, ",") {
		if i := strings.LastIndexByte(host, ':'); i >= 0 && !strings.HasSuffix(host, "]") {
			if problem := portProblem(host[i+1:]); problem != "" {
				return problem
			}
		}
	}
	return "the URL does not parse as a PostgreSQL URL (postgres://user@host:5432/dbname?sslmode=require)"
}

func keywordProblem(s string) string {
	for i, word := range strings.Fields(s) {
		key, value, ok := strings.Cut(word, "=")
		switch {
		case !ok:
			return fmt.Sprintf("word %d is not keyword=value: write host=h port=5432 dbname=d user=u, or a URL postgres://user@host:5432/dbname", i+1)
		case key == "port":
			if problem := portProblem(value); problem != "" {
				return problem
			}
		}
	}
	return "it does not parse as keyword=value pairs (host=h port=5432 dbname=d user=u) or as a URL (postgres://user@host:5432/dbname)"
}

// portProblem says what is wrong with a port, or "" when nothing is.
func portProblem(port string) string {
	if port == "" {
		return ""
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return fmt.Sprintf("the port %q is not a number from 1 to 65535", port)
	}
	return ""
}
