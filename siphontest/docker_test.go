package siphontest

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestPublishedAddress(t *testing.T) {
	addr, err := publishedAddress("0.0.0.0:49153\n[::]:49153\n127.0.0.1:49154\n")
	require.NoError(t, err)
	assert.Equal(t, "127.0.0.1:49154", addr)
	_, err = publishedAddress("[::]:49153\n")
	assert.ErrorContains(t, err, "no port published on 127.0.0.1")
}

// TestLaunchDockerWithoutEngine: on a machine with no Docker engine (this
// one, or one without the docker command), launchDocker says so and
// leaves nothing running.
func TestLaunchDockerWithoutEngine(t *testing.T) {
	if out, err := docker(context.Background(), "version", "--format", "{{.Server.Version}}"); err == nil {
		t.Skipf("a Docker engine answers (%s): this test is for machines without one", out)
	}
	_, err := launchDocker(context.Background(), newConfig(nil))
	require.Error(t, err)
	assert.Regexp(t, "no Docker engine|no docker command", err.Error())
}
