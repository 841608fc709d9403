// Package metrics owns the Prometheus metrics of a runner process (DESIGN.md
// §7): request latency histograms and token counters, the queue gauge, the
// remote-prefill outcome counter, KV transfer metrics and prefix-cache hits.
// Each runner makes its own registry (no globals), so tests can run several
// runners in one process. It must not import the engine, kvwire or anything
// under supervisor/.
package metrics

import (
	"net/http"
	"runtime"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Remote-prefill outcomes (label values of exo_remote_prefill_total).
const (
	OutcomeOK               = "ok"                  // KV came from a prefill runner
	OutcomeFallbackBusy     = "fallback_busy"       // every endpoint busy: prefilled locally
	OutcomeFallbackError    = "fallback_error"      // closed, timeout, internal, auth, version…: local
	OutcomeFallbackMismatch = "fallback_mismatch"   // fingerprint/geometry mismatch: local
	OutcomeFallbackCorrupt  = "fallback_corrupt"    // CRC/framing error: local
	OutcomeSkippedShort     = "skipped_short"       // uncached tokens under the threshold
	OutcomeSkippedNoEnd     = "skipped_no_endpoint" // no prefill endpoint configured
	OutcomeSkippedDisabled  = "skipped_disabled"    // the request asked for local prefill
	OutcomeSkippedCached    = "skipped_cached"      // the whole prompt was in the decode cache
	OutcomeSkippedOpen      = "skipped_open"        // every endpoint's circuit breaker is open
	OutcomeSkippedCost      = "skipped_cost"        // the cost model predicted local prefill faster
)

// Runner holds one runner's metrics.
type Runner struct {
	Registry *prometheus.Registry

	TTFT         *prometheus.HistogramVec // model
	InterToken   *prometheus.HistogramVec // model
	Duration     *prometheus.HistogramVec // model
	PromptTokens *prometheus.CounterVec   // model
	GenTokens    *prometheus.CounterVec   // model
	Requests     *prometheus.CounterVec   // model, code
	Waiting      prometheus.Gauge
	Running      prometheus.Gauge

	RemotePrefill *prometheus.CounterVec // outcome
	KVBytes       *prometheus.CounterVec // role (prefill: sent, decode: received)
	KVDuration    *prometheus.HistogramVec
	KVWait        prometheus.Histogram
	PrefixHit     *prometheus.CounterVec // role
	PrefillTokens *prometheus.CounterVec // role: tokens computed by Prefill
	DecodeBatch   prometheus.Histogram   // sequences per batched decode step
	// DecodeBatchMax is the most sequences one batched decode step has
	// held since the runner started (decode only): whether generations
	// ever decoded together, read without summing histogram buckets.
	DecodeBatchMax prometheus.Gauge
	// PrefillEndpointState is 1 while a prefill endpoint's circuit breaker
	// is open (skipped), 0 while closed (decode only).
	PrefillEndpointState *prometheus.GaugeVec // endpoint
	// PrefillEndpointTrips counts closed → open transitions.
	PrefillEndpointTrips *prometheus.CounterVec // endpoint
	// PrefillEndpointLoad is each prefill runner's load (waiting +
	// running) as its /health last said (decode, with --prefill-health).
	PrefillEndpointLoad *prometheus.GaugeVec // endpoint
	// RouteDecisions counts the P/D cost model's decisions (decode only).
	RouteDecisions *prometheus.CounterVec // route, reason
	// RouteError is (actual - predicted) / predicted fill time of the
	// chosen route.
	RouteError prometheus.Histogram
	// SpecTokens counts drafted tokens speculative decoding verified, by
	// outcome: accepted (kept) or rejected (decode only).
	SpecTokens *prometheus.CounterVec // outcome
	// SpecBatchPositions observes the positions of each batched decode
	// step that verified drafts: its sequences plus the drafted tokens
	// they verified in that one forward (decode only).
	SpecBatchPositions prometheus.Histogram
	// SpecSharedSteps counts batched decode steps in which drafts were
	// verified in the same forward as at least one other sequence's step:
	// speculating generations sharing the model's forwards (decode only).
	SpecSharedSteps prometheus.Counter
	// Goroutines is the process's goroutine count taken when a scrape
	// begins, before the registry gathers: go_goroutines is read inside
	// the gather, where the registry's own collector goroutines (one to
	// one per collector, as many as the scheduler let it start by then)
	// are counted too, so it moves by a few between scrapes of an idle
	// runner (12 to 15 seen here on a loaded machine). This one counts
	// the runner's goroutines plus the scrape's connection (two: the
	// handler's and the server's background read), the same each scrape.
	Goroutines prometheus.Gauge
}

// Speculative decoding outcomes (label values of
// exo_speculative_tokens_total).
const (
	SpecAccepted = "accepted"
	SpecRejected = "rejected"
)

var latencyBuckets = []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120}

// New makes the metrics of one runner with role "decode" or "prefill",
// registered in a fresh registry together with the Go and process
// collectors.
func New(role string) *Runner {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	f := func(c prometheus.Collector) { reg.MustRegister(c) }
	cl := prometheus.Labels{"role": role}
	m := &Runner{Registry: reg}
	m.TTFT = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "exo_time_to_first_token_seconds",
		Help: "Time from request arrival to the first generated token.", Buckets: latencyBuckets}, []string{"model"})
	m.InterToken = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "exo_inter_token_latency_seconds",
		Help:    "Time between consecutive generated tokens.",
		Buckets: []float64{.001, .0025, .005, .01, .02, .04, .08, .16, .32, .64, 1.28}}, []string{"model"})
	m.Duration = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "exo_request_duration_seconds",
		Help: "Time from request arrival to its completion.", Buckets: latencyBuckets}, []string{"model"})
	m.PromptTokens = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "exo_prompt_tokens_total",
		Help: "Prompt tokens of completed and failed requests."}, []string{"model"})
	m.GenTokens = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "exo_generation_tokens_total",
		Help: "Generated tokens."}, []string{"model"})
	m.Requests = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "exo_requests_total",
		Help: "Requests by HTTP status code (499: the client went away)."}, []string{"model", "code"})
	m.Waiting = prometheus.NewGauge(prometheus.GaugeOpts{Name: "exo_requests_waiting",
		Help: "Requests waiting in the runner's queue.", ConstLabels: cl})
	m.Running = prometheus.NewGauge(prometheus.GaugeOpts{Name: "exo_requests_running",
		Help: "Requests being computed.", ConstLabels: cl})
	m.RemotePrefill = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "exo_remote_prefill_total",
		Help: "Decode requests by remote-prefill outcome."}, []string{"outcome"})
	m.KVBytes = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "exo_kv_transfer_bytes_total",
		Help: "KV payload bytes moved over the KV wire (prefill: sent, decode: received)."}, []string{"role"})
	m.KVDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "exo_kv_transfer_duration_seconds",
		Help: "Duration of KV wire transfers, request to done.", Buckets: latencyBuckets}, []string{"role"})
	m.KVWait = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "exo_kv_wait_seconds",
		Help: "Time the decode side spent waiting on the KV wire per transfer.", Buckets: latencyBuckets})
	m.PrefixHit = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "exo_prefix_cache_hit_tokens_total",
		Help: "Prompt tokens whose KV came from a prefix cache instead of being computed."}, []string{"role"})
	m.PrefillTokens = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "exo_prefill_computed_tokens_total",
		Help: "Prompt tokens computed by this runner's prefill."}, []string{"role"})
	m.DecodeBatch = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "exo_decode_batch_sequences",
		Help:    "Sequences decoded together per batched decode step.",
		Buckets: []float64{1, 2, 4, 8, 16, 32}})
	m.DecodeBatchMax = prometheus.NewGauge(prometheus.GaugeOpts{Name: "exo_decode_batch_sequences_max",
		Help: "The most sequences one batched decode step has held since the runner started."})
	m.PrefillEndpointState = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "exo_prefill_endpoint_state",
		Help: "Circuit breaker of each prefill endpoint: 1 open (skipped after a timeout or connection failure), 0 closed."}, []string{"endpoint"})
	m.PrefillEndpointTrips = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "exo_prefill_endpoint_trips_total",
		Help: "Times a prefill endpoint's circuit breaker opened."}, []string{"endpoint"})
	m.PrefillEndpointLoad = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "exo_prefill_endpoint_load",
		Help: "Requests waiting or running at each prefill runner, as its /health last reported (0: unknown)."}, []string{"endpoint"})
	m.RouteDecisions = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "exo_remote_prefill_decisions_total",
		Help: "Cost-model route decisions for prompt prefill, by route (local, remote) and reason."}, []string{"route", "reason"})
	m.RouteError = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "exo_route_prediction_error_ratio",
		Help:    "Relative error of the cost model's predicted prefill time for the route taken: (actual - predicted) / predicted.",
		Buckets: []float64{-0.75, -0.5, -0.25, -0.1, 0, 0.1, 0.25, 0.5, 1, 2, 4}})
	m.SpecBatchPositions = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "exo_speculative_batch_positions",
		Help:    "Positions (sequences plus drafted tokens verified) of each batched decode step that verified drafts.",
		Buckets: []float64{2, 4, 8, 16, 32, 64, 128}})
	m.SpecSharedSteps = prometheus.NewCounter(prometheus.CounterOpts{Name: "exo_speculative_shared_steps_total",
		Help: "Batched decode steps that verified drafts in the same forward as another sequence's step."})
	m.SpecTokens = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "exo_speculative_tokens_total",
		Help: "Drafted tokens verified by speculative decoding, by outcome: accepted (kept) or rejected."}, []string{"outcome"})
	m.Goroutines = prometheus.NewGauge(prometheus.GaugeOpts{Name: "exo_goroutines",
		Help: "Goroutines when this scrape began (go_goroutines also counts the scrape's own collector goroutines, a number that varies with scheduling)."})
	for _, c := range []prometheus.Collector{m.TTFT, m.InterToken, m.Duration, m.PromptTokens, m.GenTokens, m.Requests, m.Goroutines,
		m.Waiting, m.Running, m.RemotePrefill, m.KVBytes, m.KVDuration, m.KVWait, m.PrefixHit, m.PrefillTokens} {
		f(c)
	}
	if role == "decode" {
		f(m.DecodeBatch)
		f(m.DecodeBatchMax)
		f(m.PrefillEndpointState)
		f(m.PrefillEndpointTrips)
		f(m.PrefillEndpointLoad)
		f(m.RouteDecisions)
		f(m.RouteError)
		f(m.SpecTokens)
		f(m.SpecBatchPositions)
		f(m.SpecSharedSteps)
		m.SpecTokens.WithLabelValues(SpecAccepted)
		m.SpecTokens.WithLabelValues(SpecRejected)
	}
	// Expose the outcome and role series at zero from the start, so a
	// scrape (and a test) sees them before the first event.
	for _, o := range []string{OutcomeOK, OutcomeFallbackBusy, OutcomeFallbackError, OutcomeFallbackMismatch,
		OutcomeFallbackCorrupt, OutcomeSkippedShort, OutcomeSkippedNoEnd, OutcomeSkippedDisabled, OutcomeSkippedCached, OutcomeSkippedOpen, OutcomeSkippedCost} {
		if role == "decode" {
			m.RemotePrefill.WithLabelValues(o)
		}
	}
	m.PrefixHit.WithLabelValues(role)
	m.KVBytes.WithLabelValues(role)
	m.KVDuration.WithLabelValues(role)
	m.PrefillTokens.WithLabelValues(role)
	return m
}

// Expose creates a decode runner's per-model series at zero for model
// (its served name), so a scrape before the first request finds every
// name of DESIGN.md §7 (requests by code: 200 only; other codes appear
// when they happen).
func (m *Runner) Expose(model string) {
	m.TTFT.WithLabelValues(model)
	m.InterToken.WithLabelValues(model)
	m.Duration.WithLabelValues(model)
	m.PromptTokens.WithLabelValues(model)
	m.GenTokens.WithLabelValues(model)
	m.Requests.WithLabelValues(model, "200")
}

// Handler serves the registry in the Prometheus text format, setting
// exo_goroutines first.
func (m *Runner) Handler() http.Handler {
	h := promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{Registry: m.Registry})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m.Goroutines.Set(float64(runtime.NumGoroutine()))
		h.ServeHTTP(w, r)
	})
}
