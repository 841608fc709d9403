package decode

import (
	"context"
	"errors"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"
)

func TestDecide(t *testing.T) {
	const llama8B = 128 << 10 // bf16 KV bytes per token
	spark := RemoteCandidate{Addr: "spark", Rate: 5600, Goodput: 1.17e9, Handshake: 5 * time.Millisecond}
	base := RouteInput{KVBytesPerToken: llama8B, LocalRate: 1500, MinTokens: 256, Hysteresis: 0.1}
	with := func(f func(*RouteInput)) RouteInput {
		in := base
		in.Remotes = []RemoteCandidate{spark}
		f(&in)
		return in
	}
	cases := []struct {
		name     string
		in       RouteInput
		route    string
		reason   string
		endpoint string
		order    []string
	}{
		{"no endpoints", func() RouteInput { in := base; in.Uncached = 8000; return in }(), RouteLocal, ReasonNoEndpoint, "", nil},
		{"below the floor", with(func(in *RouteInput) { in.Uncached = 200 }), RouteLocal, ReasonShort, "spark", []string{"spark"}},
		// 8k on 10GbE: local 5.33 s; remote max(1.46 s compute, 0.92 s wire) + 5 ms.
		{"8k Llama-8B over 10GbE", with(func(in *RouteInput) { in.Uncached = 8000 }), RouteRemote, ReasonFaster, "spark", []string{"spark"}},
		// Wi-Fi: 8000×128 KiB / 117 MB/s = 8.96 s > 5.33 s local.
		{"8k over Wi-Fi", with(func(in *RouteInput) { in.Uncached = 8000; in.Remotes[0].Goodput = 1.17e8 }), RouteLocal, ReasonFaster, "spark", []string{"spark"}},
		// Loaded host: 5 s queue + 1.46 s > 5.33 s.
		{"loaded prefill host", with(func(in *RouteInput) { in.Uncached = 8000; in.Remotes[0].Queue = 5 * time.Second }), RouteLocal, ReasonFaster, "spark", []string{"spark"}},
		// Remote 3.5 + 1.43 + 0.005 = 4.94 s vs local 5.33 s: faster, but by less than 10 %.
		{"within hysteresis", with(func(in *RouteInput) {
			in.Uncached = 8000
			in.Remotes[0].Queue = 3500 * time.Millisecond
		}), RouteLocal, ReasonHysteresis, "spark", []string{"spark"}},
		{"unmeasured local rate: the floor decides", with(func(in *RouteInput) { in.Uncached = 300; in.LocalRate = 0 }), RouteRemote, ReasonUnmeasured, "spark", []string{"spark"}},
		{"unmeasured link: the floor decides", with(func(in *RouteInput) { in.Uncached = 300; in.Remotes[0].Goodput = 0 }), RouteRemote, ReasonUnmeasured, "spark", []string{"spark"}},
		{"two hosts, the idle one first", with(func(in *RouteInput) {
			in.Uncached = 8000
			busy := spark
			busy.Addr, busy.Queue = "busy", time.Second
			idle := spark
			idle.Addr = "idle"
			in.Remotes = []RemoteCandidate{busy, idle}
		}), RouteRemote, ReasonFaster, "idle", []string{"idle", "busy"}},
		{"prefix hit on the second host", with(func(in *RouteInput) {
			in.Uncached = 16000
			hit := spark
			hit.Addr, hit.Cached = "hit", 12000
			in.Remotes = []RemoteCandidate{spark, hit}
		}), RouteRemote, ReasonFaster, "hit", []string{"hit", "spark"}},
		{"two hosts, fewer fetches ahead first", with(func(in *RouteInput) {
			in.Uncached = 8000
			busy := spark
			busy.Addr, busy.Ahead = "busy", 2
			idle := spark
			idle.Addr, idle.Ahead = "idle", 1
			in.Remotes = []RemoteCandidate{busy, idle}
		}), RouteRemote, ReasonFaster, "idle", []string{"idle", "busy"}},
		{"unknown host ranked last", with(func(in *RouteInput) {
			in.Uncached = 8000
			u := spark
			u.Addr, u.Rate = "new", 0
			in.Remotes = []RemoteCandidate{u, spark}
		}), RouteRemote, ReasonFaster, "spark", []string{"spark", "new"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := Decide(c.in)
			if d.Route != c.route || d.Reason != c.reason || d.Endpoint != c.endpoint || !slices.Equal(d.Order, c.order) {
				t.Fatalf("got %s/%s endpoint %q order %v (local %v remote %v), want %s/%s %q %v",
					d.Route, d.Reason, d.Endpoint, d.Order, d.Local, d.Remote, c.route, c.reason, c.endpoint, c.order)
			}
		})
	}
}

func TestPredict(t *testing.T) {
	in := RouteInput{Uncached: 8000, KVBytesPerToken: 128 << 10, LocalRate: 1600, LocalQueue: time.Second}
	if got, want := PredictLocal(in), 6*time.Second; got != want {
		t.Errorf("local %v, want %v", got, want)
	}
	c := RemoteCandidate{Rate: 8000, Goodput: float64(128<<10) * 4000, Handshake: 10 * time.Millisecond, Queue: time.Second}
	// wire 2 s > compute 1 s: the link sets the pace.
	if got, want := PredictRemote(in, c), 3010*time.Millisecond; got != want {
		t.Errorf("remote %v, want %v", got, want)
	}
	in.Tail = 1600 // 6400 over the wire (1.6 s) vs 0.8 s compute, then 1 s local
	if got, want := PredictRemote(in, c), 3610*time.Millisecond; got != want {
		t.Errorf("remote with tail %v, want %v", got, want)
	}
	c.Cached = 7000
	in.Tail = 0
	if got, want := PredictRemote(in, c), 3010*time.Millisecond; got != want {
		t.Errorf("remote with prefix hit %v, want %v (the hit saves compute, not wire)", got, want)
	}
}

func TestRates(t *testing.T) {
	r := NewRates()
	if r.PrefillRate("local", 1000) != 0 || r.Goodput("a") != 0 {
		t.Fatal("empty rates are not zero")
	}
	r.ObservePrefill("local", 1000, time.Second) // bucket 10
	if got := r.PrefillRate("local", 1000); got != 1000 {
		t.Fatalf("first sample %v, want 1000", got)
	}
	r.ObservePrefill("local", 1000, 500*time.Millisecond)
	if got := r.PrefillRate("local", 900); got != 0.7*1000+0.3*2000 {
		t.Fatalf("ewma %v, want 1300", got)
	}
	r.ObservePrefill("local", 16000, 16*time.Second) // bucket 14
	if got := r.PrefillRate("local", 30000); got != 1000 {
		t.Fatalf("nearest bucket above: %v, want the 16k bucket's 1000", got)
	}
	if got := r.PrefillRate("local", 64); got != 1300 {
		t.Fatalf("nearest bucket below: %v, want 1300", got)
	}
	if got := r.PrefillRate("spark", 1000); got != 0 {
		t.Fatalf("other key %v, want 0", got)
	}
	r.ObservePrefill("local", 0, time.Second)
	r.ObservePrefill("local", 10, 0)
	r.ObserveTransfer("a", 1e9, time.Second)
	r.ObserveTransfer("a", 0, time.Second)
	if got := r.Goodput("a"); got != 1e9 {
		t.Fatalf("goodput %v", got)
	}
	rt := &Router{Rates: r}
	rt.ObserveRemote("b", 1000, 3, 1<<20, 4*time.Second) // 3 ahead: 1 s of its own
	if got := r.PrefillRate("b", 1000); got != 1000 {
		t.Fatalf("remote rate with 3 ahead %v, want 1000", got)
	}
	r.ForgetLink("a")
	if r.Goodput("a") != 0 {
		t.Fatal("ForgetLink kept the goodput")
	}
}

// TestDecidePromptProbesPrefixHits: with PrefixHit set the router asks
// every endpoint at once and ranks by the work each has left: the host
// that holds the conversation's prefix wins over an equal one that does
// not; an endpoint that errs or answers after ProbeTimeout counts as
// holding what the decode side holds; below the floor nothing is probed.
func TestDecidePromptProbesPrefixHits(t *testing.T) {
	rates := NewRates()
	for _, a := range []string{"local", "cold", "warm", "late", "err"} {
		rates.ObservePrefill(a, 4000, 2*time.Second) // 2,000 tok/s everywhere
	}
	for _, a := range []string{"cold", "warm", "late", "err"} {
		rates.ObserveTransfer(a, 1e9, time.Second) // 1 GB/s links
	}
	prompt := make([]int32, 4001)
	var mu sync.Mutex
	asked := map[string]int{}
	r := &Router{Rates: rates, KVBytesPerToken: 1000, ProbeTimeout: 100 * time.Millisecond,
		PrefixHit: func(ctx context.Context, addr string, p []int32) (int, error) {
			mu.Lock()
			asked[addr]++
			mu.Unlock()
			switch addr {
			case "warm":
				return 3500, nil
			case "late":
				select {
				case <-time.After(5 * time.Second):
					return 4000, nil
				case <-ctx.Done():
					return 0, ctx.Err()
				}
			case "err":
				return 0, errors.New("no probes here")
			}
			return 0, nil
		}}
	r.Endpoints = func() []string { return []string{"cold", "late", "err", "warm"} }
	t0 := time.Now()
	d, hits, done := r.DecidePrompt(context.Background(), prompt, 0, 256)
	done()
	if el := time.Since(t0); el > 3*time.Second {
		t.Fatalf("decision waited %v for a late endpoint", el)
	}
	if d.Route != RouteRemote || d.Endpoint != "warm" || d.Order[0] != "warm" {
		t.Fatalf("decision %+v, want remote to warm first", d)
	}
	if want := map[string]int{"cold": 0, "warm": 3500}; !maps.Equal(hits, want) {
		t.Fatalf("hits %v, want %v", hits, want)
	}
	// A second turn: the decode side holds 3,000 tokens; "cold" would
	// recompute them (Cached = -3000), "warm" holds 3,500 of them.
	d, _, done = r.DecidePrompt(context.Background(), prompt, 3000, 256)
	done()
	if d.Order[0] != "warm" {
		t.Fatalf("second turn order %v, want warm first", d.Order)
	}
	if in := r.Input(1000, 256); PredictRemote(in, RemoteCandidate{Rate: 2000, Goodput: 1e9, Cached: -3000}) <= PredictRemote(in, in.Remotes[0]) {
		t.Fatal("a host that lacks the decode side's prefix is not predicted slower")
	}
	before := len(asked)
	asked = map[string]int{}
	if _, hits, _ := r.DecidePrompt(context.Background(), prompt[:100], 0, 256); hits != nil || len(asked) != 0 {
		t.Fatalf("below the floor: probed %v (hits %v), had probed %d endpoints before", asked, hits, before)
	}
}

// TestDecidePromptCountsPendingDecisions: remote decisions not yet done
// count as fetches ahead, so concurrent decisions spread over equal hosts
// instead of all taking the first; done releases them.
func TestDecidePromptCountsPendingDecisions(t *testing.T) {
	rates := NewRates()
	for _, a := range []string{"a", "b"} {
		rates.ObservePrefill(a, 4000, 2*time.Second)
	}
	rates.ObservePrefill("local", 4000, 40*time.Second) // local 100 tok/s: remote wins
	for _, a := range []string{"a", "b"} {
		rates.ObserveTransfer(a, 1e9, time.Second)
	}
	r := &Router{Rates: rates, KVBytesPerToken: 1000, Endpoints: func() []string { return []string{"a", "b"} }}
	prompt := make([]int32, 4001)
	var dones []func()
	count := map[string]int{}
	for range 4 {
		d, _, done := r.DecidePrompt(context.Background(), prompt, 0, 256)
		if d.Route != RouteRemote {
			t.Fatalf("decision %+v, want remote", d)
		}
		count[d.Endpoint]++
		dones = append(dones, done)
	}
	if count["a"] != 2 || count["b"] != 2 {
		t.Fatalf("4 pending decisions went %v, want 2 and 2", count)
	}
	for _, f := range dones {
		f()
		f() // idempotent
	}
	if len(r.pending) != 0 {
		t.Fatalf("pending after done: %v", r.pending)
	}
}
