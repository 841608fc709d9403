package decode

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/gen"
	"github.com/exo-pd/exo-pd/runners/kvwire"
)

// JournalPath is where a decode runner serves its recent requests and the
// links it measured (the supervisor's dashboard reads it; docs/OPERATIONS.md).
const JournalPath = "/exo/requests"

// journalSize is how many recent requests a runner keeps.
const journalSize = 256

// RequestRecord is one request as the decode runner served it: what the
// prompt cost, where its prefill ran and why, and how fast it went. Times
// are seconds; 0 means not reached (an error before the first token).
type RequestRecord struct {
	Seq              uint64    `json:"seq"` // increasing per runner start
	ID               string    `json:"id"`
	Model            string    `json:"model"`
	Start            time.Time `json:"start"`
	Done             bool      `json:"done"`
	PromptTokens     int       `json:"prompt_tokens"`
	CachedTokens     int       `json:"cached_tokens"` // served from the decode-side prefix cache
	CompletionTokens int       `json:"completion_tokens"`
	// Route is where the prompt's uncached KV came from: "remote" (a
	// prefill runner over the KV wire) or "local".
	Route string `json:"route"`
	// Reason is the cost model's reason (below_floor, faster, unmeasured,
	// within_hysteresis, no_endpoint; "" when the runner has no cost model
	// or did not ask it), Outcome the exo_remote_prefill_total outcome (ok,
	// skipped_short, skipped_cached, skipped_cost, fallback_busy, …).
	Reason   string `json:"reason,omitempty"`
	Outcome  string `json:"outcome,omitempty"`
	Endpoint string `json:"endpoint,omitempty"` // the prefill endpoint that served it
	// PredictedFill is the cost model's predicted time for the route it
	// took; Fill the measured time to fill the cache (remote or local).
	PredictedFill float64 `json:"predicted_fill_s,omitempty"`
	Fill          float64 `json:"fill_s,omitempty"`
	TTFT          float64 `json:"ttft_s,omitempty"`
	KVBytes       int64   `json:"kv_bytes,omitempty"`
	KVTransfer    float64 `json:"kv_transfer_s,omitempty"`
	// TokensPerSecond is the decode rate after the first token.
	TokensPerSecond float64 `json:"tokens_per_s,omitempty"`
	Duration        float64 `json:"duration_s,omitempty"`
	FinishReason    string  `json:"finish_reason,omitempty"`
	// SpecAccepted and SpecRejected count the drafted tokens that
	// speculative decoding verified and kept, and threw away.
	SpecAccepted int    `json:"spec_accepted,omitempty"`
	SpecRejected int    `json:"spec_rejected,omitempty"`
	Error        string `json:"error,omitempty"`

	first time.Time
}

// LinkRecord is one prefill endpoint's link as this runner measured it.
type LinkRecord struct {
	Endpoint string `json:"endpoint"`
	// Goodput is the cost model's measured goodput (probes and transfers,
	// averaged; 0: not measured or no cost model); LastGoodput that of the
	// latest remote prefill in the journal (0: none).
	Goodput     float64 `json:"goodput_bytes_per_s"`
	LastGoodput float64 `json:"last_goodput_bytes_per_s,omitempty"`
	Up          bool    `json:"up"`   // its circuit breaker lets requests through
	Kind        string  `json:"kind"` // thunderbolt, ethernet, wifi, loopback, unknown
	Interface   string  `json:"interface,omitempty"`
}

// Journal is what JournalPath answers.
type Journal struct {
	Model    string          `json:"model"`
	Requests []RequestRecord `json:"requests"` // oldest first
	Links    []LinkRecord    `json:"links"`
	// Memory is the engine's own memory account where its backend keeps
	// one (MLX: active, cache and peak bytes), as last sampled.
	Memory *EngineMemory `json:"engine_memory,omitempty"`
}

// EngineMemory is a backend's memory account.
type EngineMemory struct {
	Active  int64     `json:"active_bytes"`
	Cache   int64     `json:"cache_bytes"`
	Peak    int64     `json:"peak_bytes"`
	Sampled time.Time `json:"sampled"`
}

// memoryBackend is a backend that accounts its memory (MLX's does).
type memoryBackend interface {
	ActiveMemory() (active, cache int64, err error)
	PeakMemory(reset bool) (int64, error)
}

// memSampler keeps the latest EngineMemory. A sample goes through the
// backend's own thread, which may be busy with a long step: JournalPath
// answers with the last sample and asks for a new one in the background.
type memSampler struct {
	mu       sync.Mutex
	last     *EngineMemory
	sampling bool
}

func (m *memSampler) get(b memoryBackend) *EngineMemory {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.sampling && (m.last == nil || time.Since(m.last.Sampled) > time.Second) {
		m.sampling = true
		go func() {
			active, cache, err := b.ActiveMemory()
			peak, perr := b.PeakMemory(false)
			m.mu.Lock()
			defer m.mu.Unlock()
			m.sampling = false
			if err == nil && perr == nil {
				m.last = &EngineMemory{Active: active, Cache: cache, Peak: peak, Sampled: time.Now()}
			}
		}()
	}
	return m.last
}

// journal keeps the last journalSize requests.
type journal struct {
	mu   sync.Mutex
	seq  uint64
	ring []*RequestRecord
	next int
}

func (j *journal) begin(id, model string, t0 time.Time) *RequestRecord {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.seq++
	r := &RequestRecord{Seq: j.seq, ID: id, Model: model, Start: t0, Route: RouteLocal}
	if len(j.ring) < journalSize {
		j.ring = append(j.ring, r)
	} else {
		j.ring[j.next] = r
		j.next = (j.next + 1) % journalSize
	}
	return r
}

// update changes r under the journal's lock (readers copy under it too).
func (j *journal) update(r *RequestRecord, f func(r *RequestRecord)) {
	if r == nil {
		return
	}
	j.mu.Lock()
	f(r)
	j.mu.Unlock()
}

// since copies the records with Seq > after, oldest first.
func (j *journal) since(after uint64) []RequestRecord {
	j.mu.Lock()
	defer j.mu.Unlock()
	out := []RequestRecord{}
	for i := range j.ring {
		r := j.ring[(j.next+i)%len(j.ring)]
		if r.Seq > after {
			out = append(out, *r)
		}
	}
	return out
}

type recordKey struct{}

// withRecord hands a request's record to fill and generate.
func withRecord(ctx context.Context, r *RequestRecord) context.Context {
	return context.WithValue(ctx, recordKey{}, r)
}

func recordFrom(ctx context.Context) *RequestRecord {
	r, _ := ctx.Value(recordKey{}).(*RequestRecord)
	return r
}

// note records f on the context's request record, if any.
func (s *Server) note(ctx context.Context, f func(r *RequestRecord)) {
	s.journal.update(recordFrom(ctx), f)
}

// finishRecord completes a request's record after Generate.
func (s *Server) finishRecord(r *RequestRecord, res gen.Result, err error) {
	s.journal.update(r, func(r *RequestRecord) {
		now := time.Now()
		r.Done = true
		r.Duration = now.Sub(r.Start).Seconds()
		r.CompletionTokens, r.FinishReason = res.CompletionTokens, res.FinishReason
		if res.PromptTokens > 0 {
			r.PromptTokens, r.CachedTokens = res.PromptTokens, res.CachedTokens
		}
		if !r.first.IsZero() && res.CompletionTokens > 1 {
			if d := now.Sub(r.first).Seconds(); d > 0 {
				r.TokensPerSecond = float64(res.CompletionTokens-1) / d
			}
		}
		if err != nil {
			r.Error = err.Error()
		}
	})
}

// serveJournal answers JournalPath: ?since=SEQ returns only newer records.
func (s *Server) serveJournal(w http.ResponseWriter, r *http.Request) {
	after, _ := strconv.ParseUint(r.URL.Query().Get("since"), 10, 64)
	out := Journal{Model: s.o.Name, Requests: s.journal.since(after), Links: s.links()}
	if mb, ok := s.o.Model.(interface{ Backend() engine.Backend }); ok {
		if b, ok := mb.Backend().(memoryBackend); ok {
			out.Memory = s.mem.get(b)
		}
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(out)
}

// links describes every prefill endpoint of this runner.
func (s *Server) links() []LinkRecord {
	out := []LinkRecord{}
	var br *Breaker
	if kr, ok := s.o.Remote.(*KVRemote); ok {
		br = kr.Breaker
	}
	var addrs []string
	switch rt := s.o.Router; {
	case br != nil:
		addrs = br.Endpoints()
	case rt != nil && rt.Endpoints != nil:
		addrs = rt.Endpoints()
	}
	last := map[string]float64{}
	for _, r := range s.journal.since(0) {
		if r.Route == RouteRemote && r.KVBytes > 0 && r.KVTransfer > 0 {
			last[r.Endpoint] = float64(r.KVBytes) / r.KVTransfer
		}
	}
	for _, a := range addrs {
		l := LinkRecord{Endpoint: a, LastGoodput: last[a], Up: br == nil || br.Allow(a)}
		if s.o.Router != nil {
			l.Goodput = s.o.Router.Rates.Goodput(a)
		}
		kind, iface := kvwire.DetectLink(a)
		l.Kind, l.Interface = kind.String(), iface
		out = append(out, l)
	}
	return out
}
