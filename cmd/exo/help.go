package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
)

// helpShown is returned once a subcommand printed its --help: exit 0.
var helpShown = exitError{code: 0}

// isHelp reports whether a is a help flag.
func isHelp(a string) bool { return a == "-h" || a == "-help" || a == "--help" }

// printUsage writes usage and then fs's flags (when it has any).
func printUsage(w io.Writer, fs *flag.FlagSet, usage string) {
	fmt.Fprintln(w, strings.TrimRight(usage, "\n"))
	if fs == nil {
		return
	}
	n := 0
	fs.VisitAll(func(*flag.Flag) { n++ })
	if n == 0 {
		return
	}
	fmt.Fprintln(w, "\nFlags:")
	fs.SetOutput(w)
	fs.PrintDefaults()
	fs.SetOutput(io.Discard)
}

// parseFlags parses args with fs. -h/--help prints usage and the flags to
// stdout and returns helpShown; a bad flag prints them to stderr and
// returns a usage error (exit 2) naming the problem.
func parseFlags(fs *flag.FlagSet, usage string, args []string) error {
	fs.SetOutput(io.Discard)
	err := fs.Parse(args)
	switch {
	case errors.Is(err, flag.ErrHelp):
		printUsage(os.Stdout, fs, usage)
		return helpShown
	case err != nil:
		printUsage(os.Stderr, fs, usage)
		return exitError{code: 2, msg: err.Error()}
	}
	return nil
}
