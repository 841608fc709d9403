package stage_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/exo-pd/exo-pd/internal/testutil"
	"github.com/exo-pd/exo-pd/runners/decode"
	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/engine/backend"
	"github.com/exo-pd/exo-pd/runners/engine/testmodel"
	"github.com/exo-pd/exo-pd/runners/gen"
	"github.com/exo-pd/exo-pd/runners/kvwire"
	"github.com/exo-pd/exo-pd/runners/metrics"
	"github.com/exo-pd/exo-pd/runners/prefill"
	"github.com/exo-pd/exo-pd/runners/stage"
	dto "github.com/prometheus/client_model/go"
)

// emitter collects a generation's text and logprobs.
type emitter struct {
	text strings.Builder
	lps  []float64
}

func (e *emitter) Start(int) error { return nil }
func (e *emitter) Text(s string, lp *gen.TokenLogprob) error {
	e.text.WriteString(s)
	if lp != nil {
		e.lps = append(e.lps, lp.Logprob)
	}
	return nil
}

func (e *emitter) String() string { return fmt.Sprintf("%q %v", e.text.String(), e.lps) }

// pipeline is N stages of one model over loopback TCP, stage 0 a
// decode.Server over the Ring.
type pipeline struct {
	srv     *decode.Server
	met     *metrics.Runner // stage 0's decode metrics
	ring    *stage.Ring
	nodes   []*stage.Node
	cancels []context.CancelFunc // per stage
	addrs   []string             // each stage's --stage-listen
	start   func(i int)          // (re)starts stage i ≥ 1
	done    []chan struct{}
}

// pipeOpts are a test pipeline's options.
type pipeOpts struct {
	secret   []byte
	maxBatch int
	pace     float64 // each stage's TestPace
	lanes    int     // RingConfig.Lanes
	prefill  string  // a prefill runner's KV-wire address: every stage fills remotely from it
	onlyZero bool    // only stage 0 is given prefill; the others make their client from the Fill
	metrics  *stage.Metrics
	// group: the stages carry their hidden states over chanGroup (an
	// in-process stand-in for MLX's ring), except stage noGroup (> 0).
	group   bool
	noGroup int
	whole   bool // the Groups are Whole (the supervisor's hostfile)
	// hangJoin (> 0): that stage's Join never returns (a neighbour died
	// before joining), bounded by a 1 s JoinTimeout.
	hangJoin int
	lost     chan error // told each stage's OnLost
	// health, when set, is each stage's own condition (its tensor
	// group's Health; nil entries: none).
	health []func() error
}

func (po pipeOpts) healthOf(i int) func() error {
	if i < len(po.health) {
		return po.health[i]
	}
	return nil
}

func newPipeline(t testing.TB, dir string, cuts []int, po pipeOpts) *pipeline {
	t.Helper()
	ctx := context.Background()
	b, err := backend.Open("cpu", backend.Options{})
	if err != nil {
		t.Fatal(err)
	}
	whole, err := engine.Load(ctx, dir, b, engine.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	L := whole.Info().Layers
	whole.Close()
	bounds := append(append([]int{0}, cuts...), L)
	N := len(bounds) - 1
	p := &pipeline{cancels: make([]context.CancelFunc, N), done: make([]chan struct{}, N), nodes: make([]*stage.Node, N)}
	models := make([]*engine.Model, N)
	links := make([]stage.LinkConfig, N)
	for i := range N {
		// A backend per stage, as each stage's process has its own (a cpu
		// backend runs one step at a time).
		b, err := backend.Open("cpu", backend.Options{Threads: 1})
		if err != nil {
			t.Fatal(err)
		}
		m, err := engine.Load(ctx, dir, b, engine.LoadOptions{Layers: engine.LayerRange{Start: bounds[i], End: bounds[i+1]}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close() })
		models[i] = m
		links[i] = stage.LinkConfig{Stage: i, Stages: N, First: bounds[i], End: bounds[i+1], Layers: L, Hidden: m.Config().Hidden,
			Fingerprint: m.Fingerprint(), Secret: po.secret}
		p.addrs = append(p.addrs, testutil.Addr(t))
	}
	log := slog.New(slog.DiscardHandler)
	if testing.Verbose() {
		log = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	groups := make([]*stage.Group, N)
	if po.group {
		pipes := make([]chan []float32, N) // pipes[i]: stage i to i+1
		for i := range pipes {
			pipes[i] = make(chan []float32, 64)
		}
		for i := range N {
			if i == po.noGroup && i > 0 {
				continue
			}
			b := models[i].Backend()
			c := &chanCarrier{b: b, out: pipes[i], in: pipes[(i+N-1)%N]}
			groups[i] = &stage.Group{Transport: "chan", Whole: po.whole, Join: func() (engine.Carrier, error) { return c, nil },
				OnLost: func(err error) {
					if po.lost != nil {
						po.lost <- err
					}
				}}
			if po.hangJoin > 0 && i == po.hangJoin {
				never := make(chan struct{})
				t.Cleanup(func() { close(never) })
				groups[i].Join = func() (engine.Carrier, error) { <-never; return nil, errors.New("never") }
				groups[i].JoinTimeout = time.Second
			}
		}
	}
	listen := func(i int) net.Listener {
		var l net.Listener
		testutil.Eventually(t, func() bool { l, err = net.Listen("tcp", p.addrs[i]); return err == nil }, 10*time.Second, "listen %s", p.addrs[i])
		return l
	}
	p.start = func(i int) {
		st, err := decode.NewSetup("m", models[i], dir, gen.Defaults{})
		if err != nil {
			t.Fatal(err)
		}
		var picks *decode.Options
		if i == N-1 {
			picks = &st.Options
		}
		nc := stage.NodeConfig{Name: "m", Link: links[i], Model: models[i], Listen: listen(i), Next: p.addrs[(i+1)%N],
			Picks: picks, Logger: log, TestPace: po.pace, Metrics: po.metrics, Group: groups[i], Health: po.healthOf(i)}
		if po.onlyZero {
			nc.RemoteFor = func(ep string) decode.Remote { return remoteFor(t, models[i], ep) }
		} else {
			nc.Remote = remoteFor(t, models[i], po.prefill)
		}
		n, err := stage.NewNode(nc)
		if err != nil {
			t.Fatal(err)
		}
		cctx, cancel := context.WithCancel(ctx)
		p.cancels[i], p.nodes[i], p.done[i] = cancel, n, make(chan struct{})
		go func() { defer close(p.done[i]); n.Run(cctx) }()
	}
	ring, err := stage.NewRing(stage.RingConfig{Name: "m", Link: links[0], Model: models[0], Listen: listen(0), Next: p.addrs[1],
		StepTimeout: 20 * time.Second, Logger: log, TestPace: po.pace, Metrics: po.metrics, Lanes: po.lanes, Group: groups[0], Health: po.healthOf(0)})
	if err != nil {
		t.Fatal(err)
	}
	p.ring = ring
	rctx, cancel := context.WithCancel(ctx)
	p.cancels[0], p.done[0] = cancel, make(chan struct{})
	go func() { defer close(p.done[0]); ring.Run(rctx) }()
	for i := 1; i < N; i++ {
		p.start(i)
	}
	st, err := decode.NewSetup("m", ring, dir, gen.Defaults{})
	if err != nil {
		t.Fatal(err)
	}
	o := st.Options
	o.MaxBatch, o.Logger = po.maxBatch, log
	p.met = metrics.New("decode")
	o.Metrics = p.met
	if po.prefill != "" {
		o.Remote, o.RemoteMinTokens = &stage.Remote{Ring: ring, Local: remoteFor(t, models[0], po.prefill)}, 16
	}
	p.srv = decode.New(o)
	t.Cleanup(func() {
		p.srv.Close()
		for i := range N {
			p.cancels[i]()
			<-p.done[i]
		}
	})
	if po.hangJoin == 0 { // else the ring comes up only if the join is not bounded
		testutil.Eventually(t, ring.Healthy, 20*time.Second, "the ring is up")
	}
	return p
}

// single is a one-process decode Server over the whole model.
func single(t *testing.T, dir string, maxBatch int) *decode.Server {
	b, err := backend.Open("cpu", backend.Options{})
	if err != nil {
		t.Fatal(err)
	}
	m, err := engine.Load(context.Background(), dir, b, engine.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	st, err := decode.NewSetup("m", m, dir, gen.Defaults{})
	if err != nil {
		t.Fatal(err)
	}
	o := st.Options
	o.MaxBatch, o.Logger = maxBatch, slog.New(slog.DiscardHandler)
	s := decode.New(o)
	t.Cleanup(func() { s.Close(); m.Close() })
	return s
}

func requests() []*gen.Request {
	seeded := gen.Sampling{Temperature: 0.9, TopP: 0.95, Seed: 7, SeedSet: true, RepetitionPenalty: 1.1}
	return []*gen.Request{
		{Prompt: "The quick brown fox", MaxTokens: 12, IgnoreEOS: true, Logprobs: true, TopLogprobs: 2},
		{Chat: true, AddGenerationPrompt: true, Messages: []gen.Message{{Role: "user", Content: "hello there, how are you?"}}, MaxTokens: 10, IgnoreEOS: true, Sampling: seeded},
		{Prompt: strings.Repeat("one two three four ", 30), MaxTokens: 8, IgnoreEOS: true, Sampling: gen.Sampling{Temperature: 1.2, Seed: 3, SeedSet: true, TopK: 20}},
		{Prompt: "a", MaxTokens: 6, IgnoreEOS: true},
	}
}

func generate(t *testing.T, g gen.Generator, reqs []*gen.Request, concurrent bool) []string {
	t.Helper()
	out := make([]string, len(reqs))
	errs := make([]error, len(reqs))
	var wg sync.WaitGroup
	for i, r := range reqs {
		run := func() {
			var em emitter
			_, errs[i] = g.Generate(context.Background(), r, &em)
			out[i] = em.String()
		}
		if concurrent {
			wg.Add(1)
			go func() { defer wg.Done(); run() }()
		} else {
			run()
		}
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
	}
	return out
}

func writeModels(t *testing.T) map[string]string {
	dirs := map[string]string{}
	for _, s := range []testmodel.Spec{{Arch: "llama", Seed: 1, Layers: 3}, {Arch: "qwen3moe", Seed: 2, Layers: 3}, {Arch: "gemma3", Seed: 7, Layers: 4}} {
		d := t.TempDir()
		if err := testmodel.Write(d, s); err != nil {
			t.Fatal(err)
		}
		dirs[s.Arch] = d
	}
	dirs["qwen3_next"] = filepath.Join("..", "engine", "testdata", "reference", "qwen3_next")
	return dirs
}

// TestPipelineGivesSingleRunnerTokens: 2- and 3-stage pipelines over
// loopback TCP (authenticated), stage 0 a decode Server over the Ring,
// give a one-process decode Server's text and logprobs at temperature 0,
// with seeded sampling and penalties, for dense, MoE, sliding-window and
// Gated DeltaNet models, one request at a time and four at once; and a
// second chat turn reuses the prefix cache through the pipeline.
func TestPipelineGivesSingleRunnerTokens(t *testing.T) {
	for arch, dir := range writeModels(t) {
		want := generate(t, single(t, dir, 4), requests(), false)
		for _, cuts := range [][]int{{1}, {1, 2}} {
			t.Run(fmt.Sprintf("%s/%d-stages", arch, len(cuts)+1), func(t *testing.T) {
				p := newPipeline(t, dir, cuts, pipeOpts{secret: []byte("s3cret"), maxBatch: 4})
				got := generate(t, p.srv, requests(), false)
				for i := range want {
					if got[i] != want[i] {
						t.Errorf("request %d alone: pipeline %s, one runner %s", i, got[i], want[i])
					}
				}
				got = generate(t, p.srv, requests(), true)
				for i := range want {
					if got[i] != want[i] {
						t.Errorf("request %d of 4 at once: pipeline %s, one runner %s", i, got[i], want[i])
					}
				}
				// The same requests again: prefix-cache hits truncate every
				// stage's cache (or reset it where a layer cannot go back).
				got = generate(t, p.srv, requests()[:2], false)
				for i := range got {
					if got[i] != want[i] {
						t.Errorf("request %d again: pipeline %s, one runner %s", i, got[i], want[i])
					}
				}
			})
		}
	}
}

// TestStageKilledMidRequest: a stage that goes away mid-generation ends
// the request with an error naming the ring (no hang), stage 0 reports
// unhealthy until the stage is back, and then the next request succeeds
// with the single runner's tokens.
func TestStageKilledMidRequest(t *testing.T) {
	dir := writeModels(t)["llama"]
	want := generate(t, single(t, dir, 1), requests()[:1], false)
	p := newPipeline(t, dir, []int{1, 2}, pipeOpts{maxBatch: 1})
	req := *requests()[0]
	req.MaxTokens = 1 << 20
	em := &killer{at: 5, kill: func() { p.cancels[1](); <-p.done[1] }}
	_, err := p.srv.Generate(context.Background(), &req, em)
	if !errors.Is(err, stage.ErrDown) {
		t.Fatalf("a generation whose stage 1 was stopped: %v, want ErrDown", err)
	}
	if p.ring.Healthy() {
		t.Fatal("the ring reports healthy with stage 1 gone")
	}
	p.start(1)
	testutil.Eventually(t, p.ring.Healthy, 20*time.Second, "the ring is back")
	got := generate(t, p.srv, requests()[:1], false)
	if got[0] != want[0] {
		t.Errorf("after the ring came back: %s, want %s", got[0], want[0])
	}
}

// killer is an emitter that runs kill once at its at-th token.
type killer struct {
	emitter
	n, at int
	kill  func()
}

func (k *killer) Text(s string, lp *gen.TokenLogprob) error {
	if k.n++; k.n == k.at {
		k.kill()
	}
	return k.emitter.Text(s, lp)
}

// TestWrongSecretFailsClosed: a stage with another secret, or none, never
// joins the ring: the dial is refused with ErrAuth and the ring stays
// down.
func TestWrongSecretFailsClosed(t *testing.T) {
	fp := [32]byte{1}
	cfg := func(i int, secret string) stage.LinkConfig {
		return stage.LinkConfig{Stage: i, Stages: 2, First: i, End: i + 1, Layers: 2, Hidden: 4, Fingerprint: fp, Secret: []byte(secret)}
	}
	for _, c := range []struct{ dial, accept string }{{"a", "b"}, {"", "b"}, {"a", ""}} {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		errc := make(chan error, 1)
		go func() {
			conn, err := l.Accept()
			if err == nil {
				_, err = stage.Accept(conn, cfg(1, c.accept))
			}
			errc <- err
		}()
		_, derr := stage.Dial(context.Background(), l.Addr().String(), cfg(0, c.dial))
		aerr := <-errc
		l.Close()
		if !errors.Is(derr, stage.ErrAuth) || aerr == nil {
			t.Errorf("dialer secret %q, listener %q: dial %v, accept %v; want both refused (ErrAuth)", c.dial, c.accept, derr, aerr)
		}
	}
	// A peer that is not the next stage, or another model, is refused.
	for _, bad := range []stage.LinkConfig{
		{Stage: 1, Stages: 3, First: 1, End: 2, Layers: 2, Hidden: 4, Fingerprint: fp},
		{Stage: 1, Stages: 2, First: 1, End: 2, Layers: 2, Hidden: 4, Fingerprint: [32]byte{2}},
		{Stage: 1, Stages: 2, First: 0, End: 2, Layers: 2, Hidden: 4, Fingerprint: fp},
	} {
		l, _ := net.Listen("tcp", "127.0.0.1:0")
		go func() {
			if conn, err := l.Accept(); err == nil {
				stage.Accept(conn, bad)
			}
		}()
		_, err := stage.Dial(context.Background(), l.Addr().String(), cfg(0, ""))
		l.Close()
		if !errors.Is(err, stage.ErrMismatch) {
			t.Errorf("a peer %+v: %v, want ErrMismatch", bad, err)
		}
	}
}

// remoteFor is a stage's KV-wire client of the prefill runner at addr
// (nil without one): it asks for the stage's layers only.
func remoteFor(t testing.TB, m *engine.Model, addr string) decode.Remote {
	if addr == "" {
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	return decode.NewRemote(ctx, decode.RemoteConfig{Name: "m", Model: m, Endpoints: []string{addr}, ConnectTimeout: 5 * time.Second,
		IdleFloor: 10 * time.Second, Streams: 1, Logger: slog.New(slog.DiscardHandler)}).Remote
}

// servePrefill serves a prefill runner of the whole model at dir on
// loopback and returns its address and its metrics.
func servePrefill(t *testing.T, dir string) (string, *metrics.Runner) {
	b, err := backend.Open("cpu", backend.Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	m, err := engine.Load(context.Background(), dir, b, engine.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	met := metrics.New("prefill")
	prod := prefill.New(prefill.Options{Name: "m", Model: m, Chunk: 64, Metrics: met})
	srv, err := kvwire.NewServer(kvwire.ServerConfig{Producer: prod})
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); srv.Serve(ctx, l) }()
	t.Cleanup(func() { cancel(); <-done; prod.Close(); m.Close() })
	return l.Addr().String(), met
}

// TestPipelineRemotePrefill: a pipeline's long prompt is filled from a
// prefill runner, every stage fetching its own layer range over the KV
// wire, and the pipeline then answers as one runner that prefilled
// locally, for dense, sliding and Gated DeltaNet models.
func TestPipelineRemotePrefill(t *testing.T) {
	dirs := writeModels(t)
	for _, arch := range []string{"llama", "gemma3", "qwen3_next"} {
		t.Run(arch, func(t *testing.T) {
			dir := dirs[arch]
			want := generate(t, single(t, dir, 1), requests()[2:3], false)
			addr, pmet := servePrefill(t, dir)
			// The later stages are given no prefill runner: they fetch
			// from the one stage 0's Fill names.
			p := newPipeline(t, dir, []int{1, 2}, pipeOpts{maxBatch: 1, prefill: addr, onlyZero: arch != "llama"})
			got := generate(t, p.srv, requests()[2:3], false)
			if got[0] != want[0] {
				t.Errorf("remote prefill into the pipeline: %s, one runner prefilling locally %s", got[0], want[0])
			}
			// Every stage fetched its own layers, nothing twice: what stage 0
			// counts received (its own and the later stages' bytes) is what
			// the prefill runner sent for the three layer ranges.
			sent, recv := counter(t, pmet.Registry, "exo_kv_transfer_bytes_total", ""), counter(t, p.met.Registry, "exo_kv_transfer_bytes_total", "")
			if sent <= 0 || recv != sent {
				t.Errorf("the prefill runner sent %v KV bytes, the pipeline received %v", sent, recv)
			}
			if n := counter(t, p.met.Registry, "exo_remote_prefill_total", "ok"); n != 1 {
				t.Errorf("stage 0 counted %v remote prefills ok, want 1 (a fallback to local prefill is not the test)", n)
			}
		})
	}
}

// counter sums a counter's series in reg (those of one outcome label
// value, unless outcome is "").
func counter(t *testing.T, reg interface {
	Gather() ([]*dto.MetricFamily, error)
}, name, outcome string) float64 {
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, f := range fams {
		if f.GetName() == name {
			for _, m := range f.GetMetric() {
				keep := outcome == ""
				for _, l := range m.GetLabel() {
					keep = keep || (l.GetName() == "outcome" && l.GetValue() == outcome)
				}
				if keep {
					sum += m.GetCounter().GetValue()
				}
			}
		}
	}
	return sum
}
