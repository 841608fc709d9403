// Package localrun owns `exo run`'s sessions: it loads a model in process
// (a progress bar on a terminal), makes the decode runner's Server over it
// (runners/decode: the same prompt rendering, prefix cache, batcher,
// sampling, stop sequences and reasoning splitting as the HTTP API), and
// answers each turn through the same validation and Generate entry point
// a chat completion takes, streaming the answer to stdout and a reasoning
// model's reasoning to stderr. A chat's next turn reuses the KV of the
// previous ones through the Server's prefix cache. It serves no HTTP and
// must not import supervisor/.
package localrun

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/exo-pd/exo-pd/runners/chat"
	"github.com/exo-pd/exo-pd/runners/decode"
	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/engine/backend"
	"github.com/exo-pd/exo-pd/runners/gen"
	"github.com/exo-pd/exo-pd/runners/hf"
	"github.com/exo-pd/exo-pd/runners/openai"
)

// Options are exo run's settings.
type Options struct {
	Model   string // a directory, .gguf file, builtin:smollm2 or HF id
	Backend string // auto, cpu or mlx
	Device  string // mlx device
	Threads int
	System  string // system prompt
	// Flags are the sampling flags given (each a request field); Cluster
	// the [models.defaults] of a served name (under the flags, over the
	// model's own defaults).
	Flags, Cluster gen.Defaults
	Seed           *int64
	MaxTokens      int
	Stats, Offline bool
	// Logprobs asks each turn for its tokens' log-probabilities (the API's
	// logprobs: true) and keeps them in Reply.Tokens; nothing more is
	// printed. Tests compare a turn token by token with the API's.
	Logprobs bool
}

// Session is a loaded model ready to answer.
type Session struct {
	o        Options
	b        engine.Backend
	m        *engine.Model
	srv      *decode.Server
	val      openai.Validator
	loadTime time.Duration
	replies  []Reply // Chat's, in order
}

// name is what the session's requests name as their model.
const name = "exo-run"

// Open resolves and loads the model (progress on stderr when it is a
// terminal) and makes the Server that answers.
func Open(ctx context.Context, o Options, stderr io.Writer) (*Session, error) {
	bar := newProgressBar(stderr)
	path, err := hf.Resolve(ctx, o.Model, hf.Options{Offline: o.Offline, Progress: bar.update("downloading")})
	bar.done()
	if err != nil {
		return nil, fmt.Errorf("resolve model %s: %w", o.Model, err)
	}
	b, err := backend.Open(o.Backend, backend.Options{Threads: o.Threads, Device: o.Device})
	if err != nil {
		return nil, err
	}
	t0 := time.Now()
	m, err := engine.Load(ctx, path, b, engine.LoadOptions{Progress: bar.update("loading weights")})
	bar.done()
	if err != nil {
		return nil, err
	}
	st, err := decode.NewSetup(name, m, path, o.Cluster)
	if err == nil && st.NoTemplate != nil {
		err = st.NoTemplate // a chat needs one
	}
	if err != nil {
		m.Close()
		return nil, err
	}
	if st.BadDefaults != nil {
		fmt.Fprintf(stderr, "exo run: warning: %v (not used)\n", st.BadDefaults)
	}
	opt := st.Options
	opt.Logger = slog.New(slog.DiscardHandler)
	s := &Session{o: o, b: b, m: m, srv: decode.New(opt), loadTime: time.Since(t0),
		val: openai.Validator{Served: func(n string) bool { return n == name }, Defaults: opt.Defaults, AcceptTools: opt.AcceptTools}}
	// The flags are checked now, not at the first turn.
	if _, err := s.request([]chat.Message{{Role: "user", Content: "x"}}); err != nil {
		s.Close()
		return nil, fmt.Errorf("sampling: %w", err)
	}
	return s, nil
}

// Close frees the model and its caches.
func (s *Session) Close() {
	s.srv.Close()
	s.m.Close()
}

// request is the chat completion a turn is: msgs after --system, the
// sampling flags as its fields, validated as the API validates one.
func (s *Session) request(msgs []chat.Message) (*gen.Request, error) {
	if s.o.System != "" {
		msgs = append([]chat.Message{{Role: "system", Content: s.o.System}}, msgs...)
	}
	r := &openai.ChatRequest{Model: name}
	for _, m := range msgs {
		r.Messages = append(r.Messages, openai.Message{Role: m.Role, Content: openai.Content{Text: m.Content, Set: true}})
	}
	f := s.o.Flags
	r.Temperature, r.TopP, r.TopK, r.MinP, r.RepetitionPenalty = f.Temperature, f.TopP, f.TopK, f.MinP, f.RepetitionPenalty
	r.Seed = s.o.Seed
	if s.o.MaxTokens > 0 {
		r.MaxTokens = &s.o.MaxTokens
	}
	if s.o.Logprobs {
		r.Logprobs = &s.o.Logprobs
	}
	g, e := s.val.ValidateChat(r)
	if e != nil {
		return nil, e
	}
	return g, nil
}

// Reply is one answer.
type Reply struct {
	Content, Reasoning string
	Result             gen.Result
	// Tokens are the generated tokens in order (bytes and log-probability,
	// as the API's logprobs content), including those whose text was
	// reasoning or dropped; only with Options.Logprobs.
	Tokens []gen.TokenLogprob
}

// Reply generates the assistant's answer to msgs (plus --system), streams
// it to stdout (the reasoning to stderr) and returns it.
func (s *Session) Reply(ctx context.Context, msgs []chat.Message, stdout, stderr io.Writer) (Reply, error) {
	g, err := s.request(msgs)
	if err != nil {
		return Reply{}, err
	}
	em := &emitter{out: stdout, errw: stderr}
	res, err := s.srv.Generate(ctx, g, em)
	if err != nil {
		return Reply{}, err
	}
	end := time.Now()
	if em.thinking {
		fmt.Fprintln(stderr)
	}
	fmt.Fprintln(stdout)
	if s.o.Stats {
		if em.first.IsZero() {
			em.first = end
		}
		prefill, dec := em.first.Sub(em.start), end.Sub(em.first)
		n := res.PromptTokens - res.CachedTokens
		fmt.Fprintf(stderr, "backend %s, load %.2fs\nprefill: %d tokens in %.3fs (%.1f tokens/s; %d more from the previous turn)\ndecode: %d tokens in %.3fs (%.1f tokens/s)\n",
			s.b.Name(), s.loadTime.Seconds(),
			n, prefill.Seconds(), float64(n)/prefill.Seconds(), res.CachedTokens,
			res.CompletionTokens, dec.Seconds(), float64(max(res.CompletionTokens-1, 0))/dec.Seconds())
	}
	return Reply{Content: em.content.String(), Reasoning: em.reasoning.String(), Result: res, Tokens: em.tokens}, nil
}

// emitter streams a generation to the terminal: the answer to out, the
// reasoning to errw; it notes when the first piece came and keeps the
// tokens' log-probabilities when they were asked for.
type emitter struct {
	out, errw          io.Writer
	content, reasoning strings.Builder
	tokens             []gen.TokenLogprob
	start, first       time.Time
	thinking           bool
}

func (e *emitter) Start(int) error { e.start = time.Now(); return nil }

func (e *emitter) mark() {
	if e.first.IsZero() {
		e.first = time.Now()
	}
}

func (e *emitter) Text(t string, lp *gen.TokenLogprob) error {
	e.mark()
	if lp != nil {
		e.tokens = append(e.tokens, *lp)
	}
	if e.thinking && t != "" {
		e.thinking = false
		fmt.Fprintln(e.errw)
	}
	e.content.WriteString(t)
	_, err := io.WriteString(e.out, t)
	return err
}

func (e *emitter) Reasoning(t string) error {
	e.mark()
	e.thinking = e.thinking || t != ""
	e.reasoning.WriteString(t)
	_, err := io.WriteString(e.errw, t)
	return err
}

// Chat is the interactive loop: each line is a user turn; the conversation
// (the answers, not their reasoning, as an API client sends it back) is
// kept; /bye or end of input ends it.
func (s *Session) Chat(ctx context.Context, in io.Reader, stdout, stderr io.Writer) error {
	var history []chat.Message
	s.replies = nil
	fmt.Fprintln(stderr, "exo: chatting with", s.o.Model, "(/bye to quit)")
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
		r, err := s.Reply(ctx, history, stdout, stderr)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		s.replies = append(s.replies, r)
		history = append(history, chat.Message{Role: "assistant", Content: r.Content})
	}
}

// Replies are the answers of the last Chat, in order.
func (s *Session) Replies() []Reply { return s.replies }

// Run answers one prompt.
func Run(ctx context.Context, o Options, prompt string, stdout, stderr io.Writer) error {
	s, err := Open(ctx, o, stderr)
	if err != nil {
		return err
	}
	defer s.Close()
	_, err = s.Reply(ctx, []chat.Message{{Role: "user", Content: prompt}}, stdout, stderr)
	return err
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
