package siphon_test

import (
	"context"
	"fmt"
	"os"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/siphondb/siphon/siphontest"
)

func TestMain(m *testing.M) {
	if os.Getenv(faultChildSource) != "" {
		if err := faultChild(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	if os.Getenv("SIPHON_RSS_CHILD_DSN") != "" {
		if err := rssChild(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	siphontest.Main(m)
}

// newDatabase returns a fresh database's DSN and an admin session on it,
// closed when the test ends.
func newDatabase(t *testing.T) (string, *pgx.Conn) {
	t.Helper()
	dsn := siphontest.Start(t).NewDatabase(t)
	conn, err := pgx.Connect(context.Background(), dsn)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close(context.Background()) })
	return dsn, conn
}

// execSQL runs statements on conn, failing the test on error.
func execSQL(t *testing.T, conn *pgx.Conn, statements ...string) {
	t.Helper()
	for _, s := range statements {
		_, err := conn.Exec(context.Background(), s)
		require.NoError(t, err, s)
	}
}
