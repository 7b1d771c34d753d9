package sqltext

import (
	"slices"
	"strings"

	pg "github.com/pganalyze/pg_query_go/v6"
)

// createModifiers are the words that may come between CREATE and the kind
// of object it creates without changing the command tag: CREATE UNIQUE
// INDEX is tagged CREATE INDEX, CREATE OR REPLACE VIEW is CREATE VIEW.
var createModifiers = []string{"OR", "REPLACE", "UNIQUE", "TEMP", "TEMPORARY", "UNLOGGED", "GLOBAL", "LOCAL",
	"RECURSIVE", "CONSTRAINT", "TRUSTED", "PROCEDURAL", "DEFAULT"}

// MatchesTag reports whether PostgreSQL gives stmt the command tag tag
// ("ALTER TABLE", "CREATE INDEX"...), as far as its leading keywords tell.
func MatchesTag(stmt, tag string) bool {
	words := leadingWords(stmt, 8)
	switch tag {
	case "SELECT INTO":
		return len(words) > 0 && (words[0] == "SELECT" || words[0] == "WITH")
	case "CREATE TABLE AS":
		tag = "CREATE TABLE" // CREATE TABLE name AS ...: the name comes first
	}
	if len(words) > 0 && words[0] == "CREATE" {
		i := 1
		for i < len(words) && slices.Contains(createModifiers, words[i]) {
			i++
		}
		words = append(words[:1], words[i:]...)
	}
	want := strings.Fields(tag)
	return len(want) > 0 && len(words) >= len(want) && slices.Equal(words[:len(want)], want)
}

// leadingWords returns the statement's first words, upper case, up to n
// and up to its first token that is not a word.
func leadingWords(stmt string, n int) []string {
	lx := lexer{src: stmt}
	var words []string
	for len(words) < n {
		tok, ok := lx.next()
		if !ok || tok.kind != tokWord {
			break
		}
		words = append(words, strings.ToUpper(tok.text))
	}
	return words
}

// concurrentTags are the commands whose CONCURRENTLY form cannot run
// inside a transaction block, and means nothing but "take weaker locks".
var concurrentTags = []string{"CREATE INDEX", "DROP INDEX", "REINDEX", "ALTER TABLE"}

// concurrentlyAfter are the keywords CONCURRENTLY follows in CREATE
// INDEX, DROP INDEX and REINDEX { INDEX | TABLE | SCHEMA | DATABASE |
// SYSTEM }.
var concurrentlyAfter = []pg.Token{pg.Token_INDEX, pg.Token_TABLE, pg.Token_SCHEMA, pg.Token_DATABASE, pg.Token_SYSTEM_P}

// WithoutConcurrently returns stmt without its CONCURRENTLY keyword when
// stmt is tagged tag and tag is one of the commands that cannot run
// CONCURRENTLY in a transaction block (CREATE INDEX, DROP INDEX, REINDEX,
// ALTER TABLE ... DETACH PARTITION): the same change, under stronger locks.
// The keyword is found by PostgreSQL's lexer, where the grammar puts it:
// after INDEX (TABLE, SCHEMA...), or last in DETACH PARTITION. Anything
// else, REINDEX (CONCURRENTLY) included, is returned as it is.
func WithoutConcurrently(stmt, tag string) string {
	if !slices.Contains(concurrentTags, tag) {
		return stmt
	}
	tokens, err := scan(stmt)
	if err != nil {
		return stmt
	}
	var words []*pg.ScanToken // the tokens that are not comments
	for _, tok := range tokens {
		if !isComment(tok) {
			words = append(words, tok)
		}
	}
	for i, tok := range words {
		if tok.GetToken() != pg.Token_CONCURRENTLY {
			continue
		}
		after := i > 0 && slices.Contains(concurrentlyAfter, words[i-1].GetToken())
		detach := tag == "ALTER TABLE" && i == len(words)-1
		if !after && !detach {
			continue
		}
		// Up to the next token: the keyword and the white space after it.
		end := len(stmt)
		if j := slices.Index(tokens, tok); j+1 < len(tokens) {
			end = int(tokens[j+1].GetStart())
		}
		return stmt[:tok.GetStart()] + stmt[end:]
	}
	return stmt
}
