package dsn

import (
	"strings"
	"unicode"
)

// SearchPaths returns the search_path settings a session started with the
// runtime parameters params receives from its startup packet: each one of
// the options parameter (-c search_path=…, -csearch_path=…,
// --search_path=…, read as the server reads them), then the search_path
// parameter. None when neither sets it.
func SearchPaths(params map[string]string) []string {
	var paths []string
	words := splitOptions(params["options"])
	for i := 0; i < len(words); i++ {
		var setting string
		switch w := words[i]; {
		case w == "-c" && i+1 < len(words):
			i++
			setting = words[i]
		case strings.HasPrefix(w, "-c"):
			setting = w[2:]
		case strings.HasPrefix(w, "--"):
			setting = w[2:]
		default:
			continue
		}
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

// splitOptions splits an options parameter into words as the server does
// (pg_split_opts): whitespace separates them, a backslash takes the next
// character as it is.
func splitOptions(options string) []string {
	var words []string
	var word strings.Builder
	inWord, escaped := false, false
	for _, r := range options {
		switch {
		case escaped:
			word.WriteRune(r)
			escaped = false
		case r == '\\':
			inWord, escaped = true, true
		case unicode.IsSpace(r):
			if inWord {
				words = append(words, word.String())
				word.Reset()
				inWord = false
			}
		default:
			word.WriteRune(r)
			inWord = true
		}
	}
	if inWord {
		words = append(words, word.String())
	}
	return words
}

// CatalogFirst reports whether a session whose search_path is searchPath
// resolves names in pg_catalog before any other schema: pg_catalog is its
// first schema, or it does not name pg_catalog (the server then searches
// pg_catalog first).
func CatalogFirst(searchPath string) bool {
	schemas := schemaNames(searchPath)
	for i, s := range schemas {
		if s == "pg_catalog" {
			return i == 0
		}
	}
	return true
}

// schemaNames splits a search_path into its schema names as the server
// does (SplitIdentifierString): comma-separated, each double-quoted (""
// stands for ") or with its ASCII letters folded to lower case, with the
// spaces around it trimmed.
func schemaNames(searchPath string) []string {
	var names []string
	rest := strings.TrimSpace(searchPath)
	for rest != "" {
		var name string
		if strings.HasPrefix(rest, `"`) {
			var b strings.Builder
			i := 1
			for i < len(rest) {
				if rest[i] == '"' {
					if i+1 < len(rest) && rest[i+1] == '"' {
						b.WriteByte('"')
						i += 2
						continue
					}
					break
				}
				b.WriteByte(rest[i])
				i++
			}
			name, rest = b.String(), rest[min(i+1, len(rest)):]
			_, rest, _ = strings.Cut(rest, ",")
		} else {
			name, rest, _ = strings.Cut(rest, ",")
			name = foldASCII(strings.TrimSpace(name))
		}
		names = append(names, name)
		rest = strings.TrimSpace(rest)
	}
	return names
}

// foldASCII folds the ASCII letters of s to lower case, as the server
// folds an unquoted identifier in a UTF-8 database.
func foldASCII(s string) string {
	return strings.Map(func(r rune) rune {
		if 'A' <= r && r <= 'Z' {
			return r + 'a' - 'A'
		}
		return r
	}, s)
}
