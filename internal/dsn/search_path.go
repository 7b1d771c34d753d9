package dsn

import "strings"

// SearchPaths returns the search_path settings a session started with the
// runtime parameters params receives from its startup packet: each one of
// the options parameter (-c search_path=…, --search_path=…), then the
// search_path parameter. None when neither sets it. It decides whether
// the user chose a search_path; what the server made of it is the
// server's to say (current_schemas).
func SearchPaths(params map[string]string) []string {
	var paths []string
	for _, setting := range optionSettings(params["options"]) {
		name, value, ok := strings.Cut(setting, "=")
		if ok && strings.EqualFold(strings.ReplaceAll(name, "-", "_"), "search_path") {
			paths = append(paths, value)
		}
	}
	if value, ok := params["search_path"]; ok {
		paths = append(paths, value)
	}
	return paths
}

// serverFlagsWithArgument are the server's command-line flags that take an
// argument, from the getopt string of process_startup_options
// ("B:bC:c:D:d:EeFf:h:ijk:lN:nOPp:r:S:sTt:v:W:-:"); every other letter is
// a flag alone.
const serverFlagsWithArgument = "BCcDdfhkNprStvW-"

// optionSettings returns the name=value settings an options parameter
// makes, read as the server reads it: words split as pg_split_opts splits
// them, then getopt over them, where flags may be grouped (-nc name=value)
// and a flag's argument is the rest of its word or the next word; -c and
// - (--name=value) give settings.
func optionSettings(options string) []string {
	var settings []string
	words := splitOptions(options)
	for i := 0; i < len(words); i++ {
		w := words[i]
		if w == "--" || len(w) < 2 || w[0] != '-' {
			return settings // getopt stops here; the server refuses what follows
		}
		for j := 1; j < len(w); j++ {
			flag := w[j]
			if strings.IndexByte(serverFlagsWithArgument, flag) < 0 {
				continue
			}
			arg := w[j+1:]
			if arg == "" && i+1 < len(words) {
				i++
				arg = words[i]
			}
			if flag == 'c' || flag == '-' {
				settings = append(settings, arg)
			}
			break
		}
	}
	return settings
}

// splitOptions splits an options parameter into words as the server does
// (pg_split_opts): ASCII whitespace separates them, a backslash takes the
// next byte as it is.
func splitOptions(options string) []string {
	var words []string
	var word strings.Builder
	inWord, escaped := false, false
	for i := 0; i < len(options); i++ {
		c := options[i]
		switch {
		case escaped:
			word.WriteByte(c)
			escaped = false
		case c == '\\':
			inWord, escaped = true, true
		case strings.IndexByte(" \t\n\v\f\r", c) >= 0:
			if inWord {
				words = append(words, word.String())
				word.Reset()
				inWord = false
			}
		default:
			word.WriteByte(c)
			inWord = true
		}
	}
	if inWord {
		words = append(words, word.String())
	}
	return words
}

// CatalogFirst reports whether a session whose search_path setting is
// searchPath (as the server holds it) resolves names in pg_catalog before
// any other schema, now and after any schema is created: pg_catalog is
// the first name in it, or it does not name pg_catalog (the server then
// searches pg_catalog first). A name before pg_catalog counts whether its
// schema exists or not ("$user" included): a role may create it later.
// A vertical tab anywhere fails too, rather than follow each release's
// lexer on whether it separates names (newer ones count it as
// whitespace, older ones as part of a name).
func CatalogFirst(searchPath string) bool {
	if strings.IndexByte(searchPath, '\v') >= 0 {
		return false
	}
	for i, name := range schemaNames(searchPath) {
		if name == "pg_catalog" {
			return i == 0
		}
	}
	return true
}

// schemaNames splits a valid search_path setting into its names as the
// server does (SplitIdentifierString): separated by commas, each either
// double-quoted ("" stands for ") or ending at a comma or whitespace, with
// its ASCII letters folded to lower case; whitespace is the lexer's
// (scannerSpace), around names only.
func schemaNames(searchPath string) []string {
	var names []string
	rest := trimScannerSpace(searchPath)
	for rest != "" {
		var name strings.Builder
		if rest[0] == '"' {
			i := 1
			for i < len(rest) && (rest[i] != '"' || i+1 < len(rest) && rest[i+1] == '"') {
				if rest[i] == '"' {
					i++ // the first of a pair
				}
				name.WriteByte(rest[i])
				i++
			}
			rest = rest[min(i+1, len(rest)):]
		} else {
			i := 0
			for i < len(rest) && rest[i] != ',' && !scannerSpace(rest[i]) {
				c := rest[i]
				if 'A' <= c && c <= 'Z' {
					c += 'a' - 'A'
				}
				name.WriteByte(c)
				i++
			}
			rest = rest[i:]
		}
		names = append(names, name.String())
		rest = trimScannerSpace(rest)
		rest = trimScannerSpace(strings.TrimPrefix(rest, ","))
	}
	return names
}

// scannerSpace is the server lexer's whitespace (scanner_isspace), but
// for the vertical tab CatalogFirst refuses.
func scannerSpace(c byte) bool { return strings.IndexByte(" \t\n\r\f", c) >= 0 }

// trimScannerSpace trims the lexer's whitespace from both ends of s.
func trimScannerSpace(s string) string {
	for s != "" && scannerSpace(s[0]) {
		s = s[1:]
	}
	for s != "" && scannerSpace(s[len(s)-1]) {
		s = s[:len(s)-1]
	}
	return s
}
