package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/exo-pd/exo-pd/runners/hf"
)

const modelUsage = `usage:
  exo model pull [--models-dir D] [--offline] [--layers A:B] ID[@REV]
                                                       fetch a Hugging Face model into the store
  exo model list [--models-dir D]                      show the models in the store
  exo model rm   [--models-dir D] ID                   delete a model (every revision) from the store

ID is org/name (a safetensors model) or org/name/FILE.gguf (one GGUF file);
REV is a branch, tag or commit (default main). The store is $EXO_MODELS_DIR,
else $STATE_DIRECTORY/models, else ~/.cache/exo/models. HF_TOKEN and
HF_ENDPOINT are honoured; HF_HUB_OFFLINE=1 uses only the store.

--layers A:B pulls only what a pipeline stage holding layers [A, B) (0-based,
half-open) needs: the config and tokenizer files and the safetensors shards
that model.safetensors.index.json assigns to those layers, plus the
embedding's with A = 0 and the final norm's and LM head's with B = the layer
count (a tied head: the embedding's too). A repository without a shard index,
and a GGUF file, are fetched whole (split GGUFs are not supported). Such a
partial snapshot serves that stage's runner (--layers A:B), not the whole
model; exo model list marks it "(stage files)".`

// cmdModel manages the local model store (runners/hf).
func cmdModel(ctx context.Context, args []string) error {
	if len(args) == 0 {
		fmt.Fprintln(os.Stderr, modelUsage)
		return exitError{code: 2}
	}
	if isHelp(args[0]) {
		fmt.Println(modelUsage)
		return helpShown
	}
	sub, args := args[0], args[1:]
	fs := flag.NewFlagSet("exo model "+sub, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	dir := fs.String("models-dir", "", "model store directory")
	offline := fs.Bool("offline", false, "use only the store")
	layers := fs.String("layers", "", "pull: only the files of layers A:B (a pipeline stage's)")
	if err := parseFlags(fs, modelUsage, args); err != nil {
		return err
	}
	o := hf.Options{StoreDir: *dir, Offline: *offline}
	if *layers != "" {
		if sub != "pull" {
			return exitError{code: 2, msg: fmt.Sprintf("--layers applies to exo model pull, not %s", sub)}
		}
		r, err := hf.ParseLayers(*layers)
		if err != nil {
			return exitError{code: 2, msg: "--layers: " + err.Error()}
		}
		o.Layers = r
	}
	switch sub {
	case "pull":
		if fs.NArg() != 1 {
			fmt.Fprintln(os.Stderr, modelUsage)
			return exitError{code: 2}
		}
		return modelPull(ctx, fs.Arg(0), o, os.Stdout, os.Stderr)
	case "list", "ls":
		if fs.NArg() != 0 {
			return exitError{code: 2, msg: "model list takes no arguments"}
		}
		return modelList(o, os.Stdout)
	case "rm", "remove":
		if fs.NArg() != 1 {
			fmt.Fprintln(os.Stderr, modelUsage)
			return exitError{code: 2}
		}
		if err := hf.Remove(ctx, fs.Arg(0), o); err != nil {
			return err
		}
		fmt.Fprintln(os.Stderr, "removed", fs.Arg(0))
		return nil
	case "help", "-h", "--help":
		fmt.Fprintln(os.Stdout, modelUsage)
		return nil
	}
	fmt.Fprintln(os.Stderr, modelUsage)
	return exitError{code: 2, msg: fmt.Sprintf("unknown model command %q", sub)}
}

// modelPull pulls one model with a progress line on stderr (redrawn in
// place on a terminal, one line every 5 s otherwise) and prints its path.
func modelPull(ctx context.Context, id string, o hf.Options, stdout, stderr io.Writer) error {
	ref, err := hf.ParseRef(id)
	if err != nil {
		return exitError{code: 2, msg: err.Error()}
	}
	tty := false
	if f, ok := stderr.(*os.File); ok {
		if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			tty = true
		}
	}
	meter := hf.NewMeter(10 * time.Second)
	var lastPrint time.Time
	drawn := false
	o.Progress = func(done, total int64) {
		now := time.Now()
		line := meter.Line(now, done, total)
		switch {
		case tty:
			fmt.Fprintf(stderr, "\r%s\x1b[K", line)
			drawn = true
		case now.Sub(lastPrint) >= 5*time.Second || (total > 0 && done >= total):
			fmt.Fprintln(stderr, strings.TrimSpace(line))
			lastPrint = now
		}
	}
	o.Plan = func(dir string, need, free int64) {
		switch {
		case need == 0:
			fmt.Fprintf(stderr, "%s: every file already in %s\n", id, dir)
		case free < 0:
			fmt.Fprintf(stderr, "%s: needs %s in %s (free space unknown)\n", id, hf.Bytes(need), dir)
		default:
			fmt.Fprintf(stderr, "%s: needs %s in %s, %s free\n", id, hf.Bytes(need), dir, hf.Bytes(free))
		}
	}
	p, err := hf.Pull(ctx, ref, o)
	if drawn {
		fmt.Fprintln(stderr)
	}
	if err != nil {
		if errors.Is(err, hf.ErrUnauthorized) {
			return fmt.Errorf("%w\n(request access on the model's Hugging Face page, then export HF_TOKEN=hf_…)", err)
		}
		return err
	}
	fmt.Fprintln(stdout, p)
	return nil
}

func modelList(o hf.Options, w io.Writer) error {
	ms, err := hf.List(o)
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tREVISION\tCOMMIT\tSIZE\tPATH")
	for _, m := range ms {
		id, path := m.Repo, m.Path
		switch {
		case !m.Full && len(m.Files) == 1:
			id += "/" + m.Files[0]
			path = filepath.Join(m.Path, filepath.FromSlash(m.Files[0]))
		case !m.Full:
			id += " (stage files)" // a pipeline stage's pull (--layers): some shards only
		}
		rev := strings.Join(m.Revisions, ",")
		if rev == "" {
			rev = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", id, rev, m.Commit[:12], hf.Bytes(m.Size), path)
	}
	return tw.Flush()
}
