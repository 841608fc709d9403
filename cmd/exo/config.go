package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strings"

	"github.com/exo-pd/exo-pd/internal/hostmem"
	"github.com/exo-pd/exo-pd/internal/modelinfo"
	"github.com/exo-pd/exo-pd/supervisor/config"
)

// cmdConfig implements `exo config check [PATH]` and `exo config default`.
func cmdConfig(ctx context.Context, args []string) error {
	const usage = "usage: exo config check [PATH] | exo config default\n\ncheck validates a cluster file (default " + config.DefaultPath + ") and prints\neach host's runners and their command lines; default prints the embedded\none-host cluster file."
	if len(args) == 0 {
		return exitError{2, usage}
	}
	if isHelp(args[0]) || len(args) > 1 && isHelp(args[1]) {
		fmt.Println(usage)
		return helpShown
	}
	switch args[0] {
	case "check":
		fs := flag.NewFlagSet("config check", flag.ContinueOnError)
		if err := parseFlags(fs, usage, args[1:]); err != nil {
			return err
		}
		path := config.DefaultPath
		if fs.NArg() > 0 {
			path = fs.Arg(0)
		}
		return configCheck(os.Stdout, os.Stderr, path)
	case "default":
		fmt.Print(config.DefaultText())
		return nil
	}
	return exitError{2, fmt.Sprintf("config: unknown subcommand %q (want check or default)", args[0])}
}

// configCheck validates path and prints each host's plan to out, or every
// error to errOut and returns exit status 1.
func configCheck(out, errOut io.Writer, path string) error {
	c, err := config.Load(path)
	if err != nil {
		var es config.Errors
		if errors.As(err, &es) {
			for _, e := range es {
				fmt.Fprintln(errOut, e)
			}
			return exitError{1, fmt.Sprintf("%s: %d error(s)", path, len(es))}
		}
		if errors.Is(err, fs.ErrNotExist) {
			return exitError{1, fmt.Sprintf("%v (name a cluster file: exo config check PATH; `exo config default` prints the one-host default to start from, etc/exo/cluster.example.toml a Spark + two Macs)", err)}
		}
		return exitError{1, err.Error()}
	}
	// Pipelines are placed from the model's files when this machine has
	// them (else placement is left to start-up) and this host's memory.
	host, _ := c.Identify("", hostname(), config.LocalAddrs())
	mem, _ := hostmem.Reported()
	store, _ := modelinfo.StoreDir(c.Cluster.ModelsDir)
	ps, err := c.Place(modelinfo.Local(context.Background(), store), host, mem)
	if err != nil {
		var es config.Errors
		if errors.As(err, &es) {
			for _, e := range es {
				fmt.Fprintln(errOut, e)
			}
			return exitError{1, fmt.Sprintf("%s: %d error(s)", path, len(es))}
		}
		return exitError{1, err.Error()}
	}
	printPlan(out, c)
	config.WritePlacement(out, ps)
	return nil
}

func hostname() string {
	h, _ := os.Hostname()
	return h
}

func printPlan(out io.Writer, c *config.Config) {
	name := c.Cluster.Name
	if name == "" {
		name = "(unnamed)"
	}
	fmt.Fprintf(out, "%s: ok: cluster %s, %d host(s), %d model(s), API on port %d of every host\n", c.Path, name, len(c.Hosts), len(c.Models), c.API.Port)
	for _, hn := range c.HostNames() {
		h := c.Hosts[hn]
		rs := c.Runners(hn)
		fmt.Fprintf(out, "\nhost %s (%s, backend %s): %d runner(s)\n", hn, h.Address, h.Backend, len(rs))
		for _, r := range rs {
			fmt.Fprintf(out, "  %-24s exo %s\n", r.Name, strings.Join(r.Args(), " "))
		}
	}
}
