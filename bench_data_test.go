package siphon_test

import (
	"bytes"
	"context"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/siphondb/siphon/canonical"
)

// The benchmarks' standard data sets, defined once here:
//
//   - the standard table, bench: a bigint key and text, numeric,
//     timestamptz, text[], jsonb, bool and uuid columns, SIPHON_BENCH_ROWS
//     rows (benchRows; default 20000, 1000000 for the published figures);
//   - the standard stream workload: benchRows inserts, a quarter as many
//     updates and a tenth as many deletes, in transactions of
//     SIPHON_BENCH_TX_ROWS changes (default 100), then the marker message
//     "bench.end";
//   - the huge transaction: SIPHON_BENCH_HUGE_ROWS inserts (default 200000,
//     2000000 for the published figure) in one transaction, then the marker;
//   - the wide shape: the standard stream workload on a tenth of the rows,
//     whose table has one more column, doc, holding 6400 characters that
//     do not compress (so every row's doc is TOASTed, out of line) and
//     that updates leave as they are (pgoutput sends it as unchanged);
//   - the single-row shape: the standard stream workload on a tenth of the
//     rows, one change per transaction.
//
// Every value is a function of the row number, so each run and each
// database holds the same bytes.

// benchRows is the standard table's row count and the stream workload's
// insert count: SIPHON_BENCH_ROWS, default 20000.
func benchRows(tb testing.TB) int { return envInt(tb, "SIPHON_BENCH_ROWS", 20_000) }

// benchTableColumns are the standard table's column definitions.
const benchTableColumns = `id bigint PRIMARY KEY, name text NOT NULL, amount numeric(12,2),
	at timestamptz, tags text[], attrs jsonb, flag bool, ref uuid`

// benchTableDDL creates the standard table.
const benchTableDDL = `CREATE TABLE bench (` + benchTableColumns + `)`

// benchColumns is the standard table's row number i, every column in
// order: md5-based text, 2 to 5 tags of 5 to 8 characters (one in seven
// rows has a tag that needs quotes), a small jsonb object, a uuid made
// from an md5 (deterministic, unlike gen_random_uuid()).
const benchColumns = `i, 'customer ' || md5(i::text), (i % 10000000) / 100.0,
	'2026-01-01 00:00:00+00'::timestamptz + i * interval '1.000123 second',
	ARRAY(SELECT CASE WHEN k = 1 AND i % 7 = 0 THEN 'two words' ELSE substr(md5(i::text || k::text), 1, 4 + k) END
		FROM generate_series(1, 2 + i % 4) k),
	jsonb_build_object('n', i, 'kind', (ARRAY['retail', 'wholesale', 'online'])[1 + i % 3], 'score', (i % 1000) * 0.1, 'vip', i % 11 = 0),
	i % 3 = 0, md5('ref' || i)::uuid`

// benchDoc is the wide shape's doc of row number i: 200 md5 digests,
// 6400 hexadecimal characters that pglz does not compress by the quarter
// it requires, so the value is stored out of line, uncompressed.
const benchDoc = `(SELECT string_agg(md5(i::text || '.' || g::text), '') FROM generate_series(1, 200) g)`

// benchInsert inserts the standard rows lo..hi (SQL expressions).
func benchInsert(lo, hi string) string {
	return benchInsertOf(false, lo, hi)
}

// benchInsertOf inserts the standard rows lo..hi, with their doc when
// wide.
func benchInsertOf(wide bool, lo, hi string) string {
	columns := benchColumns
	if wide {
		columns += ", " + benchDoc
	}
	return "INSERT INTO bench SELECT " + columns + " FROM generate_series(" + lo + ", " + hi + ") i"
}

// loadBenchTable creates the standard table on conn's database with rows
// rows, vacuumed and analyzed.
func loadBenchTable(tb testing.TB, conn *pgx.Conn, rows int) {
	tb.Helper()
	execSQL(tb, conn, benchTableDDL, benchInsert("1", strconv.Itoa(rows)), "VACUUM (FREEZE, ANALYZE) bench")
}

// benchWorkload is a stream of changes to the standard table, each
// transaction holding perTx changes of one kind; wide adds the doc
// column.
type benchWorkload struct {
	inserts, updates, deletes, perTx int
	wide                             bool
}

// ddl creates the workload's (empty) table.
func (w benchWorkload) ddl() string {
	if w.wide {
		return `CREATE TABLE bench (` + benchTableColumns + `, doc text)`
	}
	return benchTableDDL
}

// standardWorkload is the standard stream set: benchRows inserts, a quarter
// as many updates, a tenth as many deletes.
func standardWorkload(tb testing.TB) benchWorkload {
	return changeSet(benchRows(tb), envInt(tb, "SIPHON_BENCH_TX_ROWS", 100))
}

// changeSet is n inserts, a quarter as many updates and a tenth as many
// deletes, perTx changes a transaction.
func changeSet(n, perTx int) benchWorkload {
	return benchWorkload{inserts: n, updates: n / 4, deletes: n / 10, perTx: perTx}
}

// bulkWorkload is the standard stream set in its bulk shape: one
// transaction of benchRows inserts, one of a quarter as many updates, one
// of a tenth as many deletes.
func bulkWorkload(tb testing.TB) benchWorkload {
	w := standardWorkload(tb)
	w.perTx = w.inserts
	return w
}

// wideWorkload is the standard stream set on a tenth of benchRows, with
// a TOASTed doc in every row that updates leave as it is.
func wideWorkload(tb testing.TB) benchWorkload {
	w := changeSet(benchRows(tb)/10, standardWorkload(tb).perTx)
	w.wide = true
	return w
}

// singleRowWorkload is the standard stream set on a tenth of benchRows,
// a transaction for each change.
func singleRowWorkload(tb testing.TB) benchWorkload {
	return changeSet(benchRows(tb)/10, 1)
}

// hugeTransaction is SIPHON_BENCH_HUGE_ROWS inserts in one transaction.
func hugeTransaction(tb testing.TB) benchWorkload {
	n := envInt(tb, "SIPHON_BENCH_HUGE_ROWS", 200_000)
	return benchWorkload{inserts: n, perTx: n}
}

// changes is the number of row changes the workload makes.
func (w benchWorkload) changes() int { return w.inserts + w.updates + w.deletes }

// run makes the workload's changes on conn's (empty) standard table, then
// emits the marker message "bench.end" and returns its position. Updates
// change every column but the key of the first rows; deletes remove the
// last rows. The doc of the wide shape is left as it is.
func (w benchWorkload) run(tb testing.TB, conn *pgx.Conn) canonical.Position {
	tb.Helper()
	loop := func(from, to int, stmt string) string {
		if from > to {
			return ""
		}
		return "FOR lo IN " + strconv.Itoa(from) + ".." + strconv.Itoa(to) + " BY " + strconv.Itoa(w.perTx) + " LOOP\n" +
			strings.ReplaceAll(stmt, "$hi", "least(lo + "+strconv.Itoa(w.perTx-1)+", "+strconv.Itoa(to)+")") +
			";\nCOMMIT;\nEND LOOP;\n"
	}
	execSQL(tb, conn, "DO $$\nBEGIN\n"+
		loop(1, w.inserts, benchInsertOf(w.wide, "lo", "$hi"))+
		loop(1, w.updates, `UPDATE bench SET name = name || ' (updated)', amount = amount + 1, at = at + interval '1 hour',
			tags = tags || 'updated'::text, attrs = attrs || '{"updated": true}', flag = NOT flag, ref = md5('new' || id)::uuid
			WHERE id BETWEEN lo AND $hi`)+
		loop(w.inserts-w.deletes+1, w.inserts, "DELETE FROM bench WHERE id BETWEEN lo AND $hi")+
		"END $$")
	var lsn string
	require.NoError(tb, conn.QueryRow(context.Background(), "SELECT pg_logical_emit_message(false, 'bench.end', '')::text").Scan(&lsn))
	marker, err := canonical.ParsePosition(lsn)
	require.NoError(tb, err)
	return marker
}

// benchTableText returns the standard table's rows, in key order, as COPY
// text (what COPY FROM reads back) and as canonical rows.
func benchTableText(tb testing.TB, conn *pgx.Conn) (copyText []byte, rows []canonical.Row) {
	tb.Helper()
	var out bytes.Buffer
	_, err := conn.PgConn().CopyTo(context.Background(), &out, "COPY (SELECT * FROM bench ORDER BY id) TO STDOUT")
	require.NoError(tb, err)
	for line := range bytes.Lines(out.Bytes()) {
		fields := strings.Split(strings.TrimSuffix(string(line), "\n"), "\t")
		row := make(canonical.Row, len(fields))
		for i, f := range fields {
			row[i] = copyTextValue(f)
		}
		rows = append(rows, row)
	}
	return out.Bytes(), rows
}

// copyTextValue reads one field of COPY's text format.
func copyTextValue(f string) canonical.Value {
	if f == `\N` {
		return canonical.Null()
	}
	if !strings.Contains(f, `\`) {
		return canonical.Text(f)
	}
	return canonical.Text(strings.NewReplacer(`\\`, `\`, `\t`, "\t", `\n`, "\n", `\r`, "\r").Replace(f))
}

// sideBySide runs ours and theirs (the reference tool) once each per
// iteration, in alternating order, so that a load change on the machine
// hits both. It reports the median and the worst of the per-iteration
// ratios: of ours' wall time over theirs' as unit+"(median)" and
// unit+"(max)" (below 1, ours is faster), or with speed, of ours' speed
// over theirs' as unit+"(median)" and unit+"(min)" (above 1, ours is
// faster). With rows > 0 it reports each one's rows/s over the run too.
func sideBySide(b *testing.B, unit string, speed bool, rows int, ours, theirs func() time.Duration) {
	var ratios []float64
	var oursTotal, theirsTotal time.Duration
	for i := 0; b.Loop(); i++ {
		var o, t time.Duration
		if i%2 == 0 {
			o, t = ours(), theirs()
		} else {
			t, o = theirs(), ours()
		}
		oursTotal, theirsTotal = oursTotal+o, theirsTotal+t
		if speed {
			ratios = append(ratios, t.Seconds()/o.Seconds())
		} else {
			ratios = append(ratios, o.Seconds()/t.Seconds())
		}
	}
	sort.Float64s(ratios)
	b.ReportMetric(ratios[len(ratios)/2], unit+"(median)")
	if speed {
		b.ReportMetric(ratios[0], unit+"(min)")
	} else {
		b.ReportMetric(ratios[len(ratios)-1], unit+"(max)")
	}
	if rows > 0 {
		n := float64(rows) * float64(b.N)
		b.ReportMetric(n/oursTotal.Seconds(), "siphon_rows/s")
		b.ReportMetric(n/theirsTotal.Seconds(), "reference_rows/s")
	}
	b.ReportMetric(0, "ns/op")
}

// clientProgram finds the PostgreSQL client program name on PATH or beside
// the server binaries (the last under /usr/lib/postgresql/*/bin), or skips
// the benchmark, which compares with it.
func clientProgram(tb testing.TB, name string) string {
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	found, _ := filepath.Glob("/usr/lib/postgresql/*/bin/" + name)
	sort.Strings(found)
	if len(found) == 0 {
		tb.Skipf("%s not found: the benchmark compares with it", name)
	}
	return found[len(found)-1]
}
