package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/exo-pd/exo-pd/internal/localrun"
	"github.com/exo-pd/exo-pd/runners/gen"
	"github.com/exo-pd/exo-pd/supervisor/config"
)

// runOptions are exo run's flags.
type runOptions struct {
	localrun.Options
	configPath string
}

const runUsage = `usage: exo run [flags] ["prompt"]

Generates a reply from a local model (a directory, a .gguf file, builtin:smollm2,
an HF id, or a model name served in the cluster file). With a prompt, or a
prompt piped on stdin, it answers once; with neither on a terminal, it is an
interactive chat that keeps the conversation (/bye or Ctrl-D ends it). It
generates as a decode runner does (chat template, prefix cache between turns,
sampling, stop and end tokens), in process; the answer goes to stdout, a
reasoning model's reasoning (<think>, harmony's analysis channel) to stderr.

Sampling: the model's defaults (generation_config.json, GGUF general.sampling.*),
then the cluster file's [models.defaults] when --model is a served name, then
these flags. Without --seed every run draws fresh randomness.`

// cmdRun generates replies in the terminal through internal/localrun (the
// decode runner's generation, in process).
func cmdRun(ctx context.Context, args []string) error {
	var o runOptions
	fs := flag.NewFlagSet("exo run", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&o.Model, "model", "builtin:smollm2", "model: a served name of the cluster file, a directory, .gguf file, builtin:smollm2 or HF id org/name[@rev]")
	fs.StringVar(&o.configPath, "config", "", "cluster file whose served names --model accepts (default "+config.DefaultPath+" if present, else the embedded default)")
	fs.StringVar(&o.Backend, "backend", "auto", "backend: auto, cpu or mlx")
	fs.StringVar(&o.Device, "device", "", "mlx device: gpu or cpu (default: gpu when MLX has one)")
	fs.IntVar(&o.Threads, "threads", 0, "cpu backend threads (0: all cores)")
	fs.StringVar(&o.System, "system", "", "system prompt")
	fs.Var(optFloat{&o.Flags.Temperature}, "temperature", "sampling temperature (0: greedy; default: the model's, else 1)")
	fs.Var(optFloat{&o.Flags.TopP}, "top-p", "nucleus sampling threshold (default: the model's, else 1)")
	fs.Var(optInt{&o.Flags.TopK}, "top-k", "sample among the k most likely tokens (default: the model's, else all)")
	fs.Var(optFloat{&o.Flags.MinP}, "min-p", "drop tokens below min-p × the top probability (default: the model's, else 0)")
	fs.Var(optFloat{&o.Flags.RepetitionPenalty}, "repeat-penalty", "repetition penalty (default: the model's, else 1: none)")
	fs.Var(optInt64{&o.Seed}, "seed", "sampling seed (default: fresh randomness)")
	fs.IntVar(&o.MaxTokens, "max-tokens", 512, "most tokens to generate per reply")
	fs.BoolVar(&o.Stats, "stats", false, "print prefill and decode tokens/s to stderr")
	fs.BoolVar(&o.Offline, "offline", false, "never download: use local paths and the model store only")
	var words []string
	for {
		if err := parseFlags(fs, runUsage, args); err != nil {
			return err
		}
		if fs.NArg() == 0 {
			break
		}
		words = append(words, fs.Arg(0))
		args = fs.Args()[1:]
	}
	if o.MaxTokens <= 0 {
		return exitError{code: 2, msg: "exo run: --max-tokens must be positive"}
	}
	if err := o.Flags.Check(); err != nil {
		return exitError{code: 2, msg: "exo run: " + err.Error()}
	}
	if err := o.resolveServedName(); err != nil {
		return err
	}
	prompt := strings.Join(words, " ")
	interactive := false
	if prompt == "" {
		if isTerminal(os.Stdin) {
			interactive = true
		} else {
			b, err := io.ReadAll(os.Stdin)
			if err != nil {
				return fmt.Errorf("exo run: reading the prompt from stdin: %w", err)
			}
			prompt = strings.TrimSpace(string(b))
			if prompt == "" {
				printUsage(os.Stderr, fs, runUsage)
				return exitError{code: 2, msg: "exo run: no prompt (give one as an argument, on stdin, or run on a terminal for a chat)"}
			}
		}
	}
	if !interactive {
		return localrun.Run(ctx, o.Options, prompt, os.Stdout, os.Stderr)
	}
	s, err := localrun.Open(ctx, o.Options, os.Stderr)
	if err != nil {
		return err
	}
	defer s.Close()
	return s.Chat(ctx, os.Stdin, os.Stdout, os.Stderr)
}

// resolveServedName turns a --model that names a model of the cluster file
// into that model's decode source and [models.defaults].
func (o *runOptions) resolveServedName() error {
	var c *config.Config
	switch {
	case o.configPath != "":
		var err error
		if c, err = config.Load(o.configPath); err != nil {
			return fmt.Errorf("exo run: --config: %w", err)
		}
	default:
		if lc, err := config.Load(config.DefaultPath); err == nil {
			c = lc
		} else {
			c = config.Default()
		}
	}
	for _, m := range c.Models {
		if m.Name != o.Model || m.Decode == nil {
			continue
		}
		o.Model = m.Decode.Source
		if d := m.Defaults; d != nil {
			o.Cluster = gen.Defaults{Temperature: d.Temperature, TopP: d.TopP, TopK: d.TopK, MinP: d.MinP, RepetitionPenalty: d.RepetitionPenalty}
		}
		return nil
	}
	return nil
}

func isTerminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// optInt64 is an int64 flag that records whether it was given.
type optInt64 struct{ p **int64 }

func (o optInt64) String() string {
	if o.p == nil || *o.p == nil {
		return ""
	}
	return strconv.FormatInt(**o.p, 10)
}

func (o optInt64) Set(s string) error {
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return err
	}
	*o.p = &v
	return nil
}
