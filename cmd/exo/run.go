package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/exo-pd/exo-pd/runners/chat"
	"github.com/exo-pd/exo-pd/runners/decode"
	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/engine/backend"
	"github.com/exo-pd/exo-pd/runners/hf"
	"github.com/exo-pd/exo-pd/runners/openai"
	"github.com/exo-pd/exo-pd/runners/sample"
	"github.com/exo-pd/exo-pd/runners/tokenizer"
	"github.com/exo-pd/exo-pd/supervisor/config"
)

// runOptions are exo run's flags.
type runOptions struct {
	model, backend, system string
	device                 string
	// flags are the sampling flags given (nil: not given); cluster the
	// [models.defaults] of a served name given as --model.
	flags, cluster openai.Defaults
	seed           *int64
	maxTokens      int
	stats, offline bool
	threads        int
	configPath     string
}

const runUsage = `usage: exo run [flags] ["prompt"]

Generates a reply from a local model (a directory, a .gguf file, builtin:smollm2,
an HF id, or a model name served in the cluster file). With a prompt, or a
prompt piped on stdin, it answers once; with neither on a terminal, it is an
interactive chat that keeps the conversation (/bye or Ctrl-D ends it).

Sampling: the model's defaults (generation_config.json, GGUF general.sampling.*),
then the cluster file's [models.defaults] when --model is a served name, then
these flags. Without --seed every run draws fresh randomness.`

// cmdRun generates replies in the terminal: it resolves and loads the model
// (progress bar on stderr), renders the model's chat template, prefills,
// and streams each reply to stdout token by token.
func cmdRun(ctx context.Context, args []string) error {
	var o runOptions
	fs := flag.NewFlagSet("exo run", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&o.model, "model", "builtin:smollm2", "model: a served name of the cluster file, a directory, .gguf file, builtin:smollm2 or HF id org/name[@rev]")
	fs.StringVar(&o.configPath, "config", "", "cluster file whose served names --model accepts (default "+config.DefaultPath+" if present, else the embedded default)")
	fs.StringVar(&o.backend, "backend", "auto", "backend: auto, cpu or mlx")
	fs.StringVar(&o.device, "device", "", "mlx device: gpu or cpu (default: gpu when MLX has one)")
	fs.IntVar(&o.threads, "threads", 0, "cpu backend threads (0: all cores)")
	fs.StringVar(&o.system, "system", "", "system prompt")
	fs.Var(optFloat{&o.flags.Temperature}, "temperature", "sampling temperature (0: greedy; default: the model's, else 1)")
	fs.Var(optFloat{&o.flags.TopP}, "top-p", "nucleus sampling threshold (default: the model's, else 1)")
	fs.Var(optInt{&o.flags.TopK}, "top-k", "sample among the k most likely tokens (default: the model's, else all)")
	fs.Var(optFloat{&o.flags.MinP}, "min-p", "drop tokens below min-p × the top probability (default: the model's, else 0)")
	fs.Var(optFloat{&o.flags.RepetitionPenalty}, "repeat-penalty", "repetition penalty (default: the model's, else 1: none)")
	fs.Var(optInt64{&o.seed}, "seed", "sampling seed (default: fresh randomness)")
	fs.IntVar(&o.maxTokens, "max-tokens", 512, "most tokens to generate per reply")
	fs.BoolVar(&o.stats, "stats", false, "print prefill and decode tokens/s to stderr")
	fs.BoolVar(&o.offline, "offline", false, "never download: use local paths and the model store only")
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
	if o.maxTokens <= 0 {
		return exitError{code: 2, msg: "exo run: --max-tokens must be positive"}
	}
	if err := o.flags.Check(); err != nil {
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
		return run(ctx, o, prompt, os.Stdout, os.Stderr)
	}
	s, err := openSession(ctx, o, os.Stderr)
	if err != nil {
		return err
	}
	defer s.close()
	return s.chat(ctx, os.Stdin, os.Stdout, os.Stderr)
}

// run answers one prompt.
func run(ctx context.Context, o runOptions, prompt string, stdout, stderr io.Writer) error {
	s, err := openSession(ctx, o, stderr)
	if err != nil {
		return err
	}
	defer s.close()
	_, err = s.reply(ctx, []chat.Message{{Role: "user", Content: prompt}}, stdout, stderr)
	return err
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
		if m.Name != o.model || m.Decode == nil {
			continue
		}
		o.model = m.Decode.Source
		if d := m.Defaults; d != nil {
			o.cluster = openai.Defaults{Temperature: d.Temperature, TopP: d.TopP, TopK: d.TopK, MinP: d.MinP, RepetitionPenalty: d.RepetitionPenalty}
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

// session is a loaded model ready to answer.
type session struct {
	o        runOptions
	b        engine.Backend
	m        *engine.Model
	tok      *tokenizer.Tokenizer
	tmpl     *chat.Template
	sampling openai.Sampling
	loadTime time.Duration
	// cache holds the KV of cached: the last reply's prompt and output, so
	// a chat's next turn prefills only what is new.
	cache  engine.KVCache
	cached []int32
}

func openSession(ctx context.Context, o runOptions, stderr io.Writer) (*session, error) {
	bar := newProgressBar(stderr)
	path, err := hf.Resolve(ctx, o.model, hf.Options{Offline: o.offline, Progress: bar.update("downloading")})
	bar.done()
	if err != nil {
		return nil, fmt.Errorf("resolve model %s: %w", o.model, err)
	}
	b, err := backend.Open(o.backend, backend.Options{Threads: o.threads, Device: o.device})
	if err != nil {
		return nil, err
	}
	tok, err := tokenizer.Load(path)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	tmpl, err := chat.Load(path)
	if err != nil {
		return nil, fmt.Errorf("chat template: %w", err)
	}
	md, err := decode.ModelDefaults(path)
	if err != nil {
		fmt.Fprintf(stderr, "exo run: warning: %v (not used)\n", err)
	}
	sp, err := md.Over(o.cluster).Over(o.flags).Sampling()
	if err != nil {
		return nil, fmt.Errorf("sampling: %w", err)
	}
	if o.seed != nil {
		sp.Seed, sp.SeedSet = *o.seed, true
	}
	t0 := time.Now()
	m, err := engine.Load(ctx, path, b, engine.LoadOptions{Progress: bar.update("loading weights")})
	bar.done()
	if err != nil {
		return nil, err
	}
	return &session{o: o, b: b, m: m, tok: tok, tmpl: tmpl, sampling: sp, loadTime: time.Since(t0)}, nil
}

func (s *session) close() {
	if s.cache != nil {
		s.cache.Free()
	}
	s.m.Close()
}

// chat is the interactive loop: each line is a user turn; the conversation
// is kept; /bye or end of input ends it.
func (s *session) chat(ctx context.Context, in io.Reader, stdout, stderr io.Writer) error {
	var history []chat.Message
	fmt.Fprintln(stderr, "exo: chatting with", s.o.model, "(/bye to quit)")
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for {
		fmt.Fprint(stderr, ">>> ")
		if !sc.Scan() {
			fmt.Fprintln(stderr)
			return sc.Err()
		}
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "":
			continue
		case line == "/bye":
			return nil
		case strings.HasPrefix(line, "/"):
			fmt.Fprintln(stderr, "exo: unknown command", line, "(/bye quits)")
			continue
		}
		history = append(history, chat.Message{Role: "user", Content: line})
		text, err := s.reply(ctx, history, stdout, stderr)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		history = append(history, chat.Message{Role: "assistant", Content: text})
	}
}

// reply generates the assistant's answer to msgs (plus --system), streams
// it to stdout and returns it.
func (s *session) reply(ctx context.Context, msgs []chat.Message, stdout, stderr io.Writer) (string, error) {
	o := s.o
	if o.system != "" {
		msgs = append([]chat.Message{{Role: "system", Content: o.system}}, msgs...)
	}
	text, err := s.tmpl.Render(msgs, true)
	if err != nil {
		return "", fmt.Errorf("chat template: %w", err)
	}
	ids := s.tok.EncodeChat(text)
	if len(ids) == 0 {
		return "", errors.New("the prompt encodes to no tokens")
	}
	maxTokens := o.maxTokens
	if max := s.m.Info().MaxPositions; len(ids)+maxTokens > max {
		maxTokens = max - len(ids)
		if maxTokens <= 0 {
			return "", fmt.Errorf("prompt of %d tokens exceeds the model's %d positions", len(ids), max)
		}
	}

	if s.cache == nil {
		s.cache = s.m.NewCache()
	}
	cache := s.cache
	// reuse the KV of the longest common prefix (at least one token is
	// computed again, for its logits)
	keep := 0
	for keep < len(s.cached) && keep < len(ids)-1 && s.cached[keep] == ids[keep] {
		keep++
	}
	cache.Truncate(keep)
	s.cached = append(s.cached[:0], ids[:keep]...)
	sampler := sample.New(decode.SampleParams(s.sampling))
	stream := s.tok.NewStreamDecoder()
	eos := s.tok.EOS()
	history := slices.Clone(ids)
	var out strings.Builder
	w := io.MultiWriter(stdout, &out)

	t1 := time.Now()
	logits, err := s.m.Forward(ctx, cache, ids[keep:])
	if err != nil {
		s.cached = s.cached[:0]
		cache.Truncate(0)
		return "", err
	}
	s.cached = append(s.cached, ids[keep:]...)
	prefillTime := time.Since(t1)
	t2 := time.Now()
	generated := 0
	for generated < maxTokens {
		next := sampler.Sample(logits, history)
		generated++
		if slices.Contains(eos, next) {
			break
		}
		history = append(history, next)
		if _, err := io.WriteString(w, stream.Add(next)); err != nil {
			return "", err
		}
		if generated == maxTokens {
			break
		}
		if logits, err = s.m.Forward(ctx, cache, []int32{next}); err != nil {
			s.cached = s.cached[:0]
			cache.Truncate(0)
			return "", err
		}
		s.cached = append(s.cached, next)
	}
	decodeTime := time.Since(t2)
	io.WriteString(w, stream.Flush())
	fmt.Fprintln(stdout)
	if o.stats {
		fmt.Fprintf(stderr, "backend %s, load %.2fs\nprefill: %d tokens in %.3fs (%.1f tokens/s; %d more from the previous turn)\ndecode: %d tokens in %.3fs (%.1f tokens/s)\n",
			s.b.Name(), s.loadTime.Seconds(),
			len(ids)-keep, prefillTime.Seconds(), float64(len(ids)-keep)/prefillTime.Seconds(), keep,
			generated, decodeTime.Seconds(), float64(max(generated-1, 0))/decodeTime.Seconds())
	}
	return out.String(), nil
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
