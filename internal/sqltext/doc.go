// Package sqltext reads and writes PostgreSQL statement text. Reading is
// done by PostgreSQL's own parser (libpg_query, PostgreSQL 17's grammar:
// natively where cgo is enabled, as WebAssembly where it is not), never by
// a hand lexer: Statements splits a query string where the server does and
// tells what each statement is (its command tag, whether it fires
// ddl_command_end, whether its meaning depends on who runs it, whether it
// may carry a secret); NestedStatement reads the statement a function ran
// out of a PL/pgSQL call stack, only where that is certain; IsTypeName
// tells a type name from anything else. Writing is quoting: Ident, Name
// and Literal.
package sqltext
