package decode

import (
	"context"
	"log/slog"
	"time"

	"github.com/exo-pd/exo-pd/runners/kvwire"
	"github.com/exo-pd/exo-pd/runners/metrics"
)

// RemoteConfig is how a decode runner reaches its prefill runners (the
// runner's --prefill… and --kv-… flags).
type RemoteConfig struct {
	Name  string // served model name sent to the prefill runners
	Model Model  // the local model: KV geometry, and the local calibration
	// Endpoints are the prefill runners' KV-wire addresses; Health, when
	// set, their /health addresses in the same order (their load orders
	// failover and, with the cost route, slows a busy host's prediction).
	Endpoints []string
	Health    []string
	Secret    []byte
	// ConnectTimeout bounds connect + hello of an endpoint (past it the
	// endpoint is skipped until it answers a probe); IdleFloor is the
	// shortest wait for the next KV frame.
	ConnectTimeout time.Duration
	IdleFloor      time.Duration
	FP8            bool // ask for E4M3 KV instead of the cache's dtype
	Streams        int  // TCP connections per transfer (1 to kvwire.MaxStreams)
	// Cost routes by predicted time (measured rates, queues, links; the
	// min tokens a floor); false: the floor alone.
	Cost  bool
	Chunk int // local prefill chunk of the calibration
	// Probe is how often open endpoints are probed (0: RunProbes' default).
	Probe   time.Duration
	Metrics *metrics.Runner
	Logger  *slog.Logger
}

// RemoteWiring is remote prefill wired for a Server: set Options.Remote and
// Options.Router from it.
type RemoteWiring struct {
	Remote  *KVRemote
	Router  *Router // nil unless RemoteConfig.Cost
	Breaker *Breaker
}

// NewRemote wires remote prefill: the KV-wire client, the endpoint
// selector, the circuit breaker (its state in the metrics and the log) and,
// with the cost route, the router, calibrated once with a local prefill
// before it returns. It starts, until ctx ends: the breaker's probes, each
// endpoint's link and prefill measurement (again whenever an endpoint
// answers after being skipped: its path may differ) and, with Health, the
// load watch.
func NewRemote(ctx context.Context, c RemoteConfig) *RemoteWiring {
	met, log := c.Metrics, c.Logger
	if met == nil {
		met = metrics.New("decode")
	}
	if log == nil {
		log = slog.Default()
	}
	// ADDR@A:B entries are the stages of a pipelined prefill model; the
	// caller has checked the list with ParsePrefillEndpoints.
	addrs, parts, _ := ParsePrefillEndpoints(c.Endpoints)
	c.Endpoints = addrs
	if len(parts) > 0 && c.Cost {
		log.Info("remote prefill from prefill stages routes by the min tokens alone (the cost route measures whole prefill runners)")
		c.Cost = false
	}
	eps := make([]kvwire.Endpoint, len(c.Endpoints))
	for i, a := range c.Endpoints {
		eps[i] = kvwire.Endpoint{Addr: a}
		met.PrefillEndpointState.WithLabelValues(a).Set(0)
		met.PrefillEndpointTrips.WithLabelValues(a)
	}
	w := &RemoteWiring{}
	if c.Cost {
		w.Router = newCostRouter(c.Model, c.FP8)
	}
	w.Remote = &KVRemote{Name: c.Name, Model: c.Model, Streams: c.Streams, Selector: kvwire.NewSelector(eps),
		Client: kvwire.NewClient(kvwire.ClientConfig{Secret: c.Secret, Logger: log, ConnectTimeout: c.ConnectTimeout, IdleTimeout: 30 * time.Second})}
	if c.FP8 {
		w.Remote.WireDType = kvwire.DTypeF8E4M3
	}
	w.Remote.Parts = parts
	if rt := w.Router; rt != nil {
		rt.Endpoints = func() []string {
			var out []string
			for _, a := range w.Breaker.Endpoints() {
				if w.Breaker.Allow(a) {
					out = append(out, a)
				}
			}
			return out
		}
		rt.Ahead = SelectorAhead(w.Remote.Selector)
		rt.PrefixHit = w.Remote.PrefixHit
	}
	// The breaker's callback runs on other goroutines: everything it reads
	// is made above, before the breaker exists.
	w.Breaker = NewBreaker(c.Endpoints, BreakerOptions{IdleFloor: c.IdleFloor,
		OnChange: func(addr string, s BreakerState) {
			if w.Router != nil && s == Closed { // reconnected: the path may differ, measure it again
				w.Router.Rates.ForgetLink(addr)
				go measureEndpoint(ctx, w.Remote, w.Router, addr, log)
			}
			if s == Open {
				met.PrefillEndpointState.WithLabelValues(addr).Set(1)
				met.PrefillEndpointTrips.WithLabelValues(addr).Inc()
				log.Warn("prefill endpoint not answering; skipping it until it answers a probe", "endpoint", addr)
			} else {
				met.PrefillEndpointState.WithLabelValues(addr).Set(0)
				log.Info("prefill endpoint answers again", "endpoint", addr)
			}
		}})
	w.Remote.Breaker = w.Breaker
	if rt := w.Router; rt != nil {
		calibrateLocal(ctx, c.Model, rt, c.Chunk, log)
		for _, a := range c.Endpoints {
			go measureEndpoint(ctx, w.Remote, rt, a, log)
		}
	}
	if len(c.Health) > 0 {
		health := map[string]string{}
		for i, h := range c.Health {
			if i < len(c.Endpoints) {
				health[c.Endpoints[i]] = h
				met.PrefillEndpointLoad.WithLabelValues(c.Endpoints[i]).Set(0)
			}
		}
		go watchEndpointLoad(ctx, w.Remote.Selector, health, met, log)
	}
	go w.Remote.RunProbes(ctx, c.Probe)
	return w
}

// newCostRouter makes the decode runner's cost model: the KV bytes per
// token on the wire from the model's geometry and the wire dtype (the
// cache's, or one byte per element for fp8; its per-head scales are under
// 1 %).
func newCostRouter(m Model, fp8 bool) *Router {
	info := m.Info()
	size := info.CacheDType.Size()
	if fp8 {
		size = 1
	}
	kv := float64(2 * info.Layers * info.KVHeads * info.HeadDim * size)
	return &Router{Rates: NewRates(), KVBytesPerToken: kv}
}

// calibrateLocal measures the local prefill rate once at start (a
// 256-token prompt on a scratch cache) so the first request is not routed
// blind.
func calibrateLocal(ctx context.Context, m Model, r *Router, chunk int, log *slog.Logger) {
	n := min(256, m.Info().MaxPositions-1)
	if n <= 0 {
		return
	}
	c := m.NewCache()
	defer c.Free()
	t0 := time.Now()
	if err := m.Prefill(ctx, c, make([]int32, n), chunk, nil); err != nil {
		log.Warn("local prefill calibration failed; routing by the floor until a request measures it", "err", err)
		return
	}
	d := time.Since(t0)
	r.ObserveLocal(n, d)
	log.Info("local prefill calibrated", "tokens", n, "duration", d, "tokens_per_s", float64(n)/d.Seconds())
}

// measureEndpoint measures addr for the router: its link goodput with a
// kvwire link probe, then its prefill rate with one real 256-token prefill
// of tokens no earlier request used. The probe is sized to the link: one
// probe token (128 KiB) first, then as many as fit in about 250 ms at the
// rate that showed (at most 128: 16 MiB), so a slow link is not held for
// seconds and a fast one is measured past its latency.
func measureEndpoint(ctx context.Context, r *KVRemote, rt *Router, addr string, log *slog.Logger) {
	pr, err := r.Client.ProbeStreams(ctx, addr, 1, r.Streams)
	if err == nil {
		if n := probeTokens(pr.Transfer); n > 1 {
			pr, err = r.Client.ProbeStreams(ctx, addr, n, r.Streams)
		}
	}
	if err != nil {
		log.Warn("link probe failed; the route to this endpoint is decided by the floor until a transfer measures it", "endpoint", addr, "err", err)
		return
	}
	rt.ObserveProbe(addr, pr.PayloadBytes, pr.Transfer)
	log.Info("link probed", "endpoint", addr, "bytes", pr.PayloadBytes, "transfer", pr.Transfer, "goodput_bytes_per_s", pr.Goodput())
	info := r.Model.Info()
	n := min(256, info.MaxPositions-1)
	if n <= 0 || info.Vocab <= 0 {
		return
	}
	seed := time.Now().UnixNano()
	prompt := make([]int32, n+1)
	for i := range prompt {
		prompt[i] = int32((seed + int64(i)*7919) % int64(info.Vocab))
	}
	st, err := r.Calibrate(ctx, addr, prompt)
	if err != nil {
		log.Warn("remote prefill calibration failed", "endpoint", addr, "err", err)
		return
	}
	rt.ObserveRemote(addr, n, 0, st.Bytes, st.Duration)
	log.Info("remote prefill calibrated", "endpoint", addr, "tokens", n, "duration", st.Duration)
}

// probeTokens is the size of the second link probe after a one-token
// probe took d: what fits in 250 ms at that pace, 1 to 128 tokens.
func probeTokens(d time.Duration) int {
	if d <= 0 {
		return 128
	}
	return int(min(max(float64(250*time.Millisecond)/float64(d), 1), 128))
}

// watchEndpointLoad feeds the prefill runners' /health load to the
// selector, which orders failover by it and, through SelectorAhead, makes
// the cost model predict a busy host slower. A poll that starts or stops
// failing is logged once.
func watchEndpointLoad(ctx context.Context, sel *kvwire.Selector, health map[string]string, met *metrics.Runner, log *slog.Logger) {
	failing := map[string]bool{}
	WatchLoad(ctx, health, 0, func(addr string, n int, err error) {
		sel.ReportLoad(addr, n)
		met.PrefillEndpointLoad.WithLabelValues(addr).Set(float64(n))
		if (err != nil) != failing[addr] {
			failing[addr] = err != nil
			if err != nil {
				log.Warn("prefill runner's load unknown (its /health does not answer)", "endpoint", addr, "health", health[addr], "err", err)
			} else {
				log.Info("prefill runner's load known again", "endpoint", addr, "health", health[addr])
			}
		}
	})
}
