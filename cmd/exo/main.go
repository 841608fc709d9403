// Command exo is the one binary of exo-pd: the per-host supervisor, the
// prefill and decode runners it starts, and the operator's tools. main only
// parses the subcommand and hands a context to it; every subcommand lives in
// its own file as func(ctx, args) error.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"syscall"

	"github.com/exo-pd/exo-pd/cmd/internal/version"
)

type command struct {
	run     func(ctx context.Context, args []string) error
	summary string
}

func commands() map[string]command {
	return map[string]command{
		"supervise": {cmdSupervise, "run this host's share of the cluster (what systemd/launchd start)"},
		"runner":    {cmdRunner, "run one prefill or decode runner (started by the supervisor)"},
		"config":    {cmdConfig, "config check [PATH]: validate a cluster file and print each host's plan"},
		"run":       {cmdRun, "generate from a local model in the terminal"},
		"bench":     {cmdBench, "measure TTFT and tokens/s against an endpoint"},
		"model":     {cmdModel, "pull, list and remove models in the local store"},
		"status":    {cmdStatus, "show what a running supervisor is doing"},
		"doctor":    {cmdDoctor, "check that this host can serve its part of the cluster (and its links to the others)"},
		"version":   {cmdVersion, "print the version"},
	}
}

func usage(w io.Writer) {
	fmt.Fprintf(w, "usage: exo <command> [flags]\n\nWith no command, exo runs `exo supervise --default`: /etc/exo/cluster.toml when\nit exists, else the embedded one-host cluster serving SmolLM2-135M-Instruct on\nthe CPU backend (`exo config default` prints it).\n\nCommands:\n")
	cmds := commands()
	names := make([]string, 0, len(cmds))
	for n := range cmds {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-10s %s\n", n, cmds[n].summary)
	}
}

func main() {
	args := os.Args[1:]
	name := "supervise"
	if len(args) == 0 {
		args = []string{"--default"}
	} else {
		name, args = args[0], args[1:]
	}
	if name == "-h" || name == "--help" || name == "help" {
		usage(os.Stdout)
		fmt.Println("\n`exo COMMAND --help` shows a command's flags.")
		return
	}
	cmd, ok := commands()[name]
	if !ok {
		fmt.Fprintf(os.Stderr, "exo: unknown command %q\n\n", name)
		usage(os.Stderr)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := cmd.run(ctx, args); err != nil && !errors.Is(err, context.Canceled) {
		var ee exitError
		if errors.As(err, &ee) {
			if ee.msg != "" {
				fmt.Fprintln(os.Stderr, "exo:", ee.msg)
			}
			os.Exit(ee.code)
		}
		fmt.Fprintln(os.Stderr, "exo:", err)
		os.Exit(1)
	}
}

// exitError asks main to exit with a specific code (e.g. 1 from `config check`
// after the errors were printed, 2 for usage errors).
type exitError struct {
	code int
	msg  string
}

func (e exitError) Error() string { return fmt.Sprintf("exit %d: %s", e.code, e.msg) }

func cmdVersion(ctx context.Context, args []string) error {
	if len(args) > 0 && isHelp(args[0]) {
		fmt.Println("usage: exo version\n\nPrints the version of this exo binary.")
		return helpShown
	}
	fmt.Println("exo", version.String())
	return nil
}

// errNotYet is returned by subcommands whose implementation has not landed.
var errNotYet = errors.New("not implemented in this build yet")
