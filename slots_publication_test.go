package siphon_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/siphondb/siphon"
	"github.com/siphondb/siphon/canonical"
	"github.com/siphondb/siphon/internal/sqltext"
)

// migrations is a deploy that keeps running on the source while streams
// start, each part in a session of its own: one renames a published table
// back and forth; one (with the schema capture) creates and drops tables,
// keyed and keyless; one keeps a CREATE TABLE open in a transaction across
// stream starts, then rolls it back (or, with the capture, commits it).
type migrations struct {
	stop    chan struct{}
	done    sync.WaitGroup
	renames atomic.Int64
	creates atomic.Int64
	pending atomic.Int64 // transactions held open across stream starts
	mu      sync.Mutex
	errs    []string
}

func startMigrations(t *testing.T, dsn string, capture bool, starts *atomic.Int64) *migrations {
	t.Helper()
	m := &migrations{stop: make(chan struct{})}
	renamer, creator, holder := connectOrFail(t, dsn), connectOrFail(t, dsn), connectOrFail(t, dsn)
	m.done.Add(3)
	go func() {
		defer m.done.Done()
		names := [2]string{"renamed_a", "renamed_b"}
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for i := 0; m.paced(tick, starts, i, 30); i++ {
			m.exec(renamer, fmt.Sprintf("ALTER TABLE %s RENAME TO %s", names[i%2], names[(i+1)%2]))
			m.renames.Add(1)
		}
	}()
	go func() {
		defer m.done.Done()
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for i := 0; capture && m.paced(tick, starts, i, 3); i++ {
			m.exec(creator, fmt.Sprintf("CREATE TABLE made_%d (id int GENERATED ALWAYS AS IDENTITY PRIMARY KEY, region int REFERENCES regions)", i),
				fmt.Sprintf("CREATE TABLE loose_%d (note text)", i))
			m.creates.Add(2)
			if i >= 3 {
				m.exec(creator, fmt.Sprintf("DROP TABLE made_%d, loose_%d", i-3, i-3))
			}
		}
	}()
	go func() {
		defer m.done.Done()
		for i := 0; !m.stopped(); i++ {
			m.exec(holder, "BEGIN", fmt.Sprintf("CREATE TABLE pending_%d (id int PRIMARY KEY, parent int REFERENCES pending_parent)", i))
			until := starts.Load() + 3
			waitUntil(func() bool { return m.stopped() || starts.Load() >= until })
			m.pending.Add(1)
			end := "ROLLBACK" // without the capture, a committed table would be drift
			if capture {
				end = "COMMIT" // the capture published it in its transaction
			}
			m.exec(holder, end)
		}
	}()
	t.Cleanup(m.halt)
	return m
}

func (m *migrations) stopped() bool {
	select {
	case <-m.stop:
		return true
	default:
		return false
	}
}

// paced reports whether the deploy goes on, once the ticker has ticked
// (a deploy runs its statements milliseconds apart) and, when the
// statement about to run is the perStart'th since the last stream start,
// once another stream started: on a loaded machine, the WAL each start
// decodes stays bounded.
func (m *migrations) paced(tick *time.Ticker, starts *atomic.Int64, i, perStart int) bool {
	select {
	case <-m.stop:
		return false
	case <-tick.C:
	}
	if i > 0 && i%perStart == 0 {
		until := starts.Load() + 1
		waitUntil(func() bool { return m.stopped() || starts.Load() >= until })
	}
	return !m.stopped()
}

func (m *migrations) exec(conn *pgx.Conn, statements ...string) {
	for _, s := range statements {
		if _, err := conn.Exec(context.Background(), s); err != nil {
			m.mu.Lock()
			m.errs = append(m.errs, s+": "+err.Error())
			m.mu.Unlock()
		}
	}
}

func (m *migrations) halt() {
	select {
	case <-m.stop:
	default:
		close(m.stop)
	}
	m.done.Wait()
}

// TestDriftCheckUnderMigrations starts streams (CurrentPosition,
// BackupIncremental and StreamChanges in turn, 210 starts) while a deploy
// renames a published table every few milliseconds, keeps a CREATE TABLE
// open in an uncommitted transaction across starts, and, with the schema
// capture, creates and drops tables: a publication that is right is never
// refused. Without the capture, a keyed table created and committed is
// drift all the same, and the next start says so.
func TestDriftCheckUnderMigrations(t *testing.T) {
	t.Parallel()
	for _, capture := range []bool{true, false} {
		t.Run(fmt.Sprintf("capture=%v", capture), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			dsn, admin := newDatabase(t)
			execSQL(t, admin,
				`CREATE TABLE customers (id int GENERATED ALWAYS AS IDENTITY PRIMARY KEY, name text NOT NULL)`,
				// What the deploy's tables reference: the transaction held open
				// locks a table of its own, or the other sessions would wait
				// for it.
				`CREATE TABLE regions (id int PRIMARY KEY)`,
				`CREATE TABLE pending_parent (id int PRIMARY KEY)`,
				`CREATE TABLE renamed_a (id int PRIMARY KEY, customer int REFERENCES customers, updated timestamptz)`,
				`CREATE FUNCTION stamp() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN NEW.updated := now(); RETURN NEW; END $$`,
				`CREATE TRIGGER stamp BEFORE INSERT OR UPDATE ON renamed_a FOR EACH ROW EXECUTE FUNCTION stamp()`,
				`CREATE TABLE app_log (note text)`, // keyless: left out, never drift
				`INSERT INTO customers (name) SELECT 'c' || g FROM generate_series(1, 20) g`,
				`INSERT INTO renamed_a SELECT g, g FROM generate_series(1, 20) g`)
			var c *siphon.Conn
			var pos canonical.Position
			if capture {
				c, _, pos = captureConnAt(t, dsn)
			} else {
				c, _, pos = streamConnAt(t, dsn, siphon.WithoutSchemaCapture())
			}
			var starts atomic.Int64
			m := startMigrations(t, dsn, capture, &starts)

			const rounds = 210
			var refusals []string
			for i := range rounds {
				var err error
				switch i % 3 {
				case 0:
					_, err = c.CurrentPosition(ctx)
				case 1:
					pos, err = c.BackupIncremental(ctx, pos, io.Discard)
				case 2:
					pos, err = streamToMarker(ctx, t, c, admin, pos, fmt.Sprint(i))
				}
				starts.Add(1)
				var drift *siphon.PublicationMismatchError
				if errors.As(err, &drift) {
					refusals = append(refusals, err.Error())
					continue
				}
				require.NoError(t, err, "stream start %d", i)
			}
			m.halt()
			t.Logf("%d stream starts, %d refused; %d renames, %d tables created, %d creations held open across starts",
				rounds, len(refusals), m.renames.Load(), m.creates.Load(), m.pending.Load())
			assert.Empty(t, refusals, "a publication that is right was refused")
			assert.Empty(t, m.errs, "the deploy's statements")
			assert.Greater(t, m.renames.Load(), int64(rounds/3), "renames ran while streams started")
			assert.Greater(t, m.pending.Load(), int64(10), "creations were held open across starts")

			if !capture {
				// Real drift is still refused.
				execSQL(t, admin, `CREATE TABLE created_by_hand (id int PRIMARY KEY)`)
				_, err := c.BackupIncremental(ctx, pos, io.Discard)
				var drift *siphon.PublicationMismatchError
				require.ErrorAs(t, err, &drift)
				assert.Equal(t, []canonical.TableName{{Schema: "public", Name: "created_by_hand"}}, drift.Missing)
			} else {
				published := publishedTables(t, admin, "siphon")
				assert.Contains(t, published, "public.made_"+fmt.Sprint(m.creates.Load()/2-1), "the capture published the tables the deploy made")
			}
			require.NoError(t, c.Detach(ctx))
			require.NoError(t, c.Close())
			assertNoLeaks(t, dsn)
		})
	}
}

// streamToMarker streams c from from until a marker it writes first, and
// returns the Position StreamChanges returned.
func streamToMarker(ctx context.Context, t *testing.T, c *siphon.Conn, admin *pgx.Conn, from canonical.Position, marker string) (canonical.Position, error) {
	t.Helper()
	// A committed row the stream acknowledges, so that the next stream
	// starts from it.
	execSQL(t, admin, "INSERT INTO customers (name) VALUES ('marker "+marker+"')")
	emitMarker(t, admin, marker)
	ctx, cancel := context.WithTimeout(ctx, waitDeadline)
	defer cancel()
	return c.StreamChanges(ctx, from, func(ch canonical.Change) error {
		if ch.Op == canonical.OpMessage && ch.Message.Prefix == markerPrefix && string(ch.Message.Content) == marker {
			cancel()
		}
		return nil
	})
}

// siphonObjects lists what siphon may leave in a database: publications,
// replication slots, and the schema capture's objects (captureObjects).
func siphonObjects(t *testing.T, conn *pgx.Conn) []string {
	t.Helper()
	rows, err := conn.Query(context.Background(), `SELECT 'publication ' || pubname FROM pg_publication
		UNION ALL SELECT 'slot ' || slot_name FROM pg_replication_slots WHERE database = current_database()`)
	require.NoError(t, err)
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	names = append(names, captureObjects(t, conn)...)
	slices.Sort(names)
	return names
}

// TestNothingLeftByARoleWithoutReplication attaches as a role that owns its
// tables but lacks REPLICATION: CurrentPosition creates the publication,
// fails on the slot, drops the publication again (and, for KeylessFull,
// sets back the replica identities it changed) and says who must grant
// REPLICATION; Detach then succeeds. Where a superuser made the slot and
// the publication for the same options, the role's Detach removes what it
// may and returns a *DetachIncompleteError naming what stays and who may
// remove it: first the slot (and the publication it reads), then, with
// REPLICATION granted, the superuser's publication; the superuser's Detach
// removes that.
func TestNothingLeftByARoleWithoutReplication(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	roleDSN, admin := sourceRoleWith(t, "NOREPLICATION")
	roleConn := connectOrFail(t, roleDSN)
	var role string
	require.NoError(t, roleConn.QueryRow(ctx, "SELECT current_user").Scan(&role))
	dsn := strings.Replace(roleDSN, role+":plain-pw-1234@", "postgres@", 1)
	execSQL(t, roleConn,
		`CREATE TABLE accounts (id int GENERATED ALWAYS AS IDENTITY PRIMARY KEY, owner text NOT NULL)`,
		`CREATE TABLE entries (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, account int NOT NULL REFERENCES accounts, amount numeric)`,
		`CREATE FUNCTION no_zero() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN IF NEW.amount = 0 THEN RETURN NULL; END IF; RETURN NEW; END $$`,
		`CREATE TRIGGER no_zero BEFORE INSERT ON entries FOR EACH ROW EXECUTE FUNCTION no_zero()`)
	slot := streamSlot(t)
	opts := []siphon.Option{siphon.WithSlot(slot), siphon.WithPublication(slot)}

	c := connect(t, roleDSN, opts...)
	_, err := c.CurrentPosition(ctx)
	var privilege *siphon.PrivilegeError
	require.ErrorAs(t, err, &privilege)
	assert.Contains(t, err.Error(), "lacks the REPLICATION attribute")
	assert.Contains(t, err.Error(), `have a superuser run ALTER ROLE "`+role+`" WITH REPLICATION`)
	assert.Contains(t, err.Error(), fmt.Sprintf("the publication %q this call created was dropped again", slot))
	assert.Empty(t, siphonObjects(t, admin), "a failed CurrentPosition leaves nothing")
	require.NoError(t, c.Detach(ctx), "Detach with nothing to remove")

	// KeylessFull changes the replica identity of keyless tables for the
	// publication; a failed creation sets back what each had.
	execSQL(t, roleConn, `CREATE TABLE audit (at timestamptz, what text)`,
		`CREATE TABLE notes (body text)`, `ALTER TABLE notes REPLICA IDENTITY NOTHING`)
	full := connect(t, roleDSN, siphon.WithSlot(slot+"_full"), siphon.WithPublication(slot+"_full"), siphon.WithKeylessTables(siphon.KeylessFull))
	_, err = full.CurrentPosition(ctx)
	require.ErrorAs(t, err, &privilege)
	assert.Contains(t, err.Error(), "was dropped again)")
	assert.Empty(t, siphonObjects(t, admin), "a failed CurrentPosition leaves nothing")
	var identities []string
	require.NoError(t, admin.QueryRow(ctx, `SELECT array_agg(relname || ' ' || relreplident::text ORDER BY relname) FROM pg_class
		WHERE relname IN ('audit', 'notes') AND relkind = 'r'`).Scan(&identities))
	assert.Equal(t, []string{"audit d", "notes n"}, identities, "the replica identities KeylessFull set are set back")
	execSQL(t, roleConn, `DROP TABLE audit, notes`)
	require.NoError(t, full.Close())

	// A superuser made the slot and the publication for the same options.
	super := connect(t, dsn, opts...)
	_, err = super.CurrentPosition(ctx)
	require.NoError(t, err)
	err = c.Detach(ctx)
	var incomplete *siphon.DetachIncompleteError
	require.ErrorAs(t, err, &incomplete)
	assert.Empty(t, incomplete.Removed)
	require.Len(t, incomplete.Remaining, 2, err.Error())
	assert.Contains(t, incomplete.Remaining[0], fmt.Sprintf("slot %q: dropping it needs the REPLICATION privilege", slot))
	assert.Contains(t, incomplete.Remaining[0], `ALTER ROLE "`+role+`" WITH REPLICATION`)
	assert.Contains(t, incomplete.Remaining[1], fmt.Sprintf("publication %q: kept while the slot", slot))
	assert.Equal(t, []string{"publication " + slot, "slot " + slot}, siphonObjects(t, admin), "nothing was removed")

	execSQL(t, admin, "ALTER ROLE "+role+" WITH REPLICATION")
	err = c.Detach(ctx)
	require.ErrorAs(t, err, &incomplete)
	assert.Equal(t, []string{fmt.Sprintf("slot %q", slot)}, incomplete.Removed)
	require.Len(t, incomplete.Remaining, 1, err.Error())
	assert.Contains(t, incomplete.Remaining[0], fmt.Sprintf(`publication %q: only its owner "postgres" or a superuser may drop it`, slot))
	assert.Contains(t, err.Error(), "call Detach again once that is done")
	assert.Equal(t, []string{"publication " + slot}, siphonObjects(t, admin))

	require.NoError(t, super.Detach(ctx))
	assert.Empty(t, siphonObjects(t, admin))
	require.NoError(t, c.Close())
	require.NoError(t, super.Close())
	assertNoLeaks(t, dsn)
}

// TestLastDetachRemovesEverything runs two Conns on one database, each
// with its slot and publication, and the schema capture a superuser
// installed for both; both stream a change, then detach, in either order.
// The first Detach keeps the capture (the other publication still has its
// slot); the last one removes every publication, event trigger, function
// and schema siphon, whatever the order. Neither stream carries the
// COMMENT ON PUBLICATION siphon marks its publications with, nor one of
// the user's.
func TestLastDetachRemovesEverything(t *testing.T) {
	t.Parallel()
	for _, order := range []string{"first made, first detached", "last made, first detached"} {
		t.Run(order, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			dsn, admin := newDatabase(t)
			execSQL(t, admin,
				`CREATE TABLE authors (id int GENERATED ALWAYS AS IDENTITY PRIMARY KEY, name text NOT NULL)`,
				`CREATE TABLE books (id int PRIMARY KEY, author int REFERENCES authors ON DELETE CASCADE, title text)`,
				`CREATE TABLE reads (book int, at timestamptz DEFAULT now())`) // keyless
			var conns [2]*siphon.Conn
			var starts [2]canonical.Position
			for i := range conns {
				pub := fmt.Sprintf("%s_%d", streamSlot(t), i)
				conns[i], _, starts[i] = captureConnAt(t, dsn, siphon.WithPublication(pub))
			}
			execSQL(t, admin, `INSERT INTO authors (name) VALUES ('ada')`, `INSERT INTO books VALUES (1, 1, 'notes')`,
				`ALTER TABLE books ADD COLUMN pages int`,
				// A publication of the user's, commented on, is no schema change
				// for a target, any more than siphon's are.
				`CREATE PUBLICATION app_feed FOR TABLE books`, `COMMENT ON PUBLICATION app_feed IS 'the feed'`, `DROP PUBLICATION app_feed`)
			for i, c := range conns {
				changes, _ := streamUntilMarker(t, admin, c, starts[i], fmt.Sprint("end", i))
				assert.Len(t, ddlOf(changes), 1, "each publication carries the schema change, and only it")
			}
			first, last := conns[0], conns[1]
			if order == "last made, first detached" {
				first, last = last, first
			}
			require.NoError(t, first.Detach(ctx))
			assert.Contains(t, siphonObjects(t, admin), "event trigger siphon_capture_ddl", "the capture stays while a slot reads a publication it looks after")
			require.NoError(t, last.Detach(ctx))
			assert.Empty(t, siphonObjects(t, admin), "the last Detach leaves nothing of siphon's")
			execSQL(t, admin, `CREATE TABLE after_detach (id int PRIMARY KEY)`)
			for _, c := range conns {
				require.NoError(t, c.Close())
			}
			assertNoLeaks(t, dsn)
		})
	}
}

// TestLastDetachRemovesEveryPublicationWithoutCapture runs two Conns
// without the schema capture on one database, in either order of
// detaching: the first Detach keeps its publication (the other slot may
// read it), the last drops both, and a publication of the user's own,
// which siphon did not create, stays.
func TestLastDetachRemovesEveryPublicationWithoutCapture(t *testing.T) {
	t.Parallel()
	for _, order := range []string{"first made, first detached", "last made, first detached"} {
		t.Run(order, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			dsn, admin := newDatabase(t)
			execSQL(t, admin, `CREATE TABLE items (id int PRIMARY KEY, name text)`,
				`CREATE PUBLICATION users_own FOR TABLE items`)
			var conns [2]*siphon.Conn
			for i := range conns {
				pub := fmt.Sprintf("%s_%d", streamSlot(t), i)
				conns[i], _, _ = streamConnAt(t, dsn, siphon.WithPublication(pub), siphon.WithoutSchemaCapture())
			}
			first, last := conns[0], conns[1]
			if order == "last made, first detached" {
				first, last = last, first
			}
			require.NoError(t, first.Detach(ctx))
			assert.Len(t, siphonObjects(t, admin), 4, "the other Conn's slot and both publications stay, besides the user's: %v", siphonObjects(t, admin))
			require.NoError(t, last.Detach(ctx))
			assert.Equal(t, []string{"publication users_own"}, siphonObjects(t, admin), "the last Detach leaves nothing of siphon's, and the user's publication")
			for _, c := range conns {
				require.NoError(t, c.Close())
			}
			assertNoLeaks(t, dsn)
		})
	}
}

// TestLastDetachLeavesAnotherOwnersPublication: a role's Detach that
// leaves the database without slots drops the publications siphon made
// that it may drop; a superuser's, kept when its Conn detached first,
// stays with a warning (it is not the role's to drop), and the role's
// Detach succeeds. The superuser's Detach again removes it.
func TestLastDetachLeavesAnotherOwnersPublication(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	roleDSN, admin := sourceRoleWith(t, "REPLICATION")
	role := connectOrFail(t, roleDSN)
	execSQL(t, role, `CREATE TABLE items (id int PRIMARY KEY, name text)`)
	var user string
	require.NoError(t, role.QueryRow(ctx, "SELECT current_user").Scan(&user))
	dsn := strings.Replace(roleDSN, user+":plain-pw-1234@", "postgres@", 1)
	super, _, _ := streamConnAt(t, dsn, siphon.WithPublication(streamSlot(t)+"_super"), siphon.WithoutSchemaCapture())
	plain, _, _ := streamConnAt(t, roleDSN, siphon.WithPublication(streamSlot(t)+"_plain"), siphon.WithoutSchemaCapture())
	require.NoError(t, super.Detach(ctx))
	require.NoError(t, plain.Detach(ctx), "another owner's publication is no failure of this Detach")
	objects := siphonObjects(t, admin)
	require.Len(t, objects, 1, "the superuser's publication stays: %v", objects)
	assert.Contains(t, objects[0], "_super")
	require.NoError(t, super.Detach(ctx))
	assert.Empty(t, siphonObjects(t, admin))
	require.NoError(t, super.Close())
	require.NoError(t, plain.Close())
	assertNoLeaks(t, dsn)
}

// TestPublicationUnmarkedUnderAnOlderCapture creates a publication while
// a schema capture of an earlier version is installed, which would take
// the mark (a COMMENT ON PUBLICATION) for a schema change: the publication
// stays unmarked, and no stream carries a schema change for it.
func TestPublicationUnmarkedUnderAnOlderCapture(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn, admin := newDatabase(t)
	execSQL(t, admin, `CREATE TABLE items (id int PRIMARY KEY, name text)`)
	first, _, start := captureConnAt(t, dsn, siphon.WithPublication(streamSlot(t)+"_first"))
	execSQL(t, admin, `COMMENT ON FUNCTION siphon.capture_ddl(text, text, text) IS 'siphon schema capture 2'`)
	pub := streamSlot(t) + "_second"
	second, _, _ := streamConnAt(t, dsn, siphon.WithPublication(pub))
	var comment *string
	require.NoError(t, admin.QueryRow(ctx, `SELECT obj_description(oid, 'pg_publication') FROM pg_publication WHERE pubname = $1`, pub).Scan(&comment))
	assert.Nil(t, comment, "no mark under an older capture")
	changes, _ := streamUntilMarker(t, admin, first, start, "end")
	assert.Empty(t, ddlOf(changes), "creating the second publication is no schema change")
	require.NoError(t, second.Detach(ctx))
	require.NoError(t, first.Detach(ctx))
	require.NoError(t, second.Close())
	require.NoError(t, first.Close())
	assertNoLeaks(t, dsn)
}

// streamUntilMarker writes a marker and streams c from from up to it.
func streamUntilMarker(t *testing.T, admin *pgx.Conn, c *siphon.Conn, from canonical.Position, marker string) ([]canonical.Change, canonical.Position) {
	t.Helper()
	emitMarker(t, admin, marker)
	return streamUntil(t, c, from, marker)
}

// TestLastDetachDoesNotWaitForAHeldPublication holds a lock on another
// Conn's publication in a transaction left open (as its owner's COMMENT
// or ALTER PUBLICATION does until it commits) while the last Detach drops
// the publications siphon made: that Detach, which holds the
// slot-management lock every slot creation waits for, gives up on the held
// one after its lock timeout with a warning, instead of waiting as long as
// the transaction stays open (here: for ever, since the transaction ends
// only after Detach returns); a later Detach drops it.
func TestLastDetachDoesNotWaitForAHeldPublication(t *testing.T) {
	const heldPublicationWarning = "a publication siphon created for another Conn stays, though no slot reads it any more: " +
		"only its owner or a superuser may drop it, once no session holds it (Detach as that role, or DROP PUBLICATION)"
	t.Parallel()
	ctx := context.Background()
	dsn, admin := newDatabase(t)
	execSQL(t, admin, `CREATE TABLE items (id int PRIMARY KEY, name text)`)
	held := streamSlot(t) + "_held"
	first, _, _ := streamConnAt(t, dsn, siphon.WithPublication(held), siphon.WithoutSchemaCapture())
	logs := &logRecorder{}
	last, _, _ := streamConnAt(t, dsn, siphon.WithPublication(streamSlot(t)+"_last"), siphon.WithoutSchemaCapture(),
		siphon.WithLogger(logs.logger()))
	require.NoError(t, first.Detach(ctx))
	require.Contains(t, siphonObjects(t, admin), "publication "+held, "a slot still exists: the publication stays")

	holder := connectOrFail(t, dsn)
	tx, err := holder.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	var mark string
	require.NoError(t, tx.QueryRow(ctx, `SELECT obj_description(oid, 'pg_publication') FROM pg_publication WHERE pubname = $1`, held).Scan(&mark))
	_, err = tx.Exec(ctx, "COMMENT ON PUBLICATION "+pgx.Identifier{held}.Sanitize()+" IS "+sqltext.Literal(mark))
	require.NoError(t, err)

	detachCtx, cancel := context.WithTimeout(ctx, waitDeadline)
	defer cancel()
	require.NoError(t, last.Detach(detachCtx), "a publication someone holds is no failure of the last Detach")
	assert.NotEmpty(t, logs.find(slog.LevelWarn, heldPublicationWarning), "the warning names the publication that stays")
	assert.Equal(t, []string{"publication " + held}, siphonObjects(t, admin), "only the held publication stays")

	require.NoError(t, tx.Rollback(ctx))
	require.NoError(t, first.Detach(ctx))
	assert.Empty(t, siphonObjects(t, admin), "a later Detach drops it")
	require.NoError(t, first.Close())
	require.NoError(t, last.Close())
	assertNoLeaks(t, dsn)
}
