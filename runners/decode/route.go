package decode

import (
	"context"
	"math"
	"sync"
	"time"

	"github.com/exo-pd/exo-pd/runners/kvwire"
)

// Route names and decision reasons (exo_remote_prefill_decisions_total's
// labels once wired into the runner).
const (
	RouteLocal  = "local"
	RouteRemote = "remote"

	ReasonShort      = "below_floor"       // fewer uncached tokens than remote_prefill_min_tokens
	ReasonNoEndpoint = "no_endpoint"       // no remote candidate
	ReasonUnmeasured = "unmeasured"        // a rate is unknown: the floor alone decides
	ReasonFaster     = "faster"            // the chosen route is predicted faster by more than the hysteresis
	ReasonHysteresis = "within_hysteresis" // remote predicted faster, but not by enough to leave local
)

// RemoteCandidate is what the cost model knows about one prefill endpoint.
type RemoteCandidate struct {
	Addr string
	// Rate is its measured prefill rate for this prompt length, tokens/s
	// (0: unknown).
	Rate float64
	// Queue is the time before it starts this request (from its health).
	Queue time.Duration
	// Ahead is how many fetches are in flight or waiting there; each is
	// taken to cost what this one does (the host serves them in turn).
	Ahead int
	// Cached is how many of the uncached tokens it already holds (prefix
	// hit on its side, from a prefix probe): it computes Uncached-Cached
	// but still sends all. Negative when it holds less of the prompt than
	// the decode side does (it recomputes that part too).
	Cached int
	// Goodput is the link's measured goodput to it, bytes/s (0: unknown).
	Goodput float64
	// Handshake is the fixed cost of one fetch: connect, hello, request.
	Handshake time.Duration
}

// RouteInput is one request's routing question. A pure value: Decide has
// no clock, no state and no I/O.
type RouteInput struct {
	Uncached int // prompt tokens the decode cache lacks (n-1-start)
	// Tail is how many of those the decode runner computes itself after a
	// remote fill (recurrent models); 0 for attention-only.
	Tail int
	// KVBytesPerToken on the wire, all layers, K and V.
	KVBytesPerToken float64
	LocalRate       float64       // tokens/s for this length (0: unknown)
	LocalQueue      time.Duration // own wait before a local prefill starts
	MinTokens       int           // remote_prefill_min_tokens: a floor
	// Hysteresis: remote must be predicted faster than local by this
	// fraction of local (e.g. 0.1) to be chosen.
	Hysteresis float64
	Remotes    []RemoteCandidate
}

// RouteDecision is the cost model's answer. Remote is the best remote
// candidate's predicted TTFT (0 when none was predicted).
type RouteDecision struct {
	Route    string
	Reason   string
	Endpoint string // best remote candidate (also when Route is local)
	Local    time.Duration
	Remote   time.Duration
	// Order ranks the remote candidates by predicted finish, best first:
	// the failover order when Route is remote.
	Order []string
	// Ahead is each candidate's fetches ahead (RemoteCandidate.Ahead), by
	// address: a fill's measured time is divided by 1+Ahead to learn the
	// host's rate, not its queue.
	Ahead map[string]int
}

func secs(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// PredictLocal is the predicted time to fill the cache locally.
func PredictLocal(in RouteInput) time.Duration {
	if in.LocalRate <= 0 {
		return 0
	}
	return in.LocalQueue + secs(float64(in.Uncached)/in.LocalRate)
}

// PredictRemote is the predicted time to fill the cache from c:
// handshake + queue + max(its prefill time, KV bytes / goodput) + the
// tail computed locally. Compute and transfer overlap (the KV streams as
// chunks finish), so the slower of the two sets the pace. 0 when a rate
// it needs is unknown.
func PredictRemote(in RouteInput, c RemoteCandidate) time.Duration {
	if c.Rate <= 0 || c.Goodput <= 0 || (in.Tail > 0 && in.LocalRate <= 0) {
		return 0
	}
	compute := float64(max(in.Uncached-in.Tail-c.Cached, 0)) / c.Rate
	wire := float64(in.Uncached-in.Tail) * in.KVBytesPerToken / c.Goodput
	t := c.Handshake + c.Queue + secs(float64(1+max(c.Ahead, 0))*math.Max(compute, wire))
	if in.Tail > 0 {
		t += secs(float64(in.Tail) / in.LocalRate)
	}
	return t
}

// Decide picks the route for one request.
func Decide(in RouteInput) RouteDecision {
	d := RouteDecision{Route: RouteLocal, Local: PredictLocal(in)}
	type scored struct {
		addr string
		t    time.Duration
	}
	var ranked, unknown []scored
	for _, c := range in.Remotes {
		if c.Ahead > 0 {
			if d.Ahead == nil {
				d.Ahead = map[string]int{}
			}
			d.Ahead[c.Addr] = c.Ahead
		}
		if t := PredictRemote(in, c); t > 0 {
			ranked = append(ranked, scored{c.Addr, t})
		} else {
			unknown = append(unknown, scored{c.Addr, 0})
		}
	}
	// Stable insertion sort: equal predictions keep the given order.
	for i := 1; i < len(ranked); i++ {
		for j := i; j > 0 && ranked[j].t < ranked[j-1].t; j-- {
			ranked[j], ranked[j-1] = ranked[j-1], ranked[j]
		}
	}
	for _, s := range append(ranked, unknown...) {
		d.Order = append(d.Order, s.addr)
	}
	if len(ranked) > 0 {
		d.Endpoint, d.Remote = ranked[0].addr, ranked[0].t
	} else if len(unknown) > 0 {
		d.Endpoint = unknown[0].addr
	}
	switch {
	case len(in.Remotes) == 0:
		d.Reason = ReasonNoEndpoint
	case in.Uncached < in.MinTokens:
		d.Reason = ReasonShort
	case d.Local == 0 || d.Remote == 0:
		// Blind: the floor alone (the old fixed threshold) decides.
		d.Route, d.Reason = RouteRemote, ReasonUnmeasured
	case float64(d.Remote) < float64(d.Local)*(1-in.Hysteresis):
		d.Route, d.Reason = RouteRemote, ReasonFaster
	case d.Remote < d.Local:
		d.Reason = ReasonHysteresis
	default:
		d.Reason = ReasonFaster
	}
	return d
}

// Rates holds online measurements: prefill rates by key ("local" or an
// endpoint) and prompt-length bucket, and link goodput by endpoint, each
// an exponentially weighted moving average. Safe for concurrent use.
type Rates struct {
	// Alpha is the weight of a new sample (default 0.3).
	Alpha   float64
	mu      sync.Mutex
	prefill map[string]map[int]float64
	goodput map[string]float64
}

// NewRates returns empty measurements.
func NewRates() *Rates {
	return &Rates{Alpha: 0.3, prefill: map[string]map[int]float64{}, goodput: map[string]float64{}}
}

// bucket is a prompt-length bucket: ⌈log2(tokens)⌉, at least 6 (64).
func bucket(tokens int) int {
	b := 6
	for 1<<b < tokens && b < 30 {
		b++
	}
	return b
}

func (r *Rates) ewma(old, x float64) float64 {
	if old == 0 {
		return x
	}
	a := r.Alpha
	if a <= 0 || a > 1 {
		a = 0.3
	}
	return (1-a)*old + a*x
}

// ObservePrefill records that key computed tokens in d.
func (r *Rates) ObservePrefill(key string, tokens int, d time.Duration) {
	if tokens <= 0 || d <= 0 {
		return
	}
	x := float64(tokens) / d.Seconds()
	r.mu.Lock()
	defer r.mu.Unlock()
	m := r.prefill[key]
	if m == nil {
		m = map[int]float64{}
		r.prefill[key] = m
	}
	b := bucket(tokens)
	m[b] = r.ewma(m[b], x)
}

// PrefillRate is key's rate for a prompt of this length: its bucket's, else
// the nearest measured bucket's (shorter first on ties); 0 when none.
func (r *Rates) PrefillRate(key string, tokens int) float64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	m := r.prefill[key]
	b := bucket(tokens)
	for d := 0; d <= 24; d++ {
		if v := m[b-d]; v > 0 {
			return v
		}
		if v := m[b+d]; v > 0 {
			return v
		}
	}
	return 0
}

// ObserveTransfer records that bytes reached us from addr in d (a real
// transfer or a link probe).
func (r *Rates) ObserveTransfer(addr string, bytes int64, d time.Duration) {
	if bytes <= 0 || d <= 0 {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.goodput[addr] = r.ewma(r.goodput[addr], float64(bytes)/d.Seconds())
}

// Goodput is addr's measured link goodput, bytes/s (0: unknown).
func (r *Rates) Goodput(addr string) float64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.goodput[addr]
}

// ForgetLink drops addr's goodput (after a reconnect: the path may have
// changed; the next probe measures it again).
func (r *Rates) ForgetLink(addr string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.goodput, addr)
}

// Router applies the cost model in a decode runner: it builds each
// request's RouteInput from the measured rates and learns from each fill.
type Router struct {
	Rates *Rates
	// KVBytesPerToken on the wire (all layers, K and V, wire dtype).
	KVBytesPerToken float64
	// Hysteresis: remote must be predicted this fraction faster (0: 0.05).
	Hysteresis float64
	// Handshake is the fixed cost of one fetch (0: 5 ms).
	Handshake time.Duration
	// Endpoints lists the prefill endpoints requests may go to now.
	Endpoints func() []string
	// Queue, when set, estimates how long an endpoint makes a new request
	// wait (from its health).
	Queue func(addr string) time.Duration
	// Ahead, when set, counts the fetches in flight or waiting at an
	// endpoint.
	Ahead func(addr string) int
	// PrefixHit, when set, asks an endpoint how many leading tokens of the
	// prompt its prefix cache holds (a prefix probe, PROTOCOL.md §18;
	// KVRemote.PrefixHit). DecidePrompt asks every endpoint at once and
	// waits at most ProbeTimeout; an endpoint that errs or is late counts
	// as holding what the decode side holds (the old assumption).
	PrefixHit func(ctx context.Context, addr string, prompt []int32) (int, error)
	// ProbeTimeout bounds the prefix probes of one decision (0: 50 ms).
	ProbeTimeout time.Duration

	mu      sync.Mutex
	pending map[string]int // remote decisions whose fill has not ended, by endpoint
}

// Input is the routing question for a fill of uncached tokens.
func (r *Router) Input(uncached, minTokens int) RouteInput {
	h := r.Hysteresis
	if h <= 0 {
		h = 0.05
	}
	hs := r.Handshake
	if hs <= 0 {
		hs = 5 * time.Millisecond
	}
	in := RouteInput{Uncached: uncached, KVBytesPerToken: r.KVBytesPerToken, MinTokens: minTokens, Hysteresis: h,
		LocalRate: r.Rates.PrefillRate("local", uncached)}
	if r.Endpoints != nil {
		for _, a := range r.Endpoints() {
			c := RemoteCandidate{Addr: a, Rate: r.Rates.PrefillRate(a, uncached), Goodput: r.Rates.Goodput(a), Handshake: hs}
			if r.Queue != nil {
				c.Queue = r.Queue(a)
			}
			if r.Ahead != nil {
				c.Ahead = r.Ahead(a)
			}
			in.Remotes = append(in.Remotes, c)
		}
	}
	return in
}

// Decide answers the routing question for a fill of uncached tokens.
func (r *Router) Decide(uncached, minTokens int) RouteDecision {
	return Decide(r.Input(uncached, minTokens))
}

// DecidePrompt is Decide for a fill of prompt[start:n-1], with each
// remote candidate's prefix hit from a prefix probe when PrefixHit is set
// and the fill is long enough to go remote at all. hits (nil without
// probes) is what each endpoint that answered holds, for the log.
//
// Decisions made at once (concurrent requests, all waiting on their
// probes) must not all pick the same host: a remote decision counts as a
// fetch ahead at its endpoint for later decisions until the caller calls
// done (when its fill ends), as the endpoint's in-flight count would once
// the fetch starts. done is never nil.
func (r *Router) DecidePrompt(ctx context.Context, prompt []int32, start, minTokens int) (d RouteDecision, hits map[string]int, done func()) {
	uncached := len(prompt) - 1 - start
	if r.PrefixHit != nil && uncached >= minTokens && r.Endpoints != nil {
		if addrs := r.Endpoints(); len(addrs) > 0 {
			hits = r.probeHits(ctx, addrs, prompt)
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	in := r.Input(uncached, minTokens)
	for i := range in.Remotes {
		c := &in.Remotes[i]
		if h, ok := hits[c.Addr]; ok {
			c.Cached = h - start
		}
		c.Ahead = max(c.Ahead, r.pending[c.Addr])
	}
	d = Decide(in)
	if d.Route != RouteRemote || d.Endpoint == "" {
		return d, hits, func() {}
	}
	if r.pending == nil {
		r.pending = map[string]int{}
	}
	addr := d.Endpoint
	r.pending[addr]++
	var once sync.Once
	return d, hits, func() {
		once.Do(func() {
			r.mu.Lock()
			defer r.mu.Unlock()
			if r.pending[addr]--; r.pending[addr] <= 0 {
				delete(r.pending, addr)
			}
		})
	}
}

// probeHits asks every endpoint at once, waiting at most ProbeTimeout.
func (r *Router) probeHits(ctx context.Context, addrs []string, prompt []int32) map[string]int {
	to := r.ProbeTimeout
	if to <= 0 {
		to = 50 * time.Millisecond
	}
	ctx, cancel := context.WithTimeout(ctx, to)
	defer cancel()
	type answer struct {
		addr string
		n    int
		err  error
	}
	ch := make(chan answer, len(addrs))
	for _, a := range addrs {
		go func(addr string) {
			n, err := r.PrefixHit(ctx, addr, prompt)
			ch <- answer{addr, n, err}
		}(a)
	}
	hits := map[string]int{}
	for range addrs {
		a := <-ch
		if a.err == nil {
			hits[a.addr] = a.n
		}
	}
	return hits
}

// ObserveLocal learns the local prefill rate from a local fill.
func (r *Router) ObserveLocal(tokens int, d time.Duration) {
	r.Rates.ObservePrefill("local", tokens, d)
}

// ObserveRemote learns from a remote fill: the endpoint's effective rate
// (request to done, so it includes the wire when the link is the slower
// stage; the max() in PredictRemote then still predicts that time), and
// its goodput, but only upward: a compute-bound transfer says nothing
// about the link, so only a probe (ObserveProbe) can lower it.
//
// ahead is how many fetches were ahead of this one there when it was
// routed: the measured time is divided by 1+ahead.
func (r *Router) ObserveRemote(addr string, tokens, ahead int, bytes int64, d time.Duration) {
	if addr == "" {
		return
	}
	r.Rates.ObservePrefill(addr, tokens, d/time.Duration(1+max(ahead, 0)))
	if d > 0 && float64(bytes)/d.Seconds() > r.Rates.Goodput(addr) {
		r.Rates.ObserveTransfer(addr, bytes, d)
	}
}

// ObserveProbe learns addr's link goodput from a link probe
// (kvwire.Client.Probe: payload bytes over the transfer time).
func (r *Router) ObserveProbe(addr string, bytes int64, transfer time.Duration) {
	r.Rates.ObserveTransfer(addr, bytes, transfer)
}

// SelectorAhead is a Router.Ahead over sel: the fetches ahead of a new one
// at an endpoint are this runner's own in flight there or, when larger,
// the endpoint's whole load as its health last reported
// (Selector.ReportLoad, from WatchLoad: waiting + running, which already
// counts this runner's fetches, so the two are not added).
func SelectorAhead(sel *kvwire.Selector) func(addr string) int {
	return func(addr string) int {
		for _, e := range sel.Status() {
			if e.Addr == addr {
				return max(e.InFlight, e.Waiting)
			}
		}
		return 0
	}
}
