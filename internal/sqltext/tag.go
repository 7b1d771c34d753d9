package sqltext

import (
	"slices"

	pg "github.com/pganalyze/pg_query_go/v6"
)

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
