package decode

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/kvconv"
	"github.com/exo-pd/exo-pd/runners/kvwire"
	"github.com/exo-pd/exo-pd/runners/metrics"
)

// KVRemote fetches prompt KV from prefill runners over the KV wire, failing
// over between endpoints in the selector's order.
type KVRemote struct {
	Client   *kvwire.Client
	Selector *kvwire.Selector
	Name     string // served model name sent to the prefill runner
	Model    Model
	// Deadline bounds one fetch on the server (0: DefaultFetchDeadline);
	// the client sends less when the request's context ends sooner.
	Deadline time.Duration
	// Breaker, when set, skips endpoints that stopped answering and sizes
	// each fetch's idle deadline; RunProbes closes it again.
	Breaker *Breaker
	// WireDType is the KV wire dtype asked of the prefill runner: 0 for the
	// cache dtype, or kvwire.DTypeF8E4M3 (opt-in, --kv-wire-dtype fp8).
	WireDType kvwire.DType
	// Streams is how many TCP connections each transfer is striped over
	// (--kv-streams; 0 or 1: one; PROTOCOL.md §17).
	Streams int
	// Parts, when set, are the stages of a pipelined prefill model
	// (--prefill ADDR@A:B): Prefill asks each stage holding some of the
	// cache's layers for those, at once, and commits them together
	// (split.go); the selector is not used. Parts with Heads are the
	// ranks of a tensor-parallel prefill group (--prefill ADDR#H0:H1),
	// asked for the cache's KV heads (headsplit.go).
	Parts []PrefillPart

	groups groupLoad // the fills in flight per prefill group (split.go)
}

// DefaultFetchDeadline is the deadline a remote fill sends the prefill
// runner when none is configured and its context has none sooner: the
// prefill runner's own longest (kvwire.ServerConfig.MaxDuration's
// default), sent so that a fetch never rests on the server's default. A
// prefill that stops computing is caught well before it by the client's
// progress deadline (PROTOCOL.md §13).
const DefaultFetchDeadline = 10 * time.Minute

// fetchDeadline is the deadline a fetch sends: d, or the default.
func fetchDeadline(d time.Duration) time.Duration {
	if d <= 0 {
		return DefaultFetchDeadline
	}
	return d
}

func (r *KVRemote) wireDType(cache engine.KVCache) kvwire.DType {
	if r.WireDType != 0 {
		return r.WireDType
	}
	return kvconv.Wire(cache.DType())
}

// errAllOpen: every prefill endpoint's circuit is open.
var errAllOpen = fmt.Errorf("%w: every prefill endpoint's circuit is open", kvwire.ErrNoEndpoint)

// RunProbes probes each endpoint whose circuit is open every `every`
// (default 500 ms) with a hello-only connection (kvwire.Client.Ping) and
// closes the circuit when it answers, until ctx ends.
func (r *KVRemote) RunProbes(ctx context.Context, every time.Duration) {
	if r.Breaker == nil {
		return
	}
	if every <= 0 {
		every = 500 * time.Millisecond
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for _, a := range r.Breaker.OpenEndpoints() {
			err := r.Client.Ping(ctx, a)
			if ctx.Err() != nil {
				return
			}
			r.Breaker.Probed(a, err)
		}
	}
}

// PrefixHit asks the prefill runner at addr how many leading tokens of
// prompt its prefix cache holds (PROTOCOL.md §18); a Router.PrefixHit.
// kvwire.ErrNoPrefixProbe when it does not answer prefix probes.
func (r *KVRemote) PrefixHit(ctx context.Context, addr string, prompt []int32) (int, error) {
	req, _ := wireRequest(r.Model, "prefix-probe", r.Name, prompt, 0)
	return r.Client.PrefixHit(ctx, addr, req)
}

// StageModel is what a remote fill needs of the decode side's model: a
// whole model or a pipeline stage's (*engine.Model is one; a stage is
// loaded with engine.LoadOptions.Layers, and its caches hold its layers
// only). Info and Fingerprint are the whole model's.
type StageModel interface {
	Info() engine.ModelInfo
	Fingerprint() engine.Fingerprint
	Stage() engine.LayerRange
}

// modelLayers is the layers [a, b) of the whole model that m's caches
// hold: its stage's when m is a StageModel loaded as a pipeline stage,
// else every layer.
func modelLayers(m interface{ Info() engine.ModelInfo }) (a, b int) {
	n := m.Info().Layers
	if s, ok := m.(interface{ Stage() engine.LayerRange }); ok {
		if r := s.Stage(); r != (engine.LayerRange{}) {
			return r.Start, r.End
		}
	}
	return 0, n
}

// wireRequest is the KV-wire request for prompt from start into a cache of
// m, and what its header must say: a stage asks for its layer range only
// (PROTOCOL.md §19) and expects that range's kinds and windows; a whole
// model asks for every layer. DType, Deadline and Streams are the caller's.
func wireRequest(m interface {
	Info() engine.ModelInfo
	Fingerprint() engine.Fingerprint
}, reqID, name string, prompt []int32, start int) (*kvwire.Request, *kvwire.Expect) {
	a, b := modelLayers(m)
	return rangeRequest(m, reqID, name, prompt, start, a, b)
}

// rangeRequest is wireRequest for layers [a, b) of the model (inside the
// layers m's caches hold): a pipelined prefill stage's part (split.go).
func rangeRequest(m interface {
	Info() engine.ModelInfo
	Fingerprint() engine.Fingerprint
}, reqID, name string, prompt []int32, start, a, b int) (*kvwire.Request, *kvwire.Expect) {
	info := m.Info()
	fp := kvwire.Fingerprint(m.Fingerprint())
	kinds := make([]kvwire.LayerKind, b-a)
	for l, rec := range info.Recurrent {
		if rec && l >= a && l < b {
			kinds[l-a] = kvwire.LayerRecurrent
		}
	}
	// Windows (nil for full-attention models) is checked against the
	// server's header: both sides must keep the same positions.
	var windows []int
	if info.Windows != nil {
		windows = info.Windows[a:b]
	}
	req := &kvwire.Request{ID: reqID, Model: name, Fingerprint: fp, Tokens: prompt, StartPos: start}
	if a != 0 || b != info.Layers {
		req.LayerStart, req.LayerEnd = a, b
	}
	// A tensor-parallel rank's caches hold its KV heads only: it asks
	// for those (PROTOCOL.md §20).
	heads := info.KVHeads
	if hr, ok := m.(interface{ KVHeadRange() (int, int) }); ok {
		if h0, h1 := hr.KVHeadRange(); h1-h0 != info.KVHeads {
			req.HeadStart, req.HeadEnd, heads = h0, h1, h1-h0
		}
	}
	exp := &kvwire.Expect{Fingerprint: fp, Kinds: kinds, Windows: windows, KVHeads: heads, HeadDim: info.HeadDim}
	return req, exp
}

// checkFilled refuses a fill that left cache beyond the prompt or before
// start (a server's token_end the wire could not catch), rolling it back.
func checkFilled(cache engine.KVCache, prompt []int32, start int) error {
	if cache.Len() <= len(prompt)-1 && cache.Len() >= start {
		return nil
	}
	n := cache.Len()
	if cache.CanTruncate(start) {
		cache.Truncate(start)
	} else {
		cache.Truncate(0) // the caller sees Len() != start and starts over
	}
	return fmt.Errorf("%w: prefill runner returned KV up to %d for a %d-token prompt", kvwire.ErrCorrupt, n, len(prompt))
}

// StageFill fetches one cache's KV from prefill runners over the KV wire
// by itself, for a pipeline stage process (runners/stage) that fills its
// own cache while the other stages fill theirs: each stage asks the
// prefill runner for its own layers directly (PROTOCOL.md §19). A whole
// model (Stage() is the zero range) asks for every layer, as KVRemote does.
type StageFill struct {
	Client *kvwire.Client
	// Name is the served model name sent to the prefill runner.
	Name string
	// Model is the stage's model (engine.Model loaded with
	// LoadOptions.Layers); Fill's cache must be one of its caches.
	Model StageModel
	// WireDType is the KV wire dtype asked for: 0 for the cache's dtype,
	// or kvwire.DTypeF8E4M3.
	WireDType kvwire.DType
	// Streams is the TCP connections each transfer is striped over (0 or
	// 1: one; PROTOCOL.md §17).
	Streams int
	// Deadline bounds one fetch on the server (0: DefaultFetchDeadline);
	// the client sends less when the fill's context ends sooner.
	Deadline time.Duration
}

// Fill asks endpoints, in that order, for the KV of prompt (the whole
// prompt from position 0) from position start for the stage's layers, and
// injects it into cache, which must hold exactly start positions of the
// stage's layers (cache layer 0 is the model's layer Stage().Start). It
// moves to the next endpoint after any failure but kvwire.ErrBadRequest
// and ctx's end (kvwire.Retryable), and returns the last failure (wrapped
// with the endpoints tried; errors.Is tells kvwire.ErrBusy, ErrMismatch,
// ErrCorrupt, …), or kvwire.ErrNoEndpoint when there are none.
//
// Injection is all or nothing: on success cache.Len() is the stream's
// token_end (the prefill runner's choice, len(prompt)−1 today; the same for
// every stage of a group, which must check that they agree); after any
// failure, a corrupt or cut stream included, cache is rolled back to start
// (a cache with recurrent layers to its latest kept position ≤ start: read
// cache.Len()). The stats are those of the successful (or last) try:
// Bytes is the payload received, the stage's layers' share of the prompt's
// KV.
func (f *StageFill) Fill(ctx context.Context, reqID string, cache engine.KVCache, prompt []int32, start int, endpoints []string) (RemoteStats, error) {
	req, exp := wireRequest(f.Model, reqID, f.Name, prompt, start)
	req.DType, req.Deadline, req.Streams = f.WireDType, fetchDeadline(f.Deadline), f.Streams
	if req.DType == 0 {
		req.DType = kvconv.Wire(cache.DType())
	}
	if len(endpoints) == 0 {
		return RemoteStats{}, kvwire.ErrNoEndpoint
	}
	if cache.Len() != start {
		return RemoteStats{}, fmt.Errorf("%w: fill from %d into a cache holding %d positions", kvwire.ErrBadRequest, start, cache.Len())
	}
	sink := &cacheSink{cache: cache, start: start}
	var st kvwire.Stats
	var last error
	for i, addr := range endpoints {
		if err := ctx.Err(); err != nil {
			if last == nil {
				last = err
			}
			break
		}
		var err error
		st, err = f.Client.Fetch(ctx, addr, req, exp, sink)
		if err == nil {
			rs := RemoteStats{Endpoint: st.Addr, Bytes: st.PayloadBytes, States: st.States, Duration: st.Duration, Wait: st.WireWait}
			return rs, checkFilled(cache, prompt, start)
		}
		last = fmt.Errorf("endpoint %s (%d of %d): %w", addr, i+1, len(endpoints), err)
		if !kvwire.Retryable(err) {
			break
		}
	}
	return RemoteStats{Endpoint: st.Addr, Bytes: st.PayloadBytes, States: st.States, Duration: st.Duration, Wait: st.WireWait}, last
}

// Prefill implements Remote. When r.Model is a pipeline stage (a
// StageModel loaded with engine.LoadOptions.Layers) it asks for the
// stage's layers only and cache is a cache of the stage.
func (r *KVRemote) Prefill(ctx context.Context, reqID string, prompt []int32, start int, cache engine.KVCache, prefer []string) (RemoteStats, error) {
	if len(r.Parts) > 0 && r.Parts[0].Heads {
		return r.headFill(ctx, reqID, prompt, start, cache)
	}
	if len(r.Parts) > 0 {
		return r.splitFill(ctx, reqID, prompt, start, cache)
	}
	req, exp := wireRequest(r.Model, reqID, r.Name, prompt, start)
	req.DType, req.Deadline, req.Streams = r.wireDType(cache), fetchDeadline(r.Deadline), r.Streams
	sink := &cacheSink{cache: cache, start: start}
	var st kvwire.Stats
	var err error
	if r.Breaker == nil {
		err = r.Selector.DoPreferred(ctx, prefer, nil, func(ctx context.Context, addr string) error {
			var err error
			st, err = r.Client.Fetch(ctx, addr, req, exp, sink)
			return err
		})
	} else {
		err = r.Selector.DoPreferred(ctx, prefer, r.Breaker.Allow, func(ctx context.Context, addr string) error {
			var err error
			st, err = r.Client.FetchIdle(ctx, addr, r.Breaker.Idle(addr), req, exp, sink)
			if ctx.Err() == nil {
				r.Breaker.Report(addr, st, err)
			}
			return err
		})
		if errors.Is(err, kvwire.ErrNoEndpoint) && len(r.Breaker.Endpoints()) > 0 {
			err = errAllOpen
		}
	}
	rs := RemoteStats{Endpoint: st.Addr, Bytes: st.PayloadBytes, States: st.States, Duration: st.Duration, Wait: st.WireWait}
	if err != nil {
		return rs, err
	}
	return rs, checkFilled(cache, prompt, start)
}

// Classify implements Remote.
func (r *KVRemote) Classify(err error) string {
	switch {
	case errors.Is(err, errAllOpen):
		return metrics.OutcomeSkippedOpen
	case errors.Is(err, kvwire.ErrNoEndpoint):
		return metrics.OutcomeSkippedNoEnd
	case errors.Is(err, kvwire.ErrBusy):
		return metrics.OutcomeFallbackBusy
	case errors.Is(err, kvwire.ErrMismatch):
		return metrics.OutcomeFallbackMismatch
	case errors.Is(err, kvwire.ErrCorrupt):
		return metrics.OutcomeFallbackCorrupt
	}
	return metrics.OutcomeFallbackError
}

// cacheSink injects a KV stream into a cache transactionally: chunks are
// imported as they arrive (positions past Len(), invisible to attention),
// Done commits them, and Rollback truncates back to start, so a failed
// stream never leaves a partial cache behind.
type cacheSink struct {
	cache engine.KVCache
	start int
	wire  engine.DType
	fp8   bool // FP8 wire: chunks are widened into the cache dtype
	heads int
}

// widen decodes one FP8 K or V section into the cache dtype.
func (s *cacheSink) widen(sec []byte, tokens int) ([]byte, error) {
	to := kvconv.Wire(s.cache.DType())
	g := s.cache.Geometry()
	out := make([]byte, s.heads*tokens*g.HeadDim*to.Size())
	if err := kvwire.DecodeFP8(out, to, sec, s.heads); err != nil {
		return nil, err
	}
	return out, nil
}

func (s *cacheSink) Begin(h *kvwire.Header) error {
	return s.begin(h, 0, s.cache.Geometry().KVHeads, true)
}

// begin checks a stream's header against the cache and takes its wire
// dtype (an FP8 stream is widened straight into the cache dtype). The
// stream must start at start and hold heads KV heads (the cache's, or a
// head-split piece's) of the cache's layers from off on: all of them
// where whole, else as many as the stream has (a pipeline stage's).
func (s *cacheSink) begin(h *kvwire.Header, off, heads int, whole bool) error {
	if h.TokenStart != s.start {
		return fmt.Errorf("%w: stream starts at %d, cache holds %d", kvwire.ErrCorrupt, h.TokenStart, s.start)
	}
	s.wire, s.fp8 = kvconv.Engine(h.DType), h.DType == kvwire.DTypeF8E4M3
	if s.fp8 {
		s.wire, s.heads = s.cache.DType(), h.KVHeads
	}
	if s.wire == 0 {
		return fmt.Errorf("%w: wire dtype %v", kvwire.ErrMismatch, h.DType)
	}
	g := s.cache.Geometry()
	if off+h.Layers() > g.Layers || whole && h.Layers() != g.Layers || h.KVHeads != heads || h.HeadDim != g.HeadDim {
		return fmt.Errorf("%w: stream geometry %d×%d×%d at layer %d, want %d×%d×%d of %d layers", kvwire.ErrMismatch,
			h.Layers(), h.KVHeads, h.HeadDim, off, g.Layers-off, heads, g.HeadDim, g.Layers)
	}
	for l := range h.Layers() {
		if h.Window(l) != g.Window(off+l) {
			return fmt.Errorf("%w: stream layer %d window %d, cache %d", kvwire.ErrMismatch, l, h.Window(l), g.Window(off+l))
		}
	}
	return nil
}

func (s *cacheSink) Chunk(layer, tokenStart, tokenCount int, k, v []byte) error {
	var err error
	if s.fp8 {
		if k, err = s.widen(k, tokenCount); err != nil {
			return err
		}
		if v, err = s.widen(v, tokenCount); err != nil {
			return err
		}
	}
	if s.wire != s.cache.DType() {
		if k, err = kvconv.Convert(k, s.wire, s.cache.DType()); err != nil {
			return err
		}
		if v, err = kvconv.Convert(v, s.wire, s.cache.DType()); err != nil {
			return err
		}
	}
	if err := s.cache.Import(layer, tokenStart, tokenCount, k, v); err != nil {
		return fmt.Errorf("inject layer %d [%d,+%d): %w", layer, tokenStart, tokenCount, err)
	}
	return nil
}

// State stages a recurrent layer's state; Done's Commit applies it with
// the chunks (the tracker has checked it is for a recurrent layer).
func (s *cacheSink) State(layer, tokenEnd int, arrays [][]byte) error {
	rs, ok := s.cache.(engine.RecurrentState)
	if !ok || !rs.Recurrent(layer) {
		return fmt.Errorf("%w: recurrent state for layer %d, which is not recurrent here", kvwire.ErrMismatch, layer)
	}
	if err := rs.ImportState(layer, arrays); err != nil {
		return fmt.Errorf("%w: inject state of layer %d: %v", kvwire.ErrCorrupt, layer, err)
	}
	return nil
}

func (s *cacheSink) Done(t kvwire.Totals) error {
	if err := s.cache.Commit(t.TokenEnd); err != nil {
		return fmt.Errorf("commit injected KV: %w", err)
	}
	return nil
}

func (s *cacheSink) Rollback() { s.cache.Truncate(s.start) }

// Calibrate runs one real prefill of prompt on the endpoint at addr alone
// (no failover) into a scratch cache that is then freed: the router's
// start-up measurement of that endpoint's rate. The prompt should differ
// from earlier calibrations so that the endpoint's prefix cache does not
// answer it.
func (r *KVRemote) Calibrate(ctx context.Context, addr string, prompt []int32) (RemoteStats, error) {
	cache := r.Model.NewCache()
	defer cache.Free()
	// The same request and expectations as a real fetch: recurrent layers,
	// sliding windows and a stage's range included, or a hybrid, sliding
	// or staged model is never calibrated.
	req, exp := wireRequest(r.Model, "calibrate", r.Name, prompt, 0)
	req.DType, req.Deadline, req.Streams = r.wireDType(cache), fetchDeadline(r.Deadline), r.Streams
	st, err := r.Client.Fetch(ctx, addr, req, exp, &cacheSink{cache: cache})
	return RemoteStats{Endpoint: addr, Bytes: st.PayloadBytes, Duration: st.Duration, Wait: st.WireWait}, err
}
