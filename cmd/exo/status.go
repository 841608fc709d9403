package main

import (
	"context"
	"errors"
	"flag"
	"os"

	"github.com/exo-pd/exo-pd/internal/status"
	"github.com/exo-pd/exo-pd/supervisor/config"
	"github.com/exo-pd/exo-pd/supervisor/dashboard"
)

// cmdStatus asks a running supervisor what the cluster is doing: `exo status [--api URL] [--config F] [--json]`.
func cmdStatus(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("status", flag.ContinueOnError)
	api := fs.String("api", "", "the supervisor's API URL (default: from "+config.DefaultPath+", else http://127.0.0.1:52415)")
	asJSON := fs.Bool("json", false, "print the raw JSON")
	cfgPath := fs.String("config", config.DefaultPath, "cluster file naming the API port and key file (a missing default is no error)")
	if err := parseFlags(fs, "usage: exo status [--api URL] [--config F] [--json]\n\nShows the cluster as the supervisor on this host sees it ("+dashboard.StatePath+"):\nits runners; every host (supervisor up or down, memory, GPU, clock offset); each\nmodel's runners and their states; the prefill links; the latest requests with\ntheir route and timings; the decode runners as its gateway sees them.", args); err != nil {
		return err
	}
	err := status.Run(ctx, os.Stdout, status.Options{API: *api, Config: *cfgPath, JSON: *asJSON})
	if ue := (status.UsageError{}); errors.As(err, &ue) {
		return exitError{2, ue.Msg}
	}
	return err
}
