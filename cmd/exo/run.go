package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/exo-pd/exo-pd/runners/chat"
	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/engine/backend"
	"github.com/exo-pd/exo-pd/runners/hf"
	"github.com/exo-pd/exo-pd/runners/sample"
	"github.com/exo-pd/exo-pd/runners/tokenizer"
)

// runOptions are exo run's flags.
type runOptions struct {
	model, backend, system string
	device                 string
	params                 sample.Params
	maxTokens              int
	stats, offline         bool
	threads                int
}

// cmdRun generates a reply to one prompt in the terminal: it resolves and
// loads the model (progress bar on stderr), renders the model's chat
// template, prefills, and streams the reply to stdout token by token.
func cmdRun(ctx context.Context, args []string) error {
	var o runOptions
	fs := flag.NewFlagSet("exo run", flag.ContinueOnError)
	fs.SetOutput(os.Stderr)
	fs.Usage = func() {
		fmt.Fprintf(os.Stderr, "usage: exo run [flags] \"prompt\"\n\nGenerates a reply from a local model (a directory, a .gguf file, builtin:smollm2 or an HF id).\n\nFlags:\n")
		fs.PrintDefaults()
	}
	fs.StringVar(&o.model, "model", "builtin:smollm2", "model: directory, .gguf file, builtin:smollm2 or HF id org/name[@rev]")
	fs.StringVar(&o.backend, "backend", "auto", "backend: auto, cpu or mlx")
	fs.StringVar(&o.device, "device", "", "mlx device: gpu or cpu (default: gpu when MLX has one)")
	fs.IntVar(&o.threads, "threads", 0, "cpu backend threads (0: all cores)")
	fs.StringVar(&o.system, "system", "", "system prompt")
	fs.Float64Var(&o.params.Temperature, "temperature", 0, "sampling temperature (0: greedy)")
	fs.Float64Var(&o.params.TopP, "top-p", 1, "nucleus sampling threshold")
	fs.IntVar(&o.params.TopK, "top-k", 0, "sample among the k most likely tokens (0: all)")
	fs.Float64Var(&o.params.MinP, "min-p", 0, "drop tokens below min-p × the top probability")
	fs.Float64Var(&o.params.RepetitionPenalty, "repeat-penalty", 1, "repetition penalty (1: none)")
	fs.Int64Var(&o.params.Seed, "seed", 0, "sampling seed")
	fs.IntVar(&o.maxTokens, "max-tokens", 512, "most tokens to generate")
	fs.BoolVar(&o.stats, "stats", false, "print prefill and decode tokens/s to stderr")
	fs.BoolVar(&o.offline, "offline", false, "never download: use local paths and the model store only")
	var words []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil
			}
			return exitError{code: 2}
		}
		if fs.NArg() == 0 {
			break
		}
		words = append(words, fs.Arg(0))
		args = fs.Args()[1:]
	}
	prompt := strings.Join(words, " ")
	if prompt == "" {
		fs.Usage()
		return exitError{code: 2, msg: "exo run: no prompt"}
	}
	if o.maxTokens <= 0 {
		return exitError{code: 2, msg: "exo run: --max-tokens must be positive"}
	}
	return run(ctx, o, prompt, os.Stdout, os.Stderr)
}

func run(ctx context.Context, o runOptions, prompt string, stdout, stderr io.Writer) error {
	bar := newProgressBar(stderr)
	path, err := hf.Resolve(ctx, o.model, hf.Options{Offline: o.offline, Progress: bar.update("downloading")})
	bar.done()
	if err != nil {
		return fmt.Errorf("resolve model %s: %w", o.model, err)
	}
	b, err := backend.Open(o.backend, backend.Options{Threads: o.threads, Device: o.device})
	if err != nil {
		return err
	}
	tok, err := tokenizer.Load(path)
	if err != nil {
		return fmt.Errorf("tokenizer: %w", err)
	}
	tmpl, err := chat.Load(path)
	if err != nil {
		return fmt.Errorf("chat template: %w", err)
	}
	t0 := time.Now()
	m, err := engine.Load(ctx, path, b, engine.LoadOptions{Progress: bar.update("loading weights")})
	bar.done()
	if err != nil {
		return err
	}
	defer m.Close()
	loadTime := time.Since(t0)

	var msgs []chat.Message
	if o.system != "" {
		msgs = append(msgs, chat.Message{Role: "system", Content: o.system})
	}
	msgs = append(msgs, chat.Message{Role: "user", Content: prompt})
	text, err := tmpl.Render(msgs, true)
	if err != nil {
		return fmt.Errorf("chat template: %w", err)
	}
	ids := tok.EncodeChat(text)
	if len(ids) == 0 {
		return errors.New("the prompt encodes to no tokens")
	}
	if max := m.Info().MaxPositions; len(ids)+o.maxTokens > max {
		o.maxTokens = max - len(ids)
		if o.maxTokens <= 0 {
			return fmt.Errorf("prompt of %d tokens exceeds the model's %d positions", len(ids), max)
		}
	}

	cache := m.NewCache()
	defer cache.Free()
	sampler := sample.New(o.params)
	stream := tok.NewStreamDecoder()
	eos := tok.EOS()
	history := slices.Clone(ids)

	t1 := time.Now()
	logits, err := m.Forward(ctx, cache, ids)
	if err != nil {
		return err
	}
	prefillTime := time.Since(t1)
	t2 := time.Now()
	generated := 0
	for generated < o.maxTokens {
		next := sampler.Sample(logits, history)
		generated++
		if slices.Contains(eos, next) {
			break
		}
		history = append(history, next)
		if _, err := io.WriteString(stdout, stream.Add(next)); err != nil {
			return err
		}
		if generated == o.maxTokens {
			break
		}
		if logits, err = m.Forward(ctx, cache, []int32{next}); err != nil {
			return err
		}
	}
	decodeTime := time.Since(t2)
	fmt.Fprintln(stdout, stream.Flush())
	if o.stats {
		fmt.Fprintf(stderr, "backend %s, load %.2fs\nprefill: %d tokens in %.3fs (%.1f tokens/s)\ndecode: %d tokens in %.3fs (%.1f tokens/s)\n",
			b.Name(), loadTime.Seconds(),
			len(ids), prefillTime.Seconds(), float64(len(ids))/prefillTime.Seconds(),
			generated, decodeTime.Seconds(), float64(max(generated-1, 0))/decodeTime.Seconds())
	}
	return nil
}

// progressBar draws "label [=====>    ] 42%" on a terminal; elsewhere it
// prints nothing (logs stay clean).
type progressBar struct {
	w       io.Writer
	tty     bool
	last    time.Time
	drawn   bool
	lastPct int
}

func newProgressBar(w io.Writer) *progressBar {
	p := &progressBar{w: w, lastPct: -1}
	if f, ok := w.(*os.File); ok {
		if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			p.tty = true
		}
	}
	return p
}

func (p *progressBar) update(label string) func(done, total int64) {
	return func(done, total int64) {
		if !p.tty || total <= 0 {
			return
		}
		pct := int(100 * done / total)
		if pct == p.lastPct || (time.Since(p.last) < 100*time.Millisecond && pct < 100) {
			return
		}
		p.last, p.lastPct, p.drawn = time.Now(), pct, true
		const width = 30
		fill := width * pct / 100
		bar := strings.Repeat("=", fill)
		if fill < width {
			bar += ">" + strings.Repeat(" ", width-fill-1)
		}
		fmt.Fprintf(p.w, "\r%s [%s] %3d%%", label, bar, pct)
	}
}

func (p *progressBar) done() {
	if p.drawn {
		fmt.Fprintln(p.w)
	}
	p.drawn, p.lastPct = false, -1
}
