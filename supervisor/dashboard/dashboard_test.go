package dashboard

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/exo-pd/exo-pd/internal/sse"
	"github.com/exo-pd/exo-pd/supervisor/config"
	"github.com/exo-pd/exo-pd/supervisor/gateway"
	"github.com/exo-pd/exo-pd/supervisor/process"
)

// eventually polls cond until it holds or the deadline passes.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("never: %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// fakeJournal serves a decode runner's /exo/requests from records the test
// sets.
type fakeJournal struct {
	mu   sync.Mutex
	reqs []Request
	asks []uint64 // the since= of each call
}

func (f *fakeJournal) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != journalPath {
		http.NotFound(w, r)
		return
	}
	since, _ := strconv.ParseUint(r.URL.Query().Get("since"), 10, 64)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.asks = append(f.asks, since)
	out := []Request{}
	for _, q := range f.reqs {
		if q.Seq > since {
			out = append(out, q)
		}
	}
	json.NewEncoder(w).Encode(map[string]any{"model": "tiny", "requests": out,
		"links":         []map[string]any{{"endpoint": prefillEndpoint, "goodput_bytes_per_s": 1.1e9, "last_goodput_bytes_per_s": 0.9e9, "up": true, "kind": "loopback", "interface": "lo"}},
		"engine_memory": map[string]any{"active_bytes": 3 << 30, "cache_bytes": 1 << 30, "peak_bytes": 5 << 30, "sampled": time.Now()}})
}

func (f *fakeJournal) set(fn func(reqs []Request) []Request) {
	f.mu.Lock()
	f.reqs = fn(f.reqs)
	f.mu.Unlock()
}

var prefillEndpoint string // a's prefill runner's KV address

type testCluster struct {
	cfg      *config.Config
	a        *Dashboard // host a (127.0.0.1): the prefill runner; asked
	journal  *fakeJournal
	peerPort int
}

func listenOn(t *testing.T, addr string) net.Listener {
	t.Helper()
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Skipf("cannot listen on %s: %v", addr, err)
	}
	return l
}

// newCluster: hosts a (127.0.0.1, this one, prefill), b (127.0.0.2, a
// peer dashboard behind API key "k", decode with a fake journal) and c
// (127.0.0.3, nothing answering).
func newCluster(t *testing.T, key string) *testCluster {
	t.Helper()
	base := listenOn(t, "127.0.0.2:0") // b's decode runner listens on base (the first port)
	port := base.Addr().(*net.TCPAddr).Port
	text := fmt.Sprintf(`[cluster]
name = "dash"
insecure = true
runner_port_base = %d

[hosts.a]
address = "127.0.0.1"
backend = "cpu"

[hosts.b]
address = "127.0.0.2"
backend = "cpu"

[hosts.c]
address = "127.0.0.3"
backend = "cpu"

[[models]]
name = "tiny"
source = "/m"
decode = { hosts = ["b", "c"] }
prefill = { hosts = ["a"] }
`, port)
	path := filepath.Join(t.TempDir(), "cluster.toml")
	os.WriteFile(path, []byte(text), 0o644)
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	tc := &testCluster{cfg: cfg, journal: &fakeJournal{}}
	var decodeB, prefillA config.Runner
	for _, r := range cfg.AllRunners() {
		switch {
		case r.Host == "b" && r.Role == config.Decode:
			decodeB = r
		case r.Host == "a":
			prefillA = r
		}
	}
	if decodeB.Listen != base.Addr().String() {
		t.Fatalf("b's decode runner listens on %s, not %s", decodeB.Listen, base.Addr())
	}
	prefillEndpoint = prefillA.Listen
	js := &http.Server{Handler: tc.journal}
	go js.Serve(base)
	t.Cleanup(func() { js.Close() })

	// b: a peer supervisor's dashboard behind its API key.
	hb := NewHistory()
	bStatus := process.Status{Name: decodeB.Name, State: process.Ready, PID: 4242, Since: time.Now(),
		Health: &process.Health{Status: "ok", Waiting: 1, Running: 2, StageTransport: &process.StageTransport{Transport: "tcp", Reason: "cpu_backend"}}}
	hb.Observe(process.Status{Name: decodeB.Name, State: process.Starting})
	hb.Observe(bStatus)
	peerL := listenOn(t, "127.0.0.2:0")
	tc.peerPort = peerL.Addr().(*net.TCPAddr).Port
	b := New(Options{Port: tc.peerPort, History: hb, Local: func() Local {
		return Local{Config: cfg, Host: "b", Digest: "same", Started: time.Now(), Runners: []Runner{{Spec: decodeB, Status: bStatus}},
			Decode: map[string]gateway.Health{}}
	}})
	mux := http.NewServeMux()
	b.Register(mux)
	var k []byte
	if key != "" {
		k = []byte(key)
	}
	ps := &http.Server{Handler: gateway.NewAuth(mux, k, ShellPaths)}
	go ps.Serve(peerL)
	t.Cleanup(func() { ps.Close() })

	aStatus := process.Status{Name: prefillA.Name, State: process.Starting, PID: 17, Since: time.Now(),
		Health: &process.Health{Status: "loading", Progress: 0.25}}
	tc.a = New(Options{Port: tc.peerPort, Key: func() []byte { return []byte("k") }, Local: func() Local {
		return Local{Config: cfg, Host: "a", Digest: "same", Started: time.Now(), Runners: []Runner{{Spec: prefillA, Status: aStatus}}}
	}})
	return tc
}

func (tc *testCluster) state(t *testing.T) *State {
	t.Helper()
	return tc.a.State(context.Background())
}

// TestState: the answering host lists every host of the file (itself, a
// peer reached through its gateway with the API key, one down with the
// reason), each model's runners with their states and history, the links
// and the recent requests of the peer's decode runner with their prefill
// host; a request that finishes later is read again (its record updated),
// finished ones are not asked for again.
func TestState(t *testing.T) {
	tc := newCluster(t, "k")
	t0 := time.Now().Add(-time.Second)
	tc.journal.set(func([]Request) []Request {
		return []Request{
			{Seq: 1, ID: "tiny-1", Model: "tiny", Start: t0, Done: true, PromptTokens: 900, Route: "remote", Reason: "faster", Outcome: "ok",
				Endpoint: prefillEndpoint, KVBytes: 1 << 20, KVTransfer: 0.01, TTFT: 0.2, CompletionTokens: 9},
			{Seq: 2, ID: "tiny-2", Model: "tiny", Start: t0.Add(time.Millisecond), PromptTokens: 10, Route: "local"},
		}
	})
	st := tc.state(t)
	if st.Cluster != "dash" || st.Host != "a" || len(st.Hosts) != 3 {
		t.Fatalf("state: %+v", st)
	}
	a, b, c := st.Hosts[0], st.Hosts[1], st.Hosts[2]
	if !a.Up || !a.SameConfig || a.View == nil || a.View.Name != "a" || a.ClockOffset != 0 {
		t.Errorf("host a: %+v", a)
	}
	if !b.Up || !b.SameConfig || b.View == nil || b.View.Name != "b" || b.Error != "" ||
		math.Abs(b.ClockOffset) > b.ClockUncertainty+0.001 {
		t.Errorf("host b: %+v", b)
	}
	if c.Up || c.View != nil || !strings.Contains(c.Error, "no supervisor answering at 127.0.0.3:"+strconv.Itoa(tc.peerPort)) {
		t.Errorf("host c: %+v", c)
	}
	if len(st.Models) != 1 || st.Models[0].Decode != 2 || st.Models[0].ReadyDecode != 1 {
		t.Fatalf("models: %+v", st.Models)
	}
	byName := map[string]ModelRunner{}
	for _, r := range st.Models[0].Runners {
		byName[r.Host+"/"+r.Role] = r
	}
	if r := byName["b/decode"]; r.State != "ready" || r.Waiting != 1 || r.Running != 2 || r.PID != 4242 ||
		len(r.History) != 2 || r.History[0].State != "starting" || r.History[1].State != "ready" {
		t.Errorf("b's decode runner: %+v", r)
	}
	if tr := byName["b/decode"].StageTransport; tr == nil || *tr != (process.StageTransport{Transport: "tcp", Reason: "cpu_backend"}) {
		t.Errorf("b's decode runner's stage transport: %+v", tr)
	}
	if m := byName["b/decode"].EngineMemory; m == nil || m.Active != 3<<30 || m.Cache != 1<<30 || m.Peak != 5<<30 {
		t.Errorf("b's decode runner's engine memory: %+v", m)
	}
	if r := byName["c/decode"]; r.State != "unknown" {
		t.Errorf("c's decode runner: %+v", r)
	}
	if r := byName["a/prefill"]; r.State != "starting" || r.Health != "loading" || r.Progress != 0.25 || r.Address != prefillEndpoint {
		t.Errorf("a's prefill runner: %+v", r)
	}
	if len(st.Requests) != 2 || st.Requests[0].Key != "b/tiny-decode/4242/1" || st.Requests[0].Host != "b" ||
		st.Requests[0].PrefillHost != "a" || st.Requests[0].KVBytes != 1<<20 || st.Requests[1].Done {
		t.Errorf("requests: %+v", st.Requests)
	}
	if len(st.Links) != 1 || st.Links[0].DecodeHost != "b" || st.Links[0].PrefillHost != "a" || st.Links[0].Goodput != 1.1e9 ||
		st.Links[0].Kind != "loopback" || !st.Links[0].Up {
		t.Errorf("links: %+v", st.Links)
	}
	// The views carry no requests of their own (the State has them).
	if b.View.Requests != nil || b.View.Links != nil {
		t.Errorf("b's view keeps requests %v, links %v", b.View.Requests, b.View.Links)
	}

	// Request 2 finishes, request 3 arrives.
	tc.journal.set(func(rs []Request) []Request {
		rs[1].Done, rs[1].CompletionTokens = true, 4
		return append(rs, Request{Seq: 3, ID: "tiny-3", Model: "tiny", Start: t0.Add(2 * time.Millisecond), Done: true, Route: "local"})
	})
	eventually(t, "request 2 done and request 3 listed", func() bool {
		st := tc.state(t)
		return len(st.Requests) == 3 && st.Requests[1].Done && st.Requests[1].CompletionTokens == 4 && st.Requests[2].ID == "tiny-3"
	})
	eventually(t, "only new requests asked for once all are done", func() bool {
		tc.state(t)
		tc.journal.mu.Lock()
		defer tc.journal.mu.Unlock()
		return tc.journal.asks[len(tc.journal.asks)-1] == 3
	})
	tc.journal.mu.Lock()
	if tc.journal.asks[0] != 0 || tc.journal.asks[1] != 1 {
		t.Errorf("since= asked: %v (want 0, then 1 while request 2 runs)", tc.journal.asks)
	}
	tc.journal.mu.Unlock()
}

// TestPeerKey: a peer that refuses this host's API key is down, and the
// reason says to make the keys equal.
func TestPeerKey(t *testing.T) {
	tc := newCluster(t, "other")
	st := tc.state(t)
	if b := st.Hosts[1]; b.Up || !strings.Contains(b.Error, "api_key_file") {
		t.Errorf("host b: %+v", b)
	}
	for _, r := range st.Models[0].Runners {
		if r.Host == "b" && r.State != "unknown" {
			t.Errorf("b's runner when b is unreachable: %+v", r)
		}
	}
}

// TestEvents: /exo/events sends a state event (without requests) each
// period, and a requests event with what is new or changed since the last
// one this client got: everything at first, then only the new request.
func TestEvents(t *testing.T) {
	tc := newCluster(t, "k")
	tc.a.o.Every = 20 * time.Millisecond
	t0 := time.Now()
	tc.journal.set(func([]Request) []Request {
		return []Request{{Seq: 1, ID: "tiny-1", Start: t0, Done: true}, {Seq: 2, ID: "tiny-2", Start: t0.Add(time.Millisecond), Done: true}}
	})
	srv := httptest.NewServer(http.HandlerFunc(tc.a.serveEvents))
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("content type %q", ct)
	}
	type event struct {
		name string
		data []byte
	}
	events := make(chan event)
	go func() {
		defer close(events)
		rd := sse.NewReader(resp.Body)
		for {
			e, err := rd.Next()
			if err != nil {
				return
			}
			events <- event{e.Type, []byte(e.Data)}
		}
	}()
	next := func() event {
		t.Helper()
		select {
		case e, ok := <-events:
			if !ok {
				t.Fatal("stream ended")
			}
			return e
		case <-time.After(20 * time.Second):
			t.Fatal("no event")
		}
		return event{}
	}
	e := next()
	var st State
	if err := json.Unmarshal(e.data, &st); e.name != "state" || err != nil || len(st.Hosts) != 3 || st.Requests != nil {
		t.Fatalf("first event %s: %v %s", e.name, err, e.data)
	}
	e = next()
	var reqs []Request
	if err := json.Unmarshal(e.data, &reqs); e.name != "requests" || err != nil || len(reqs) != 2 {
		t.Fatalf("second event %s: %v %s", e.name, err, e.data)
	}
	tc.journal.set(func(rs []Request) []Request {
		return append(rs, Request{Seq: 3, ID: "tiny-3", Start: t0.Add(2 * time.Millisecond), Done: true})
	})
	for {
		e := next()
		if e.name != "requests" {
			continue
		}
		reqs = nil
		if err := json.Unmarshal(e.data, &reqs); err != nil || len(reqs) != 1 || reqs[0].ID != "tiny-3" {
			t.Fatalf("requests after one more: %v %s", err, e.data)
		}
		break
	}
}

// TestPage: the page and its files come with the Content-Security-Policy;
// the HTML has no inline script or handler and loads only its own files;
// the script never puts text into the page as markup.
func TestPage(t *testing.T) {
	d := New(Options{Local: func() Local { return Local{} }})
	mux := http.NewServeMux()
	d.Register(mux)
	srv := httptest.NewServer(mux)
	defer srv.Close()
	get := func(path string) (*http.Response, string) {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	for _, tt := range []struct{ path, ctype string }{
		{"/", "text/html"}, {"/dashboard/app.js", "javascript"}, {"/dashboard/app.css", "text/css"},
	} {
		resp, body := get(tt.path)
		csp := resp.Header.Get("Content-Security-Policy")
		if resp.StatusCode != 200 || !strings.Contains(resp.Header.Get("Content-Type"), tt.ctype) || len(body) == 0 ||
			!strings.Contains(csp, "script-src 'self'") || strings.Contains(csp, "unsafe") || resp.Header.Get("X-Content-Type-Options") != "nosniff" {
			t.Errorf("%s: %d %q CSP %q", tt.path, resp.StatusCode, resp.Header.Get("Content-Type"), csp)
		}
	}
	if resp, _ := get("/dashboard/nope.js"); resp.StatusCode != 404 {
		t.Errorf("unknown file: %d", resp.StatusCode)
	}
	_, html := get("/")
	for _, m := range regexp.MustCompile(`(?is)<script[^>]*>`).FindAllString(html, -1) {
		if !strings.Contains(m, `src="/dashboard/`) {
			t.Errorf("script tag %q", m)
		}
	}
	if regexp.MustCompile(`(?i)\son[a-z]+=`).MatchString(html) || regexp.MustCompile(`(?i)(src|href)="(https?:)?//`).MatchString(html) {
		t.Error("page has an inline handler or loads from elsewhere")
	}
	_, js := get("/dashboard/app.js")
	for _, bad := range []string{"innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function"} {
		if strings.Contains(js, bad) {
			t.Errorf("app.js uses %s", bad)
		}
	}
}

// TestHistory: a state is recorded once per change, with the exit that led
// to a backoff, and only the latest historyLen are kept.
func TestHistory(t *testing.T) {
	h := NewHistory()
	h.Observe(process.Status{Name: "r", State: process.Starting})
	h.Observe(process.Status{Name: "r", State: process.Starting})
	h.Observe(process.Status{Name: "r", State: process.Ready})
	h.Observe(process.Status{Name: "r", State: process.Backoff, Restarts: 1, LastExit: "signal: killed"})
	got := h.Of("r")
	if len(got) != 3 || got[2].State != "backoff" || got[2].Reason != "signal: killed" || got[2].Restarts != 1 || got[0].At.IsZero() {
		t.Fatalf("%+v", got)
	}
	for i := range 2 * historyLen {
		h.Observe(process.Status{Name: "r", State: []process.State{process.Starting, process.Ready}[i%2]})
	}
	if n := len(h.Of("r")); n != historyLen {
		t.Errorf("%d kept", n)
	}
	if (*History)(nil).Of("r") != nil || len(h.Of("other")) != 0 {
		t.Error("unknown runner has a history")
	}
}

// TestLoadETA: the time left loading comes from the rate of the current
// phase's bytes since its first sample (restarting at a new phase), else
// from the overall progress; nothing before a second sample or once ready.
func TestLoadETA(t *testing.T) {
	d := New(Options{Local: func() Local { return Local{} }})
	t0 := time.Now()
	at := func(sec float64, h *process.Health) float64 {
		return d.eta(Runner{Spec: config.Runner{Name: "r"}, Status: process.Status{PID: 1, Health: h}}, t0.Add(time.Duration(sec*float64(time.Second))))
	}
	bytes := func(phase string, done, total int64) *process.Health {
		return &process.Health{Status: "loading", Phase: phase, DoneBytes: done, TotalBytes: total, Progress: 0.5 * float64(done) / float64(total)}
	}
	for _, tt := range []struct {
		sec  float64
		h    *process.Health
		want float64
	}{
		{0, bytes("download", 100, 1000), 0},
		{2, bytes("download", 300, 1000), 7},  // 100 B/s, 700 B left
		{4, bytes("download", 500, 1000), 5},  // still 100 B/s
		{5, bytes("load", 10, 100), 0},        // a new phase: a new first sample
		{6, bytes("load", 30, 100), 3.5},      // 20 B/s, 70 B left
		{7, &process.Health{Status: "ok"}, 0}, // ready: forgotten
		{8, &process.Health{Status: "loading", Progress: 0.2}, 0},
		{10, &process.Health{Status: "loading", Progress: 0.4}, 6}, // 0.1/s, 0.6 left
	} {
		if got := at(tt.sec, tt.h); math.Abs(got-tt.want) > 1e-9 {
			t.Errorf("at %vs, %+v: eta %v, want %v", tt.sec, tt.h, got, tt.want)
		}
	}
}
