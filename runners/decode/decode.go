// Package decode owns the decode runner: it implements gen.Generator for
// one model (the HTTP adapters over it, runners/openai and
// runners/anthropic, are mounted by runners/httpapi: decode does not
// construct them), admits requests through a bounded FIFO
// queue, runs up to MaxBatch generations at once with their decode steps
// batched on the engine (continuous batching), keeps a prefix cache of
// recent conversations' KV, and decides per request whether to prefill the
// uncached part of the prompt locally or on a prefill runner over the KV wire
// (runners/kvwire), injecting the streamed KV transactionally and falling back
// to local prefill on any failure. It must not import supervisor/ or
// runners/prefill.
//
// Constrained decoding plugs in through Options.NewConstraint (a
// Constraint masks each step's logits and is told each sampled token) and
// Options.AcceptTools (lets tools, tool_choice and response_format through
// the API's validation); the parsed fields are on gen.Request
// (Tools, ToolChoice, ParallelToolCalls, ResponseFormat). A chat answer
// is parsed into text, reasoning and tool calls by the model's chat
// format (runners/chat, detected once at load) on the Emitter path
// (answer.go).
package decode

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/exo-pd/exo-pd/runners/chat"
	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/gen"
	"github.com/exo-pd/exo-pd/runners/metrics"
	"github.com/exo-pd/exo-pd/runners/openai"
)

// Model is what the decode runner needs of *engine.Model.
type Model interface {
	Info() engine.ModelInfo
	Fingerprint() engine.Fingerprint
	NewCache() engine.KVCache
	Forward(ctx context.Context, c engine.KVCache, tokens []int32) ([]float32, error)
	ForwardBatch(ctx context.Context, caches []engine.KVCache, tokens []int32) ([][]float32, error)
	Prefill(ctx context.Context, c engine.KVCache, tokens []int32, chunk int, onChunk func(start, n int) error) error
}

// Text is the model's tokenizer and chat template.
type Text interface {
	// Render renders msgs through the chat template: with a generation
	// prompt (a new assistant turn), or with the final message left open
	// (continueFinal: no end-of-turn after it, so generation continues
	// it), or neither.
	Render(msgs []gen.Message, addGenerationPrompt, continueFinal bool) (string, error)
	Encode(text string) []int32
	// EncodeChat encodes a prompt rendered by Render (no BOS added: the
	// template writes it, as with HF's apply_chat_template).
	EncodeChat(text string) []int32
	Decode(ids []int32) string
	// TokenBytes is the bytes one token stands for.
	TokenBytes(id int32) []byte
	EOS() []int32
	VocabSize() int
	// NewStream returns an incremental detokenizer.
	NewStream() TextStream
}

// Constraint restricts what a generation may produce: the seam for
// grammar-constrained decoding (response_format, tool arguments). For
// every step, Mask gets that step's logits (the generation's own copy) and
// sets those of disallowed tokens to -Inf; after sampling, Accept is told
// the token; when Done reports true the output is complete and generation
// ends with finish_reason "stop". Log-probabilities are computed from the
// logits before Mask.
type Constraint interface {
	Mask(logits []float32) error
	Accept(tok int32) error
	Done() bool
}

// TextStream turns token ids into text as they come.
type TextStream interface {
	// Add returns the newly completed text (never a split UTF-8 rune).
	Add(id int32) string
	// Flush returns what Add held back at the end of the stream (an
	// incomplete UTF-8 sequence, rendered as U+FFFD).
	Flush() string
}

// Sampler picks the next token.
type Sampler interface {
	Sample(logits []float32, history []int32) int32
}

// StopMatcher holds back text that may begin a stop sequence.
type StopMatcher interface {
	Push(text string) (emit string, stopped bool)
	Flush() string
	// Matched is the stop sequence seen, once Push reported one.
	Matched() string
}

// Remote fills a cache from a prefill runner.
type Remote interface {
	// Prefill makes cache hold the KV of prompt[:len(prompt)-1], given that
	// it already holds prompt[:start] (cache.Len() == start). On error the
	// cache is back at start. It returns the bytes received and the time
	// spent waiting on the wire.
	// prefer, when not empty, are endpoints to try first, in that order.
	Prefill(ctx context.Context, reqID string, prompt []int32, start int, cache engine.KVCache, prefer []string) (RemoteStats, error)
	// Classify maps a Prefill error to an exo_remote_prefill_total outcome.
	Classify(err error) string
}

// RemoteStats describes one remote prefill.
type RemoteStats struct {
	Endpoint string
	Bytes    int64 // K/V and state payload bytes
	States   int   // State frames (recurrent layers)
	Duration time.Duration
	Wait     time.Duration
}

// Options configures a Server.
type Options struct {
	Name           string // served model name
	Model          Model
	Text           Text
	NewSampler     func(gen.Sampling) Sampler
	NewStopMatcher func(stops []string) StopMatcher

	Remote          Remote // nil: no prefill endpoints
	RemoteMinTokens int    // uncached prompt tokens needed to go remote (default 256)
	// Router, when set, decides local vs remote prefill per request by
	// predicted time (RemoteMinTokens stays a floor) and learns the rates
	// from each fill. Nil: the floor alone decides.
	Router *Router

	MaxQueue int // waiting requests before 429 (default 64)
	// MaxBatch is how many generations run at once, their decode steps
	// batched (default 4; 1: one generation at a time, no batching). Each
	// holds its own KV cache.
	MaxBatch int
	// Speculative is the speculative decoding mode: "" or SpecOff,
	// SpecPromptLookup (see spec.go) or SpecDraft (drafts by Draft, a
	// model of the same tokenizer: see draft.go and CheckDraftText);
	// SpecTokens the most tokens drafted per step (0: DefaultSpecTokens).
	// A model that cannot verify drafts does not speculate (New logs why).
	Speculative string
	SpecTokens  int
	Draft       Model
	// specForce (tests only) drafts as many tokens as allowed at every
	// step, whatever the cost model says, so that verification and
	// rollback are exercised whatever this machine's timings.
	specForce bool
	// specSolo (tests and benchmarks only) verifies each generation's
	// drafts in a forward of its own, aside from the batch, and drafts
	// with a draft model one generation at a time: the per-request loop
	// speculation ran as before it moved into the batcher.
	specSolo bool
	// batchGather and batchQuorum (tests only): how long a batch waits
	// for its joined generations' steps (0: 2 ms), and how many
	// generations the first batch waits for (see batcher.quorum).
	batchGather  time.Duration
	batchQuorum  int
	PrefillChunk int // local prefill chunk (0: engine default)
	CacheEntries int // conversations kept in the prefix cache (default 4; <0: none)
	CacheTokens  int // total tokens kept (default 32768)
	// DefaultMaxTokens caps a request that sets no max_tokens (default
	// 4096, and never past the context).
	DefaultMaxTokens int
	// Defaults are the sampling defaults requests start from: the model's
	// own (ModelDefaults) overlaid by the cluster file's [models.defaults].
	// The Server does not read them (a gen.Request arrives with its
	// sampling resolved): they are for the callers that build requests
	// (runners/httpapi's adapters, internal/localrun).
	Defaults gen.Defaults
	// NewConstraint, when set, is asked for each request's Constraint (nil:
	// unconstrained), told where the output begins; it is how tools and
	// response_format plug in. Set AcceptTools too once it honours them
	// (else the callers building requests refuse them).
	NewConstraint func(req *gen.Request, st chat.Start) (Constraint, error)
	AcceptTools   bool

	// Stopping, when set, is closed when the runner begins to shut down
	// (openai.Drain.Begun): requests still waiting for admission are
	// answered openai.ErrStopping at once (nothing of them has started;
	// the gateway retries them on another runner); running ones go on.
	Stopping <-chan struct{}

	Metrics *metrics.Runner
	Logger  *slog.Logger

	// overlap, when set, decides whether the batcher overlaps plain
	// greedy steps (tests force it on the cpu backend); nil: overlapping,
	// i.e. on a backend that computes asynchronously (MLX).
	overlap func(Model) bool
}

// Server is a decode runner for one model. It implements gen.Generator.
type Server struct {
	o       Options
	overlap bool // overlapped plain greedy steps (overlap.go)
	// soloOverlapped counts the overlapped steps of lone generations,
	// soloDropped the steps they computed for nothing (tests).
	soloOverlapped, soloDropped atomic.Int64
	// specHeld counts the drafts whose first token an overlapped step
	// checked (speculator.settle; tests).
	specHeld atomic.Int64

	info   engine.ModelInfo
	adm    *admission
	pool   *kvPool
	m      *metrics.Runner
	log    *slog.Logger
	seq    atomic.Uint64
	eos    map[int32]bool
	format chat.Format // the model's chat format (tool calls, reasoning)

	specMax    int          // the most tokens drafted per step; 0: no speculation
	draftPool  *kvPool      // draft mode: the draft model's caches, by prefix
	draftVocab int          // draft mode: ids a draft may propose
	draftBatch *batcher     // draft mode with batching: the draft model's steps, batched
	draftMost  atomic.Int64 // the most sequences one draft step has held (tests)
	batch      *batcher     // nil when MaxBatch is 1
	lanes      []*batcher   // the batchers (batch is the first): a Laned model's lanes, else one
	stopBatch  context.CancelFunc
	journal    journal    // recent requests, for JournalPath
	mem        memSampler // the engine's memory, for JournalPath
}

// New makes a Server.
func New(o Options) *Server {
	if o.RemoteMinTokens <= 0 {
		o.RemoteMinTokens = 256
	}
	if o.MaxQueue <= 0 {
		o.MaxQueue = 64
	}
	if o.MaxBatch <= 0 {
		o.MaxBatch = 4
	}
	if o.CacheEntries == 0 {
		o.CacheEntries = 4
	}
	if o.CacheTokens <= 0 {
		o.CacheTokens = 32768
	}
	if o.DefaultMaxTokens <= 0 {
		o.DefaultMaxTokens = 4096
	}
	if o.Metrics == nil {
		o.Metrics = metrics.New("decode")
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	s := &Server{o: o, info: o.Model.Info(), m: o.Metrics, log: o.Logger, eos: map[int32]bool{}, format: formatOf(o.Text)}
	s.overlap = (o.overlap == nil && overlapping(o.Model)) || (o.overlap != nil && o.overlap(o.Model))
	s.adm = newAdmission(o.MaxBatch, o.MaxQueue, func(w, r int) {
		s.m.Waiting.Set(float64(w))
		s.m.Running.Set(float64(r))
	})
	s.pool = newKVPool(o.CacheEntries, o.CacheTokens, o.Model.NewCache)
	s.setupSpec(o)
	if o.MaxBatch > 1 {
		ctx, cancel := context.WithCancel(context.Background())
		s.stopBatch = cancel
		lanes := 1
		if l, ok := o.Model.(Laned); ok {
			lanes = max(1, min(l.Lanes(), o.MaxBatch))
		}
		var mu sync.Mutex
		most := 0
		for i := range lanes {
			// Each lane batches up to its share of MaxBatch.
			b := newBatcher(o.Model, (o.MaxBatch+lanes-1-i)/lanes, cmp.Or(o.batchGather, 2*time.Millisecond))
			b.quorum = o.batchQuorum
			b.sizes = func(n int) {
				s.m.DecodeBatch.Observe(float64(n))
				mu.Lock()
				defer mu.Unlock()
				if n > most {
					most = n
					s.m.DecodeBatchMax.Set(float64(n))
				}
			}
			b.verified = func(seqs, positions int) {
				s.m.SpecBatchPositions.Observe(float64(positions))
				if seqs > 1 {
					s.m.SpecSharedSteps.Inc()
				}
			}
			if s.overlap {
				b.overlap(s.log)
			}
			s.lanes = append(s.lanes, b)
			go b.run(ctx)
		}
		s.batch = s.lanes[0]
		if s.draftPool != nil {
			// The generations' draft steps batch too (drafter.draft).
			s.draftBatch = newBatcher(o.Draft, o.MaxBatch, 2*time.Millisecond)
			s.draftBatch.sizes = func(n int) {
				for {
					most := s.draftMost.Load()
					if int64(n) <= most || s.draftMost.CompareAndSwap(most, int64(n)) {
						return
					}
				}
			}
			go s.draftBatch.run(ctx)
		}
	}
	for _, id := range o.Text.EOS() {
		s.eos[id] = true
	}
	return s
}

// Register adds the runner's own routes, /metrics and the journal, to mux.
// The APIs are the caller's (runners/httpapi mounts the OpenAI and
// Anthropic adapters over the Server), and so is /health, since it also
// answers while the model loads.
func (s *Server) Register(mux *http.ServeMux) {
	mux.Handle("/metrics", s.m.Handler())
	mux.HandleFunc("GET "+JournalPath, s.serveJournal)
}

// Load returns the numbers of requests waiting and running.
func (s *Server) Load() (waiting, running int) { return s.adm.counts() }

// Close frees the prefix cache.
func (s *Server) Close() {
	if s.stopBatch != nil {
		s.stopBatch()
	}
	s.pool.close()
	if s.draftPool != nil {
		s.draftPool.close()
	}
}

func (s *Server) prompt(req *gen.Request) ([]int32, error) {
	if req.Chat {
		rt, ok := s.o.Text.(ReasoningText)
		for i, m := range req.Messages {
			if m.Reasoning != "" && !(ok && rt.HistoryReasoning()) {
				f := fmt.Sprintf("messages[%d].reasoning_content", i)
				return nil, openai.Errorf(f, "%s: this model's chat template has no place for reasoning "+
					"(templates that read reasoning_content or thinking, such as Qwen3's and gpt-oss's, take it); leave it out", f)
			}
		}
	}
	switch {
	case req.Chat && toolsOffered(req):
		tt, ok := s.o.Text.(ToolText)
		if !ok {
			return nil, openai.Errorf("tools", "this model cannot be offered tools")
		}
		text, err := tt.RenderTools(req.Messages, req.Tools, req.AddGenerationPrompt, req.ContinueFinal)
		if err != nil {
			return nil, openai.Errorf("messages", "rendering the chat template with tools: %v", err)
		}
		return s.o.Text.EncodeChat(text), nil
	case req.Chat:
		text, err := s.o.Text.Render(req.Messages, req.AddGenerationPrompt, req.ContinueFinal)
		if err != nil {
			return nil, openai.Errorf("messages", "rendering the chat template: %v", err)
		}
		return s.o.Text.EncodeChat(text), nil
	case req.PromptIDs != nil:
		v := s.o.Text.VocabSize()
		for i, id := range req.PromptIDs {
			if int(id) >= v {
				return nil, openai.Errorf("prompt", "prompt token %d (index %d) is outside the vocabulary of %d", id, i, v)
			}
		}
		return append([]int32(nil), req.PromptIDs...), nil
	default:
		return s.o.Text.Encode(req.Prompt), nil
	}
}

// Tokenize implements gen.Generator.
func (s *Server) Tokenize(ctx context.Context, req *gen.Request) ([]int32, int, error) {
	toks, err := s.prompt(req)
	return toks, s.info.MaxPositions, err
}

// Detokenize implements gen.Generator.
func (s *Server) Detokenize(ctx context.Context, ids []int32) (string, error) {
	v := s.o.Text.VocabSize()
	for i, id := range ids {
		if id < 0 || int(id) >= v {
			return "", openai.Errorf("tokens", "tokens[%d] = %d is outside the vocabulary of %d", i, id, v)
		}
	}
	return s.o.Text.Decode(ids), nil
}

// Generate implements gen.Generator.
func (s *Server) Generate(ctx context.Context, req *gen.Request, em gen.Emitter) (res gen.Result, err error) {
	t0 := time.Now()
	reqID := fmt.Sprintf("%s-%d", s.o.Name, s.seq.Add(1))
	rec := s.journal.begin(reqID, s.o.Name, t0)
	defer func() { s.finishRecord(rec, res, err) }()
	ctx = withRecord(ctx, rec)
	prompt, err := s.prompt(req)
	if err != nil {
		return gen.Result{}, err
	}
	v := s.o.Text.VocabSize()
	for id := range req.Sampling.LogitBias {
		if int(id) >= v {
			return gen.Result{}, openai.Errorf("logit_bias", "logit_bias token %d is outside the vocabulary of %d", id, v)
		}
	}
	var st chat.Start // where the output begins
	if req.Chat && len(prompt) > 0 {
		st = s.format.Start(s.o.Text.Decode(prompt[max(0, len(prompt)-32):])) // "<think>\n" is one to nine tokens
	}
	var cons Constraint
	if s.o.NewConstraint != nil {
		if cons, err = s.o.NewConstraint(req, st); err != nil {
			return gen.Result{}, err
		}
	}
	n := len(prompt)
	if n == 0 {
		return gen.Result{}, openai.Errorf("messages", "the prompt is empty after tokenization")
	}
	maxPos := s.info.MaxPositions
	if maxPos > 0 && n >= maxPos {
		return gen.Result{}, openai.ContextTooLong(n, maxPos)
	}
	release, err := s.admit(ctx)
	if errors.Is(err, errQueueFull) {
		return gen.Result{}, openai.ErrQueueFull
	}
	if err != nil {
		return gen.Result{}, fmt.Errorf("waiting for admission: %w", err)
	}
	defer release()
	defer func() { s.m.Duration.WithLabelValues(s.o.Name).Observe(time.Since(t0).Seconds()) }()
	s.m.PromptTokens.WithLabelValues(s.o.Name).Add(float64(n))
	if err := em.Start(n); err != nil {
		return gen.Result{}, err
	}

	entry, cached := s.pool.take(prompt)
	ok := false
	defer func() {
		if ok {
			s.pool.put(entry)
		} else {
			s.pool.drop(entry)
		}
	}()
	start := min(cached, n-1)
	if !entry.cache.CanTruncate(start) {
		start = 0 // a sliding layer no longer holds the window start needs
	}
	entry.cache.Truncate(start)
	start = min(start, entry.cache.Len()) // a recurrent model's cache goes back to its latest kept state
	entry.tokens = entry.tokens[:start]
	if start > 0 {
		s.m.PrefixHit.WithLabelValues("decode").Add(float64(start))
	}
	s.note(ctx, func(r *RequestRecord) { r.PromptTokens, r.CachedTokens = n, start })

	if err := s.fill(ctx, reqID, req, prompt, start, entry); err != nil {
		return gen.Result{}, err
	}

	// The last prompt token: logits for the first sampled token (or, on a
	// pipeline, the token its last stage picked from them).
	var first stepOut
	var picker *Picker
	if pm, ok := s.o.Model.(PickingModel); ok {
		if cl, closes := cons.(interface{ Close() }); closes {
			cl.Close() // it validated the request; the last stage builds its own
		}
		cons = nil
		if err := pm.StartPicking(ctx, entry.cache, req, st, prompt); err != nil {
			return gen.Result{}, fmt.Errorf("start picking: %w", err)
		}
		pk, err := pm.ForwardPick(ctx, entry.cache, prompt[n-1:])
		if err != nil {
			return gen.Result{}, fmt.Errorf("forward last prompt token: %w", err)
		}
		first.picked = &pk
	} else {
		t1 := time.Now()
		logits, err := s.o.Model.Forward(ctx, entry.cache, prompt[n-1:])
		if err != nil {
			return gen.Result{}, fmt.Errorf("forward last prompt token: %w", err)
		}
		first.logits, first.took = logits, time.Since(t1)
		picker = s.o.newPicker(req, cons, prompt)
	}
	entry.tokens = append(entry.tokens[:0:0], prompt...)

	var ae *answerEmitter // a chat answer is parsed by the format: text, reasoning, tool calls
	if req.Chat {
		ae = newAnswerEmitter(em, s.format.NewParser(toolsOffered(req), st))
		_, forced, _ := forcedTools(req) // an unknown named tool was refused with the grammar
		ae.callsOnly = forced != "" && toolsOffered(req)
		em = ae
	}
	res, err = s.generate(ctx, req, em, entry, first, picker, t0)
	if picker != nil {
		picker.Close() // a mask computed ahead may still be running
	}
	if ae != nil && err == nil {
		calls, ferr := ae.finish()
		if ferr != nil {
			err = &clientGone{ferr}
		}
		if calls > 0 && res.FinishReason == "stop" {
			res.FinishReason = "tool_calls"
		}
	}
	res.PromptTokens, res.CachedTokens = n, start
	// After a success, or when the client went away between steps, the
	// cache is consistent and the conversation is kept for its next turn.
	var gone *clientGone
	if err == nil || errors.As(err, &gone) {
		ok = entry.cache.Len() == len(entry.tokens)
	}
	return res, err
}

// admit waits for a generation slot; when the runner begins to stop
// first, the wait ends with openai.ErrStopping.
func (s *Server) admit(ctx context.Context) (func(), error) {
	if s.o.Stopping == nil {
		return s.adm.acquire(ctx)
	}
	actx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go func() {
		select {
		case <-s.o.Stopping:
			cancel(openai.ErrStopping)
		case <-actx.Done():
		}
	}()
	release, err := s.adm.acquire(actx)
	if err != nil && errors.Is(context.Cause(actx), openai.ErrStopping) && ctx.Err() == nil {
		return nil, openai.ErrStopping
	}
	return release, err
}

// clientGone marks an emitter failure (the client disconnected): the
// engine was between steps, so the cache is intact.
type clientGone struct{ err error }

func (c *clientGone) Error() string { return "client went away: " + c.err.Error() }
func (c *clientGone) Unwrap() error { return c.err }

// fill brings entry's cache from start to n-1 prompt tokens, remotely when
// the request qualifies and that works, else locally.
func (s *Server) fill(ctx context.Context, reqID string, req *gen.Request, prompt []int32, start int, entry *convEntry) error {
	n := len(prompt)
	uncached := n - start
	outcome := ""
	switch {
	case start == n-1 && start > 0:
		outcome = metrics.OutcomeSkippedCached
	case req.DisableRemotePrefill:
		outcome = metrics.OutcomeSkippedDisabled
	case s.o.Remote == nil:
		outcome = metrics.OutcomeSkippedNoEnd
	case uncached < s.o.RemoteMinTokens || start == n-1:
		outcome = metrics.OutcomeSkippedShort
	}
	attrs := []any{"req", reqID, "prompt_tokens", n, "start_pos", start}
	var predicted time.Duration // of the route taken, when the cost model chose
	var prefer []string         // endpoints by predicted finish, best first
	var ahead map[string]int    // fetches ahead at each endpoint when routed
	if outcome == "" && s.o.Router != nil {
		d, hits, done := s.o.Router.DecidePrompt(ctx, prompt, start, s.o.RemoteMinTokens)
		defer done()
		s.m.RouteDecisions.WithLabelValues(d.Route, d.Reason).Inc()
		s.log.Info("route decision", "req", reqID, "uncached", n-1-start, "route", d.Route, "reason", d.Reason,
			"predicted_local", d.Local, "predicted_remote", d.Remote, "endpoint", d.Endpoint, "prefix_hits", hits)
		s.note(ctx, func(r *RequestRecord) { r.Reason = d.Reason })
		switch {
		case d.Route == RouteRemote:
			predicted, prefer, ahead = d.Remote, d.Order, d.Ahead
		case d.Reason == ReasonShort:
			outcome = metrics.OutcomeSkippedShort
		case d.Reason != ReasonNoEndpoint: // no endpoint allowed: the remote classifies it
			outcome = metrics.OutcomeSkippedCost
			predicted = d.Local
		}
	}
	t0 := time.Now()
	defer func() {
		s.note(ctx, func(r *RequestRecord) { r.Fill, r.PredictedFill = time.Since(t0).Seconds(), predicted.Seconds() })
	}()
	if outcome == "" {
		st, err := s.o.Remote.Prefill(ctx, reqID, prompt, start, entry.cache, prefer)
		if err == nil && s.o.Router != nil {
			s.o.Router.ObserveRemote(st.Endpoint, n-1-start, ahead[st.Endpoint], st.Bytes, st.Duration)
			s.observeError(predicted, time.Since(t0))
		}
		if err == nil {
			s.m.RemotePrefill.WithLabelValues(metrics.OutcomeOK).Inc()
			s.m.KVBytes.WithLabelValues("decode").Add(float64(st.Bytes))
			s.m.KVDuration.WithLabelValues("decode").Observe(st.Duration.Seconds())
			s.m.KVWait.Observe(st.Wait.Seconds())
			s.note(ctx, func(r *RequestRecord) {
				r.Route, r.Outcome, r.Endpoint = RouteRemote, metrics.OutcomeOK, st.Endpoint
				r.KVBytes, r.KVTransfer = st.Bytes, st.Duration.Seconds()
			})
			s.log.Info("remote prefill", append(attrs, "outcome", metrics.OutcomeOK, "endpoint", st.Endpoint,
				"bytes", st.Bytes, "states", st.States, "duration", st.Duration, "wire_wait", st.Wait)...)
			got := entry.cache.Len()
			entry.tokens = append(entry.tokens, prompt[start:got]...)
			if got < n-1 { // the server left a tail (recurrent models): compute it here
				if err := s.o.Model.Prefill(ctx, entry.cache, prompt[got:n-1], s.o.PrefillChunk, nil); err != nil {
					return fmt.Errorf("local prefill of the tail after remote: %w", err)
				}
				entry.tokens = append(entry.tokens, prompt[got:n-1]...)
			}
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("remote prefill: %w", ctx.Err())
		}
		outcome = s.o.Remote.Classify(err)
		attrs = append(attrs, "err", err.Error())
		if entry.cache.Len() != start {
			if !entry.cache.CanTruncate(start) {
				// A committed stream replaced a sliding layer's window
				// before the failure: start over from nothing.
				start, entry.tokens = 0, entry.tokens[:0]
			}
			entry.cache.Truncate(start)
		}
	}
	s.m.RemotePrefill.WithLabelValues(outcome).Inc()
	s.note(ctx, func(r *RequestRecord) { r.Outcome = outcome })
	s.log.Info("local prefill", append(attrs, "outcome", outcome)...)
	if start < n-1 {
		t1 := time.Now()
		if err := s.o.Model.Prefill(ctx, entry.cache, prompt[start:n-1], s.o.PrefillChunk, nil); err != nil {
			return fmt.Errorf("local prefill: %w", err)
		}
		if s.o.Router != nil {
			s.o.Router.ObserveLocal(n-1-start, time.Since(t1))
			if outcome == metrics.OutcomeSkippedCost {
				s.observeError(predicted, time.Since(t1))
			}
		}
		s.m.PrefillTokens.WithLabelValues("decode").Add(float64(n - 1 - start))
	}
	entry.tokens = append(entry.tokens, prompt[start:n-1]...)
	return nil
}

// stepOut is what a step gives the generation: logits to pick from (its
// Picker), or the token a pipeline's last stage picked.
type stepOut struct {
	logits []float32
	picked *Picked
	took   time.Duration // the first step's: a one-token forward's time (speculation's cost model)
	stat   stepStat      // a batched step's: its cost and size (speculation's cost model)
	// ahead: the step was overlapped and the generation's next step is
	// in flight already, fed with picked (overlapRun.step).
	ahead bool
}

// generate runs the generation from the step after the prompt: picker
// picks from logits (nil when the model picks: a pipeline).
func (s *Server) generate(ctx context.Context, req *gen.Request, em gen.Emitter, entry *convEntry, out stepOut, picker *Picker, t0 time.Time) (gen.Result, error) {
	var res gen.Result
	maxNew := req.MaxTokens
	if maxNew == 0 {
		maxNew = s.o.DefaultMaxTokens
	}
	var stops StopMatcher
	if len(req.Stop) > 0 {
		stops = s.o.NewStopMatcher(req.Stop)
	}
	stream := s.o.Text.NewStream()
	history := append([]int32(nil), entry.tokens...)
	pm, _ := s.o.Model.(PickingModel)
	var mem *member
	if s.batch != nil {
		mem = s.lane().joinMember()
		defer mem.leave()
	}
	last := time.Now()
	emit := func(text string, lp *gen.TokenLogprob) (bool, error) {
		stopped := false
		if stops != nil {
			text, stopped = stops.Push(text)
		}
		if err := em.Text(text, lp); err != nil {
			return stopped, &clientGone{err}
		}
		return stopped, nil
	}
	var sp *speculator
	if s.specMax > 0 && !req.NoSpeculation && picker != nil {
		sp = s.newSpec(req, picker)
		if s.batchVerify(mem) {
			sp.bc = &mem.b.cost
			if sp.d != nil {
				sp.d.b = s.draftBatch
			}
		}
		if out.took > 0 {
			sp.observe(1, out.took)
		}
		defer func() {
			// An overlap's step in flight leaves the cache first (the
			// batcher's overlap would drop it later, beside the
			// truncation below; a lone generation's stops before this).
			if mem != nil && mem.b.ov != nil {
				mem.b.ov.release(entry.cache)
			}
			// Ending mid-verification (a stop, the length, an error): the
			// drafts past the last emitted token leave the cache (a
			// hybrid cache may go back further: it keeps what it holds).
			sp.end()
			if n := len(entry.tokens); entry.cache.Len() > n && entry.cache.CanTruncate(n) {
				entry.cache.Truncate(n)
			}
			entry.tokens = entry.tokens[:min(len(entry.tokens), entry.cache.Len())]
			if sp.d != nil {
				sp.d.close()
			}
			s.noteSpec(ctx, sp)
		}()
	}
	var solo *overlapRun // a lone generation's overlapped steps (no batcher)
	if dev := overlappable(picker, pm); mem != nil && mem.b.ov != nil {
		mem.dev = dev
	} else if gs, ok := s.o.Model.(overlapStarter); ok && mem == nil && s.overlap && dev != nil {
		solo = newOverlapRun(gs, s.log)
		defer func() {
			solo.stop() // the cache without the step in flight
			s.soloOverlapped.Add(int64(solo.served))
			s.soloDropped.Add(int64(solo.dropped))
		}()
	}
	timePlain := true // the next plain step of a speculating generation is serial (see below)
	for {
		var pk Picked
		if out.picked != nil {
			pk = *out.picked
		} else {
			var err error
			if pk, err = sp.pick(picker, out.logits); err != nil {
				return res, err
			}
		}
		tok := pk.Tok
		now := time.Now()
		if res.CompletionTokens == 0 {
			s.m.TTFT.WithLabelValues(s.o.Name).Observe(now.Sub(t0).Seconds())
			s.note(ctx, func(r *RequestRecord) { r.first, r.TTFT = now, now.Sub(t0).Seconds() })
		} else {
			s.m.InterToken.WithLabelValues(s.o.Name).Observe(now.Sub(last).Seconds())
		}
		last = now
		if s.eos[tok] && !req.IgnoreEOS {
			res.FinishReason = "stop"
			break
		}
		res.CompletionTokens++
		s.m.GenTokens.WithLabelValues(s.o.Name).Inc()
		history = append(history, tok)
		stopped, err := emit(stream.Add(tok), pk.Logprob)
		if err != nil {
			return res, err
		}
		if stopped {
			res.FinishReason, res.StopSequence = "stop", stops.Matched()
			return res, nil
		}
		if pk.Done {
			res.FinishReason = "stop"
			break
		}
		// entry.tokens is what the cache holds (and, mid-verification,
		// the drafts after it).
		if res.CompletionTokens >= maxNew || (s.info.MaxPositions > 0 && len(entry.tokens)+1 >= s.info.MaxPositions) {
			res.FinishReason = "length"
			break
		}
		// plain is a step of tok alone: overlapped where it can be (last:
		// the overlap queues nothing after it) unless serial, else serial.
		plain := func(last, serial bool) (stepOut, error) {
			// the steps this generation may still take, this one
			// included: an overlap queues none past them
			left := maxNew - res.CompletionTokens
			if s.info.MaxPositions > 0 {
				left = min(left, s.info.MaxPositions-len(entry.tokens)-1)
			}
			if !serial {
				if o, ok, oerr := solo.one(ctx, picker, entry.cache, tok, left, last); ok {
					return o, oerr
				}
			}
			if mem != nil {
				mem.left, mem.last = left, last
				if serial && mem.dev != nil {
					dev := mem.dev
					mem.dev = nil // not overlappable: the batch steps serially
					defer func() { mem.dev = dev }()
				}
			}
			return s.decodeStep(ctx, mem, pm, entry.cache, tok)
		}
		if sp != nil && sp.active() {
			if next, ok := sp.next(tok); ok { // tok was drafted: its row is computed
				out = stepOut{logits: next}
				entry.tokens = append(entry.tokens, tok)
				continue
			}
			sp.end()
			entry.cache.Truncate(len(entry.tokens)) // the rejected drafts
		}
		if sp != nil && sp.pending() && sp.settle(tok) {
			timePlain = true
			// tok, picked by the overlapped step that followed the held
			// draft's place, is its first token: the rest are verified
			// after it (the overlap was drained, nothing is in flight).
			out = stepOut{}
			if s.batchVerify(mem) {
				out.logits, err = s.verifyBatched(ctx, mem, sp, entry.cache, nil, tok)
			} else {
				solo.stop()
				out.logits, err = s.verifyStep(ctx, mem, sp, entry.cache, nil, tok)
			}
		} else if sp != nil {
			limit := maxNew - res.CompletionTokens - 1
			if s.info.MaxPositions > 0 {
				limit = min(limit, s.info.MaxPositions-len(entry.tokens)-2)
			}
			d, derr := s.propose(ctx, mem, sp, history, limit)
			if derr != nil && ctx.Err() == nil {
				s.log.Warn("draft model failed: no more drafts for this request", "err", derr)
			}
			t1 := time.Now()
			// pre: what a hybrid cache's rollback took back (fed again).
			// A cache with an overlapped step in flight (ahead) is the
			// overlap's until its next step (another member's change of
			// the batch may stop it and truncate the cache meanwhile):
			// not read here; it is never hybrid, so nothing was taken back.
			ahead, stepped := out.ahead, true
			var pre []int32
			if !ahead {
				pre = entry.tokens[min(entry.cache.Len(), len(entry.tokens)):]
			}
			switch {
			case d != nil && ahead: // pre is empty: it is read only when not ahead
				// The overlap's step in flight, fed with tok, picks the
				// token the draft's first one guesses: the draft is held
				// (settled with that token) and, when more tokens follow,
				// that step is the overlap's last, so that they are
				// verified next with nothing in flight dropped. A draft of
				// one costs no forward at all.
				sp.hold()
				out, err = plain(len(d) > 1, false)
			case (d != nil || len(pre) > 0) && s.batchVerify(mem):
				// One forward of the batch verifies the drafts beside the
				// other members' steps.
				out, stepped, timePlain = stepOut{}, false, true
				out.logits, err = s.verifyBatched(ctx, mem, sp, entry.cache, pre, tok)
			case d != nil || len(pre) > 0:
				out, stepped, timePlain = stepOut{}, false, true
				solo.stop() // nothing in flight on the cache it verifies on
				out.logits, err = s.verifyStep(ctx, mem, sp, entry.cache, pre, tok)
			default:
				// The plain step after a verification (or the first) is
				// serial: the cost model's plain step time (overlapped
				// steps are untimed: overlapRun.step), paired with the
				// verification before it; the following ones overlap.
				out, err = plain(false, timePlain)
				timePlain = false
			}
			switch {
			case err != nil || !stepped:
			case s.batchVerify(mem):
				sp.observeBatch(out.stat, 1)
			default:
				sp.observePlain(out.stat, mem != nil, time.Since(t1))
			}
		} else {
			out, err = plain(false, false)
		}
		if err != nil {
			return res, fmt.Errorf("decode step %d: %w", res.CompletionTokens, err)
		}
		entry.tokens = append(entry.tokens, tok)
	}
	if rest := stream.Flush(); rest != "" { // bytes of an unfinished UTF-8 sequence: shown, not dropped
		stopped, err := emit(rest, nil)
		if err != nil {
			return res, err
		}
		if stopped {
			res.FinishReason, res.StopSequence = "stop", stops.Matched()
			return res, nil
		}
	}
	if stops != nil {
		if err := em.Text(stops.Flush(), nil); err != nil {
			return res, &clientGone{err}
		}
	}
	return res, nil
}

// decodeStep appends tok to cache and returns the logits after it (or,
// with pm, the token picked from them): in the next batch when batching
// (mem, the generation's batch membership; the logits are then its own
// row, valid until its next step), else alone.
func (s *Server) decodeStep(ctx context.Context, mem *member, pm PickingModel, cache engine.KVCache, tok int32) (stepOut, error) {
	if mem == nil {
		if pm != nil {
			pk, err := pm.ForwardPick(ctx, cache, []int32{tok})
			return stepOut{picked: &pk}, err
		}
		lg, err := s.o.Model.Forward(ctx, cache, []int32{tok})
		return stepOut{logits: lg}, err
	}
	if err := ctx.Err(); err != nil {
		return stepOut{}, err
	}
	return mem.step(cache, tok)
}

// noteSpec logs a speculating generation's drafted tokens (accepted and
// rejected) and keeps them in its journal record.
func (s *Server) noteSpec(ctx context.Context, sp *speculator) {
	s.m.SpecTokens.WithLabelValues(metrics.SpecAccepted).Add(float64(sp.accepted))
	s.m.SpecTokens.WithLabelValues(metrics.SpecRejected).Add(float64(sp.rejected))
	s.note(ctx, func(r *RequestRecord) { r.SpecAccepted, r.SpecRejected = sp.accepted, sp.rejected })
	s.specHeld.Add(int64(sp.inFlight))
	acc := 0.0
	if n := sp.accepted + sp.rejected; n > 0 {
		acc = float64(sp.accepted) / float64(n)
	}
	rec, _ := ctx.Value(recordKey{}).(*RequestRecord)
	id := ""
	if rec != nil {
		id = rec.ID
	}
	s.log.Info("speculative decoding", "req", id, "accepted", sp.accepted, "rejected", sp.rejected, "acceptance", acc,
		"checked_in_flight", sp.inFlight, "position_cost", sp.cost, "draft_cost", sp.dcost(), "draft_catchup", sp.catchup(), "draft_stopped", sp.d != nil && sp.d.off)
}

// batchVerify reports whether a generation's verifications go through its
// batch (mem's batcher can run a batch of chunks, and Options.specSolo
// does not keep them apart).
func (s *Server) batchVerify(mem *member) bool {
	return mem != nil && mem.b.all != nil && !s.o.specSolo
}

// verifyBatched feeds pre, tok and sp's draft as the generation's chunk of
// the next batch (its forward shared with the other members' steps) and
// returns the logits after tok.
func (s *Server) verifyBatched(ctx context.Context, mem *member, sp *speculator, cache engine.KVCache, pre []int32, tok int32) ([]float32, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	feed := sp.feedFor(pre, tok)
	flat, st, err := mem.stepAll(cache, feed)
	if err != nil {
		sp.draft = sp.draft[:0]
		return nil, err
	}
	sp.observeBatch(st, len(feed))
	return sp.begin(flat, len(pre)), nil
}

// verifyStep feeds tok and sp's draft in one forward of their own (the
// generation steps aside from the batch meanwhile, so that the batch does
// not wait for it) and returns the logits after tok: speculation without
// a batch, or beside one whose model cannot verify in it (batchVerify).
func (s *Server) verifyStep(ctx context.Context, mem *member, sp *speculator, cache engine.KVCache, pre []int32, tok int32) ([]float32, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if mem != nil {
		mem.aside()
		defer mem.back()
	}
	return sp.verify(ctx, cache, pre, tok)
}

// observeError records the cost model's relative error for one fill.
func (s *Server) observeError(predicted, actual time.Duration) {
	if predicted > 0 {
		s.m.RouteError.Observe((actual - predicted).Seconds() / predicted.Seconds())
	}
}

// Laned is implemented by a model whose steps are pipelined over stages
// (a pipeline's stage 0): the Server runs Lanes() batchers, each with its
// own generations, so that while one lane's step is on a later stage the
// first stage computes another lane's (decode micro-batches that keep
// every stage busy, rather than the whole batch going through the stages
// in lockstep).
type Laned interface {
	Lanes() int
}

// lane is the batcher a new generation joins: the one with the fewest.
func (s *Server) lane() *batcher {
	best := s.lanes[0]
	for _, b := range s.lanes[1:] {
		if b.members() < best.members() {
			best = b
		}
	}
	return best
}
