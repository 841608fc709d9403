package decode

import (
	"slices"
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
