package repository_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/siphondb/siphon"
	"github.com/siphondb/siphon/repository"
)

// A backup orchestrator's day: a chain every day, a link every hour,
// retention, and a restore drill (see examples/orchestrator for all of it
// running).
func Example() {
	ctx := context.Background()
	key, err := os.ReadFile("/etc/siphon/repository.key") // 32 random bytes, never in the bucket
	if err != nil {
		log.Fatal(err)
	}
	repo, err := repository.Open(ctx, "s3://backups?region=eu-west-1&prefix=shop/", repository.WithKey(key))
	if err != nil {
		log.Fatal(err)
	}
	defer repo.Close()
	src, err := siphon.Connect(ctx, os.Getenv("SHOP_DSN"), siphon.WithSlot("shop_backup"), repo.StreamKey())
	if err != nil {
		log.Fatal(err)
	}
	defer src.Close()

	if _, err := repo.StartChain(ctx, src, repository.StartChainOptions{}); err != nil { // at midnight
		log.Fatal(err)
	}
	if _, err := repo.AddLink(ctx, src, ""); err != nil { // every hour
		log.Fatal(err)
	}
	if _, err := repo.Expire(ctx, src, repository.ExpireOptions{KeepChains: 7, KeepFor: 7 * 24 * time.Hour}); err != nil {
		log.Fatal(err)
	}

	target, err := siphon.Connect(ctx, os.Getenv("DRILL_DSN"), repo.StreamKey()) // an empty database
	if err != nil {
		log.Fatal(err)
	}
	defer target.Close()
	rep, err := repo.Restore(ctx, target, repository.RestoreOptions{Time: time.Now().Add(-90 * time.Minute)})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("restored chain", rep.Chain, "to", rep.Reached)
}

// Listing a repository: its chains with their positions, sizes and
// verifications.
func ExampleRepository_Chains() {
	ctx := context.Background()
	repo, err := repository.Open(ctx, "file:///var/backups/siphon?no_tmp_dir=true&metadata=skip")
	if err != nil {
		log.Fatal(err)
	}
	defer repo.Close()
	chains, err := repo.Chains(ctx)
	if err != nil {
		log.Fatal(err)
	}
	for _, c := range chains {
		if c.Err != nil {
			fmt.Println(c.ID, "DAMAGED:", c.Err)
			continue
		}
		fmt.Printf("%s  %d links  %v -> %v  taken %s .. %s  %d bytes  verified %v\n",
			c.ID, len(c.Links), c.Start, c.End, c.Created.Format(time.RFC3339), c.Covered.Format(time.RFC3339),
			c.StoredBytes, c.Verified != nil && c.Verified.OK)
	}
}

// Decrypting a base backup by hand, to pg_restore it: the object downloaded
// from the bucket, its key in the bucket from "chains/" on, and the
// repository's key.
func ExampleDecrypt() {
	key, err := os.ReadFile("repository.key")
	if err != nil {
		log.Fatal(err)
	}
	in, err := os.Open("0001-base-a7c2qd.dump.enc")
	if err != nil {
		log.Fatal(err)
	}
	defer in.Close()
	out, err := os.Create("0001-base-a7c2qd.dump")
	if err != nil {
		log.Fatal(err)
	}
	err = repository.Decrypt(out, in, "chains/20261201T020000.000Z-k3m9x2/0001-base-a7c2qd.dump.enc", key)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove("0001-base-a7c2qd.dump")
		log.Fatal(err)
	}
	// Then: pg_restore --exit-on-error -d postgres://.../restored 0001-base-a7c2qd.dump
}
