package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/exo-pd/exo-pd/internal/doctor"
	"github.com/exo-pd/exo-pd/runners/kvwire"
	"github.com/exo-pd/exo-pd/supervisor/config"
)

// cmdDoctor checks that this host can serve its part of the cluster.
func cmdDoctor(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("doctor", flag.ContinueOnError)
	cfgPath := fs.String("config", config.DefaultPath, "the cluster file")
	embedded := fs.Bool("default", false, "check the embedded one-host default instead of a file")
	host := fs.String("host", "", "this host's name in the file (default: hostname, then address)")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	useMLX := fs.String("mlx", "auto", "check MLX: auto (when this host's backend is cuda or metal), on, off")
	probeMiB := fs.Int("probe-mib", 64, "KV-wire link probe size per prefill endpoint, MiB (0: no goodput probe)")
	timeout := fs.Duration("timeout", 5*time.Second, "bound of each network check")
	if err := parseFlags(fs, `usage: exo doctor [--config F | --default] [--host H] [--json] [--mlx auto|on|off] [--probe-mib N]

Checks that this host can serve its part of the cluster: the cluster file,
the secret and API key files, MLX (library, version, device, a matmul on the
GPU against the cpu backend), the model store's disk, each runner's model
source, this host's ports; and
across hosts, through the other supervisors: the same cluster file, clocks,
every runner port reachable, the same KV secret (proved with the KV wire's
challenge, never sent) and the goodput of each prefill link. Every problem
comes with its fix; exit status 1 when something would break serving.`, args); err != nil {
		return err
	}
	if *useMLX != "auto" && *useMLX != "on" && *useMLX != "off" {
		return exitError{2, fmt.Sprintf("--mlx %q: want auto, on or off", *useMLX)}
	}
	if *probeMiB < 0 || int64(*probeMiB)<<20 > kvwire.ProbeMaxTokens*kvwire.ProbeBytesPerToken {
		return exitError{2, fmt.Sprintf("--probe-mib %d: 0 to %d", *probeMiB, kvwire.ProbeMaxTokens*kvwire.ProbeBytesPerToken>>20)}
	}
	rep := doctor.Run(ctx, doctor.Options{Path: *cfgPath, Embedded: *embedded, Host: *host, Timeout: *timeout, ProbeMiB: *probeMiB, MLX: *useMLX})
	if *asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			return err
		}
	} else {
		doctor.Print(os.Stdout, rep)
	}
	if !rep.OK {
		return exitError{1, ""}
	}
	return nil
}
