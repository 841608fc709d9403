package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/exo-pd/exo-pd/supervisor"
	"github.com/exo-pd/exo-pd/supervisor/config"
	"github.com/exo-pd/exo-pd/supervisor/process"
)

const superviseUsage = `usage: exo supervise [--config F | --default] [--host H] [--listen HOST:PORT]

Runs this host's share of the cluster: its runners as children (restarted
with backoff), the API gateway ([api] port, default 52415; --listen
overrides), /metrics, and live reloads of the cluster file.`

// cmdSupervise runs this host's share of the cluster: `exo supervise
// [--config PATH] [--host NAME]`. With --default (what a bare `exo` runs) it
// supervises /etc/exo/cluster.toml when that exists, and otherwise the
// embedded one-host default (SmolLM2-135M on the CPU backend).
func cmdSupervise(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("supervise", flag.ContinueOnError)
	cfgPath := fs.String("config", "", "cluster file (default "+config.DefaultPath+")")
	useDefault := fs.Bool("default", false, "supervise "+config.DefaultPath+" if it exists, else the embedded one-host default")
	host := fs.String("host", "", "this host's name in the cluster file (default: hostname, then a local address)")
	listen := fs.String("listen", "", "API gateway address HOST:PORT (overrides [api] in the file)")
	grace := fs.Duration("grace", 10*time.Second, "time runners get between SIGTERM and SIGKILL; their requests in hand get all of it but 3s to finish (passed as --stop-grace)")
	liveness := fs.Duration("liveness", 10*time.Second, "restart a ready runner whose /health stays unanswered this long (negative: never; overrides [supervisor] liveness_timeout)")
	livenessStart := fs.Duration("liveness-starting", 2*time.Minute, "the same before a runner's first ready answer (a loading runner answers 503, which counts; overrides [supervisor] liveness_starting_timeout)")
	readHeader := fs.Duration("read-header-timeout", 10*time.Second, "API connections that have not sent their headers within this are closed")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	logFormat := fs.String("log-format", "text", "text or json")
	if err := parseFlags(fs, superviseUsage, args); err != nil {
		return err
	}
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(*logLevel)); err != nil {
		return exitError{2, fmt.Sprintf("--log-level: %v", err)}
	}
	hopts := &slog.HandlerOptions{Level: lvl}
	var h slog.Handler = slog.NewTextHandler(os.Stderr, hopts)
	if *logFormat == "json" {
		h = slog.NewJSONHandler(os.Stderr, hopts)
	}
	log := slog.New(h)

	if *liveness == 0 || *livenessStart == 0 {
		return exitError{2, "--liveness and --liveness-starting must not be 0 (negative turns the check off)"}
	}
	if *readHeader <= 0 {
		return exitError{2, "--read-header-timeout must be positive"}
	}
	// Liveness flags given on the command line win over [supervisor] in the
	// cluster file; left at 0, the supervisor takes the file's value or the
	// default.
	var live process.Liveness
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "liveness":
			live.Ready = *liveness
		case "liveness-starting":
			live.Starting = *livenessStart
		}
	})
	o := supervisor.Options{Host: *host, APIListen: *listen, Logger: log, ReadHeaderTimeout: *readHeader,
		Process: process.Options{Grace: *grace, Liveness: live}}
	switch {
	case *cfgPath != "":
		o.ConfigPath = *cfgPath
	case *useDefault:
		if _, err := os.Stat(config.DefaultPath); err == nil {
			o.ConfigPath = config.DefaultPath
		} else {
			o.Embedded = true
			c := config.Default()
			var names []string
			for _, m := range c.Models {
				names = append(names, m.Name)
			}
			fmt.Fprintf(os.Stderr, "exo: no %s: running the built-in one-host cluster (%s on the CPU backend)\n", config.DefaultPath, strings.Join(names, ", "))
		}
	default:
		o.ConfigPath = config.DefaultPath
	}
	o.Ready = func(api string) {
		fmt.Fprintf(os.Stderr, "exo: ready: OpenAI API at %s/v1 (metrics %s/metrics, status: exo status)\n", api, api)
	}
	return supervisor.Run(ctx, o)
}
