package repository_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/siphondb/siphon"
	"github.com/siphondb/siphon/canonical"
	"github.com/siphondb/siphon/repository"
	"github.com/siphondb/siphon/siphontest"
)

// TestChainRestoreAsOfTime writes a chain (a base, then incrementals with
// writes and a migration between them) into an encrypted repository on a
// directory bucket and on an S3 server, lists and verifies it, and
// restores it as of a time between two links' transactions into a fresh
// database: every table's rows and the schema are the source's at that
// time.
func TestChainRestoreAsOfTime(t *testing.T) {
	t.Parallel()
	for _, be := range backends {
		t.Run(be.name, func(t *testing.T) {
			t.Parallel()
			siphontest.Start(t).SkipUnlessDumpClients(t)
			ctx := context.Background()
			reader := sdkmetric.NewManualReader()
			var reports []repository.Progress
			repo := openRepo(t, be.url(t), repository.WithKey(newKey(t)),
				repository.WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))),
				repository.WithProgress(func(p repository.Progress) { reports = append(reports, p) }))
			src := newSource(t, repo.StreamKey())
			require.NoError(t, src.c.InstallSchemaCapture(ctx))

			chain, err := repo.StartChain(ctx, src.c, repository.StartChainOptions{})
			require.NoError(t, err)
			src.remember(chain)
			require.NotEmpty(t, chain.BaseSlot)
			assert.True(t, slotExists(t, src.conn, chain.BaseSlot), "the chain's base slot pins its WAL")

			src.exec(t, `UPDATE accounts SET balance = balance + 1 WHERE id <= 50; DELETE FROM events WHERE id % 7 = 0`)
			_, err = repo.AddLink(ctx, src.c, "")
			require.NoError(t, err)

			// Between links 2 and 3: a migration and writes, then the
			// target time, then more writes and a second migration.
			src.exec(t, `ALTER TABLE accounts ADD COLUMN currency text NOT NULL DEFAULT 'EUR'`)
			src.exec(t, `CREATE TABLE notes (id int PRIMARY KEY, body text); INSERT INTO notes VALUES (1, 'one'), (2, 'two')`)
			src.exec(t, `UPDATE accounts SET currency = 'USD' WHERE id % 3 = 0`)
			asOf := src.serverNow(t)
			posAt := src.insertPosition(t)
			want := readState(t, src.dsn)
			src.exec(t, `INSERT INTO notes VALUES (3, 'three'); UPDATE accounts SET balance = 0 WHERE id = 7`)
			src.exec(t, `ALTER TABLE notes ADD COLUMN pinned bool`)
			chain, err = repo.AddLink(ctx, src.c, chain.ID)
			require.NoError(t, err)
			src.exec(t, `DELETE FROM notes WHERE id = 1; INSERT INTO events (account, note) VALUES (3, 'late')`)
			chain, err = repo.AddLink(ctx, src.c, chain.ID)
			require.NoError(t, err)
			final := readState(t, src.dsn)
			require.NotEqual(t, want, final, "the source changed after the target time")

			chains, err := repo.Chains(ctx)
			require.NoError(t, err)
			require.Len(t, chains, 1)
			listed := chains[0]
			require.NoError(t, listed.Err)
			assert.Equal(t, chain.ID, listed.ID)
			require.Len(t, listed.Links, 4)
			assert.Equal(t, canonical.KindDump, listed.Links[0].Kind)
			for i, l := range listed.Links {
				assert.Equal(t, i+1, l.N)
				assert.Positive(t, l.StoredBytes)
				assert.True(t, l.Encrypted)
				if i > 0 {
					assert.Equal(t, listed.Links[i-1].End, l.Start, "link %d continues link %d", i+1, i)
					assert.Equal(t, "zstd", l.Compression)
					assert.True(t, l.Authenticated)
				}
			}
			assert.Contains(t, listed.Links[0].Tables, canonical.TableName{Schema: "public", Name: "accounts"})
			assert.EqualValues(t, 1, listed.Links[1].Transactions)
			assert.Contains(t, listed.Links[1].Tables, canonical.TableName{Schema: "public", Name: "events"})
			assert.Positive(t, listed.Links[2].SchemaChanges)
			assert.True(t, listed.Links[2].FirstCommit.Before(asOf) && listed.Links[2].LastCommit.After(asOf),
				"the target time falls inside link 3: %v < %v < %v", listed.Links[2].FirstCommit, asOf, listed.Links[2].LastCommit)
			assert.Nil(t, listed.Verified)

			rep, err := repo.Verify(ctx, "", repository.VerifyOptions{})
			require.NoError(t, err)
			require.True(t, rep.OK, "%v", rep.Problems)
			listed, err = repo.Chain(ctx, chain.ID)
			require.NoError(t, err)
			require.NotNil(t, listed.Verified)
			assert.True(t, listed.Verified.OK)
			assert.Equal(t, 4, listed.Verified.Generation)

			target := connectTarget(t, repo.StreamKey())
			restored, err := repo.Restore(ctx, target.c, repository.RestoreOptions{Time: asOf})
			require.NoError(t, err)
			assert.Equal(t, chain.ID, restored.Chain)
			assert.True(t, restored.Covered)
			assert.Equal(t, want, readState(t, target.dsn), "the target is the source as of the time")

			byPos := connectTarget(t, repo.StreamKey())
			restored, err = repo.Restore(ctx, byPos.c, repository.RestoreOptions{Position: posAt})
			require.NoError(t, err)
			assert.Equal(t, 3, restored.Links, "the link that starts after the target is not read")
			assert.LessOrEqual(t, restored.Reached, posAt)
			assert.Equal(t, want, readState(t, byPos.dsn), "the target is the source at the Position")

			whole := connectTarget(t, repo.StreamKey())
			restored, err = repo.Restore(ctx, whole.c, repository.RestoreOptions{})
			require.NoError(t, err)
			assert.Equal(t, listed.End, restored.Reached)
			assert.Equal(t, final, readState(t, whole.dsn), "the latest restore is the source at the last link")

			assertMetrics(t, reader, listed)
			assertProgress(t, reports, listed)
		})
	}
}

// target is a fresh database to restore into.
type target struct {
	dsn string
	c   *siphon.Conn
}

func connectTarget(t testing.TB, opts ...siphon.Option) *target {
	t.Helper()
	dsn := siphontest.Start(t).NewDatabase(t)
	c, err := siphon.Connect(context.Background(), dsn, opts...)
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = c.ResetAppliedPosition(context.Background(), "", "")
		c.Close()
	})
	return &target{dsn: dsn, c: c}
}

// assertMetrics checks that the bytes uploaded are the chain's stored
// bytes, and that each call was timed.
func assertMetrics(t *testing.T, reader *sdkmetric.ManualReader, c *repository.Chain) {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	sums := map[string]int64{}
	calls := map[string]bool{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					kind, _ := p.Attributes.Value(attribute.Key("kind"))
					sums[m.Name+"/"+kind.AsString()] += p.Value
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					call, _ := p.Attributes.Value(attribute.Key("call"))
					calls[m.Name+"/"+call.AsString()] = p.Count > 0
				}
			}
		}
	}
	var dump, incr int64
	for _, l := range c.Links {
		if l.Kind == canonical.KindDump {
			dump += l.StoredBytes
		} else {
			incr += l.StoredBytes
		}
	}
	assert.Equal(t, dump, sums["siphon.repository.uploaded/dump"])
	assert.Equal(t, incr, sums["siphon.repository.uploaded/incremental"])
	assert.Positive(t, sums["siphon.repository.uploaded/manifest"])
	assert.GreaterOrEqual(t, sums["siphon.repository.downloaded/dump"], 2*dump, "verify and restore read the base")
	for _, call := range []string{"start_chain", "add_link", "list", "verify", "restore"} {
		assert.True(t, calls["siphon.repository.duration/"+call], "duration of %s", call)
	}
}

// assertProgress checks that each link's upload ended with a Done report
// of its size.
func assertProgress(t *testing.T, reports []repository.Progress, c *repository.Chain) {
	t.Helper()
	for _, l := range c.Links {
		found := false
		for _, p := range reports {
			if p.Op == "upload" && p.Object == l.Object && p.Done {
				found = true
				assert.Equal(t, l.Bytes, p.Bytes, "link %d", l.N)
			}
		}
		assert.True(t, found, "a final upload report for link %d", l.N)
	}
}
