package siphontest

import (
	"context"
	"fmt"
	"strings"

	"github.com/testcontainers/testcontainers-go"
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"
)

// dockerImage is the image used when the server comes from a Docker engine.
const dockerImage = "postgres:16-alpine"

// launchDocker starts a container through testcontainers when a Docker
// engine answers.
func launchDocker(ctx context.Context, cfg config) (srv *Server, err error) {
	defer func() {
		// testcontainers panics when it cannot find a Docker host.
		if r := recover(); r != nil {
			srv, err = nil, fmt.Errorf("no Docker engine: %v", r)
		}
	}()
	provider, err := testcontainers.ProviderDocker.GetProvider()
	if err != nil {
		return nil, fmt.Errorf("no Docker engine: %w", err)
	}
	if err := provider.Health(ctx); err != nil {
		return nil, fmt.Errorf("no Docker engine: %w", err)
	}
	cmd := []string{"postgres"}
	for _, setting := range cfg.sortedSettings() {
		if !strings.HasPrefix(setting, "listen_addresses=") {
			cmd = append(cmd, "-c", setting)
		}
	}
	container, err := tcpostgres.Run(ctx, dockerImage,
		tcpostgres.WithDatabase("postgres"),
		tcpostgres.WithUsername("postgres"),
		tcpostgres.WithPassword("postgres"),
		testcontainers.WithCmd(cmd...),
		tcpostgres.BasicWaitStrategies(),
	)
	if err != nil {
		return nil, fmt.Errorf("start postgres container: %w", err)
	}
	dsn, err := container.ConnectionString(ctx, "sslmode=disable")
	if err != nil {
		testcontainers.TerminateContainer(container)
		return nil, fmt.Errorf("postgres container: %w", err)
	}
	return &Server{dsn: dsn, source: "docker", stop: func() error {
		return testcontainers.TerminateContainer(container)
	}}, nil
}
