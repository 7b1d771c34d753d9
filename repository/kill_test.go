package repository_test

import (
	"bufio"
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/siphondb/siphon"
	"github.com/siphondb/siphon/repository"
	"github.com/siphondb/siphon/siphontest"
)

// The environment of the child, the test binary in child mode: it opens
// the repository and uploads a link (or starts a chain), and stops
// uploading once holdBytes are written, printing "holding", until it is
// killed.
const (
	childMode  = "SIPHON_REPOSITORY_CHILD" // "add-link" or "start-chain"
	childURL   = "SIPHON_REPOSITORY_CHILD_URL"
	childKey   = "SIPHON_REPOSITORY_CHILD_KEY"
	childDSN   = "SIPHON_REPOSITORY_CHILD_DSN"
	childSlot  = "SIPHON_REPOSITORY_CHILD_SLOT"
	childChain = "SIPHON_REPOSITORY_CHILD_CHAIN"
	holdBytes  = 2 << 20
)

// runChild is the child's main.
func runChild() int {
	ctx := context.Background()
	key, err := hex.DecodeString(os.Getenv(childKey))
	if err != nil {
		fmt.Println("key:", err)
		return 1
	}
	hold := func(p repository.Progress) {
		if p.Op == "upload" && p.Bytes >= holdBytes {
			fmt.Println("holding")
			select {} // until killed, mid-upload
		}
	}
	repo, err := repository.Open(ctx, os.Getenv(childURL), repository.WithKey(key), repository.WithProgress(hold))
	if err != nil {
		fmt.Println("open:", err)
		return 1
	}
	slot := os.Getenv(childSlot)
	c, err := siphon.Connect(ctx, os.Getenv(childDSN), siphon.WithSlot(slot), siphon.WithPublication(slot), repo.StreamKey(),
		siphon.WithLogger(quiet))
	if err != nil {
		fmt.Println("connect:", err)
		return 1
	}
	fmt.Println("started")
	if os.Getenv(childMode) == "start-chain" {
		_, err = repo.StartChain(ctx, c, repository.StartChainOptions{Backup: siphon.BackupOptions{Compression: "0"}})
	} else {
		_, err = repo.AddLink(ctx, c, os.Getenv(childChain))
	}
	fmt.Println("finished before it was killed:", err)
	return 1
}

// TestKillMidUploadLeavesNoLink kills a process in the middle of the
// upload of an incremental, then of a base backup, on a directory and on
// an S3 server: the listing shows the chain as it was, which verifies and
// restores to the source's state at its last link, the next AddLink
// continues it, no base slot of the killed backup is left on the source,
// and Expire sweeps what the killed uploads left in the bucket.
func TestKillMidUploadLeavesNoLink(t *testing.T) {
	t.Parallel()
	for _, be := range backends {
		t.Run(be.name, func(t *testing.T) {
			t.Parallel()
			siphontest.Start(t).SkipUnlessDumpClients(t)
			ctx := context.Background()
			key := newKey(t)
			u := be.url(t)
			repo := openRepo(t, u, repository.WithKey(key))
			src := newSource(t, repo.StreamKey())
			chain := makeChain(t, repo, src, 1)
			atLink2 := readState(t, src.dsn)
			src.exec(t, `INSERT INTO events (account, note) SELECT 1 + g % 200, md5(g::text) || md5((g * 7)::text) FROM generate_series(1, 60000) g`)

			env := []string{childURL + "=" + u, childKey + "=" + hex.EncodeToString(key), childDSN + "=" + src.dsn,
				childSlot + "=" + src.slot, childChain + "=" + chain.ID, "TMPDIR=" + t.TempDir()}
			killMidUpload(t, append(env, childMode+"=add-link"))
			awaitSlotReleased(t, src.conn, src.slot)

			chains, err := repo.Chains(ctx)
			require.NoError(t, err)
			require.Len(t, chains, 1)
			assert.Equal(t, 2, chains[0].Generation, "the killed link is not listed")
			rep, err := repo.Verify(ctx, chain.ID, repository.VerifyOptions{})
			require.NoError(t, err)
			assert.True(t, rep.OK, "%v", rep.Problems)
			tgt := connectTarget(t, repo.StreamKey())
			_, err = repo.Restore(ctx, tgt.c, repository.RestoreOptions{})
			require.NoError(t, err)
			assert.Equal(t, atLink2, readState(t, tgt.dsn))

			chain, err = repo.AddLink(ctx, src.c, chain.ID)
			require.NoError(t, err, "the next link continues the chain")
			require.Len(t, chain.Links, 3)
			assert.EqualValues(t, 1, chain.Links[2].Transactions)

			bases := physicalSlots(t, src.conn)
			killMidUpload(t, append(env, childMode+"=start-chain"))
			awaitCondition(t, "the killed backup's base slot is gone", func() bool {
				return len(physicalSlots(t, src.conn)) <= len(bases)
			})
			chains, err = repo.Chains(ctx)
			require.NoError(t, err)
			assert.Len(t, chains, 1, "the killed chain is not listed")

			ex, err := repo.Expire(ctx, src.c, repository.ExpireOptions{KeepChains: 1, OrphansAfter: time.Nanosecond})
			require.NoError(t, err)
			assert.Empty(t, ex.Expired)
			if be.name == "file" {
				// fileblob writes a temporary file next to the object
				// and renames it on completion: the killed ones are left.
				assert.NotEmpty(t, ex.Orphans, "the killed uploads' temporary files are swept")
			}
			assertOnlyListed(t, u, chain)
		})
	}
}

// killMidUpload runs the child until it says it is holding mid-upload,
// then SIGKILLs it.
func killMidUpload(t *testing.T, env []string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	lines := make(chan string)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	var said []string
	deadline := time.After(3 * time.Minute)
	for holding := false; !holding; {
		select {
		case line, ok := <-lines:
			if !ok {
				require.NoError(t, cmd.Wait())
				t.Fatalf("the child ended before it was killed: %v", said)
			}
			said = append(said, line)
			holding = line == "holding"
		case <-deadline:
			_ = cmd.Process.Kill()
			t.Fatalf("the child did not reach the middle of its upload: %v", said)
		}
	}
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	for range lines {
	}
	err = cmd.Wait()
	require.Error(t, err, "killed")
	assert.Contains(t, err.Error(), "killed")
	_, _ = io.Copy(io.Discard, out)
}

// awaitSlotReleased waits until no session holds the slot (the killed
// child's walsender has gone).
func awaitSlotReleased(t *testing.T, conn *pgx.Conn, slot string) {
	t.Helper()
	awaitCondition(t, "slot "+slot+" released", func() bool {
		var active bool
		err := conn.QueryRow(context.Background(), `SELECT active FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&active)
		return err == nil && !active
	})
}

func physicalSlots(t *testing.T, conn *pgx.Conn) []string {
	t.Helper()
	rows, err := conn.Query(context.Background(), `SELECT slot_name FROM pg_replication_slots WHERE slot_type = 'physical' ORDER BY 1`)
	require.NoError(t, err)
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return names
}

// awaitCondition waits for cond with a deadline only a hang reaches.
func awaitCondition(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited a minute for: %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// assertOnlyListed checks that the bucket holds only the chain's link
// objects, its manifests and its verification records.
func assertOnlyListed(t *testing.T, u string, c *repository.Chain) {
	t.Helper()
	b := openBucket(t, u)
	listed := map[string]bool{}
	for _, l := range c.Links {
		listed[l.Object] = true
	}
	it := b.List(nil)
	for {
		obj, err := it.Next(context.Background())
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
		base := obj.Key[strings.LastIndexByte(obj.Key, '/')+1:]
		ok := listed[obj.Key] || strings.HasPrefix(base, "manifest-") || strings.HasPrefix(base, "verified-")
		assert.True(t, ok && strings.HasPrefix(obj.Key, "chains/"+c.ID+"/"), "left in the bucket: %s", obj.Key)
	}
}
