package pipeline

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/exo-pd/exo-pd/internal/testutil"
	"github.com/exo-pd/exo-pd/runners/engine"
	_ "github.com/exo-pd/exo-pd/runners/engine/backend"
	"github.com/exo-pd/exo-pd/runners/engine/cpu"
	"github.com/exo-pd/exo-pd/runners/engine/testmodel"
	"github.com/exo-pd/exo-pd/runners/kvwire"
	"github.com/exo-pd/exo-pd/runners/kvwire/kvwiretest"
	"github.com/exo-pd/exo-pd/runners/metrics"
	"github.com/exo-pd/exo-pd/runners/prefill"
	"github.com/exo-pd/exo-pd/runners/stage"
	dto "github.com/prometheus/client_model/go"
)

// sink keeps each chunk by stream layer.
type sink struct {
	mu     sync.Mutex
	hdr    kvwire.Header
	chunks map[int][]chunk
}

type chunk struct {
	start, n int
	k, v     []byte
}

func (s *sink) Begin(h *kvwire.Header) error {
	s.hdr, s.chunks = *h, map[int][]chunk{}
	return nil
}
func (s *sink) Chunk(l, start, n int, k, v []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.chunks[l] = append(s.chunks[l], chunk{start, n, bytes.Clone(k), bytes.Clone(v)})
	return nil
}
func (s *sink) State(int, int, [][]byte) error { return errors.New("no state expected") }
func (s *sink) Done(kvwire.Totals) error       { return nil }
func (s *sink) Rollback()                      {}

// stageProc is one prefill stage: its model, producer, KV server and pipe.
type stageProc struct {
	m      *engine.Model
	prod   *prefill.Producer
	met    *metrics.Runner
	addr   string // KV port
	pipe   *Pipe
	cancel context.CancelFunc
}

// gate blocks a stage model's StageForward after its first call until
// release is closed; held is closed when it does.
type gate struct {
	*engine.Model
	calls   int
	mu      sync.Mutex
	release chan struct{}
	held    chan struct{}
}

func (g *gate) StageForward(ctx context.Context, c engine.KVCache, tokens []int32, hidden []float32) ([]float32, error) {
	g.mu.Lock()
	g.calls++
	n := g.calls
	g.mu.Unlock()
	if n > 1 {
		if n == 2 {
			close(g.held)
		}
		select {
		case <-g.release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return g.Model.StageForward(ctx, c, tokens, hidden)
}

// startPipeline loads dir as stages split at the given layer bounds (each
// on its own cpu backend), each with a KV server and its pipe linked over
// loopback TCP. wrap, when set, wraps stage i's model.
func startPipeline(t *testing.T, dir string, bounds []int, wrap func(i int, m *engine.Model) StageModel) []*stageProc {
	t.Helper()
	return startPipelineGroups(t, dir, bounds, wrap, nil)
}

// startPipelineGroups is startPipeline with stage i's Group from group
// (nil: none).
func startPipelineGroups(t *testing.T, dir string, bounds []int, wrap func(i int, m *engine.Model) StageModel, group func(i int, b engine.Backend) *stage.Group) []*stageProc {
	t.Helper()
	n := len(bounds) - 1
	ls := make([]net.Listener, n)
	for i := range ls {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ls[i] = l
	}
	procs := make([]*stageProc, n)
	for i := range n {
		r := engine.LayerRange{Start: bounds[i], End: bounds[i+1]}
		b := cpu.New(1)
		m, err := engine.Load(context.Background(), dir, b, engine.LoadOptions{Layers: r})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close() })
		var sm StageModel = m
		if wrap != nil {
			sm = wrap(i, m)
		}
		met := metrics.New("prefill")
		prod := prefill.New(prefill.Options{Name: "m", Model: sm, Chunk: 16, CacheBlock: 16, Metrics: met, Stage: r})
		t.Cleanup(prod.Close)
		var g *stage.Group
		if group != nil {
			g = group(i, b)
		}
		pp, err := NewPipe(prod, sm, PipeConfig{Stage: i, Stages: n, Listener: ls[i], Next: ls[(i+1)%n].Addr().String(), Secret: []byte("s3cret"), Group: g})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		addr := kvwiretest.Serve(t, ctx, prod)
		go pp.Run(ctx)
		procs[i] = &stageProc{m: m, prod: prod, met: met, addr: addr, pipe: pp, cancel: cancel}
		defer func(pp *Pipe) {
			testutil.Eventually(t, pp.Up, 30*time.Second, "prefill stage %d's links up", i)
		}(pp)
	}
	return procs
}

// qwen2 writes the 3-layer qwen2 test model (seed 5) that most of these
// tests split, and returns its directory.
func qwen2(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "qwen2")
	if err := testmodel.Write(dir, testmodel.Spec{Arch: "qwen2", Seed: 5, Layers: 3, MaxPositions: 1024}); err != nil {
		t.Fatal(err)
	}
	return dir
}

// stage0 is a startPipeline wrap that wraps stage 0's model alone (wrap
// gets it as loaded).
func stage0(wrap func(m *engine.Model) StageModel) func(i int, m *engine.Model) StageModel {
	return func(i int, m *engine.Model) StageModel {
		if i == 0 {
			return wrap(m)
		}
		return m
	}
}

// ramp is the n-token prompt 3 + 13i mod 400.
func ramp(n int) []int32 {
	p := make([]int32, n)
	for i := range p {
		p[i] = int32(3 + i*13%400)
	}
	return p
}

// checkStream says how the stream in s for layers [a, b) of prompt from
// start differs from the whole model's cache ref, and its payload bytes.
func checkStream(s *sink, ref engine.KVCache, a, b, start, end int) (int64, error) {
	if s.hdr.FirstLayer != a || s.hdr.Layers() != b-a {
		return 0, fmt.Errorf("header from layer %d, %d layers; want [%d, %d)", s.hdr.FirstLayer, s.hdr.Layers(), a, b)
	}
	var bytesIn int64
	for i := range b - a {
		next := max(start, s.hdr.LayerStart(i))
		for _, c := range s.chunks[i] {
			k, v, err := ref.Export(a+i, c.start, c.n)
			if err != nil || c.start != next || !bytes.Equal(c.k, k) || !bytes.Equal(c.v, v) {
				return 0, fmt.Errorf("stream layer %d [%d,+%d) differs from the model's layer %d (want start %d; %v)", i, c.start, c.n, a+i, next, err)
			}
			next += c.n
			bytesIn += int64(len(k) + len(v))
		}
		if next != end {
			return 0, fmt.Errorf("stream layer %d ends at %d, want %d", i, next, end)
		}
	}
	return bytesIn, nil
}

func counter(met *metrics.Runner) float64 {
	var m dto.Metric
	if err := met.PrefillTokens.WithLabelValues("prefill").Write(&m); err != nil {
		panic(err)
	}
	return m.GetCounter().GetValue()
}

// TestPipelineRanges: a prompt's layers fetched from the stages of a
// prefill pipeline (each stage its own model of its layers, linked over
// authenticated loopback TCP) are bit for bit the whole model's local
// prefill, each stage sending its layers' share only: every stage asked at
// once (the later ones follow what stage 0 passes on), the last stage
// alone (it asks stage 0 round the ring, through the middle stage of a
// 3-stage pipeline), and again (prefix caches, nothing computed); for a
// dense and a sliding-window model over 2 stages and the dense one over
// 3. Each stage computes each token of a new prompt exactly once, however
// its requests and Wants race. Carried: the same with the hidden states
// over the stages' group (chanCarrier standing in for MLX's ring): the
// stage link's Steps carry none, and every byte a stage sent over the
// group the next one received.
func TestPipelineRanges(t *testing.T) {
	for _, carried := range []bool{false, true} {
		t.Run(map[bool]string{false: "tcp", true: "carried"}[carried], func(t *testing.T) { testPipelineRanges(t, carried) })
	}
}

// chanCarrier stands in for MLX's ring on the cpu backend (whose ops run
// at once), as runners/stage's tests' does: Send reads x and hands it to
// the next stage (blocking until it receives, as a ring's large transfer
// does), Recv takes the previous stage's next array.
type chanCarrier struct {
	b       engine.Backend
	in, out chan []float32
}

func (c *chanCarrier) Send(x engine.Array) engine.Array {
	v, err := c.b.Float32(x)
	if err != nil {
		panic(err)
	}
	select {
	case c.out <- v:
	case <-time.After(time.Minute): // a test's bound: nobody received
		panic("chanCarrier: nobody received")
	}
	return x
}

func (c *chanCarrier) Recv(shape []int, dt engine.DType) engine.Array {
	if dt != engine.F32 {
		panic(fmt.Sprintf("chanCarrier: receive of %v", dt))
	}
	select {
	case v := <-c.in:
		return c.b.FromFloat32(v, shape...)
	case <-time.After(time.Minute): // a test's bound: the sender never sent
		panic("chanCarrier: nothing to receive")
	}
}

func testPipelineRanges(t *testing.T, carried bool) {
	for _, tcm := range []struct {
		spec   testmodel.Spec
		bounds []int
	}{
		{testmodel.Spec{Arch: "qwen2", Seed: 5, Layers: 3, MaxPositions: 1024}, []int{0, 2, 3}},
		{testmodel.Spec{Arch: "gemma3", Seed: 4, Layers: 4, MaxPositions: 1024}, []int{0, 2, 4}},
		{testmodel.Spec{Arch: "qwen2", Seed: 5, Layers: 3, MaxPositions: 1024}, []int{0, 1, 2, 3}},
	} {
		spec := tcm.spec
		t.Run(fmt.Sprintf("%s/%d-stages", spec.Arch, len(tcm.bounds)-1), func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), spec.Arch)
			if err := testmodel.Write(dir, spec); err != nil {
				t.Fatal(err)
			}
			whole, err := engine.Load(context.Background(), dir, cpu.New(1), engine.LoadOptions{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { whole.Close() })
			bounds := tcm.bounds
			var group func(int, engine.Backend) *stage.Group
			lost := make(chan error, len(bounds))
			if carried {
				pipes := make([]chan []float32, len(bounds)-1)
				for i := range pipes {
					pipes[i] = make(chan []float32)
				}
				group = func(i int, b engine.Backend) *stage.Group {
					c := &chanCarrier{b: b, in: pipes[(i+len(pipes)-1)%len(pipes)], out: pipes[i]}
					return &stage.Group{Transport: "test", Join: func() (engine.Carrier, error) { return c, nil },
						OnLost: func(err error) { lost <- err }}
				}
			}
			procs := startPipelineGroups(t, dir, bounds, nil, group)
			n := len(procs)
			if carried {
				testutil.Eventually(t, func() bool {
					return !slices.ContainsFunc(procs, func(p *stageProc) bool { return p.pipe.Transport().Transport == stage.TransportPending })
				}, 30*time.Second, "the stages decide on the group")
				for i, p := range procs {
					if tr := p.pipe.Transport(); tr != (stage.Transport{Transport: "test"}) {
						t.Fatalf("stage %d's hidden states go over %+v, want the group", i, tr)
					}
				}
			}
			all := func(reverse bool) []int {
				var s []int
				for i := range n {
					s = append(s, i)
				}
				if reverse {
					slices.Reverse(s)
				}
				return s
			}
			ctx := context.Background()
			cl := kvwire.NewClient(kvwire.ClientConfig{})
			fp := kvwire.Fingerprint(whole.Fingerprint())
			info := whole.Info()
			fetch := func(i int, prompt []int32, start int) (*sink, kvwire.Stats, error) {
				a, b := bounds[i], bounds[i+1]
				s := &sink{}
				req := &kvwire.Request{ID: fmt.Sprint("s", i), Model: "m", Fingerprint: fp, Tokens: prompt, StartPos: start, LayerStart: a, LayerEnd: b}
				var windows []int
				if info.Windows != nil {
					windows = info.Windows[a:b]
				}
				exp := &kvwire.Expect{Fingerprint: fp, Kinds: make([]kvwire.LayerKind, b-a), Windows: windows, KVHeads: info.KVHeads, HeadDim: info.HeadDim}
				st, err := cl.Fetch(ctx, procs[i].addr, req, exp, s)
				return s, st, err
			}
			for round, tc := range []struct {
				prompt int // tokens
				seed   int
				start  int
				stages []int // asked at once
			}{
				{70, 1, 0, all(false)},
				{53, 2, 5, []int{n - 1}},
				{53, 2, 0, all(true)},
				{70, 1, 3, []int{n - 1}},
			} {
				prompt := make([]int32, tc.prompt)
				for i := range prompt {
					prompt[i] = int32(11 + (i*29+tc.seed*7)%450)
				}
				end := len(prompt) - 1
				ref := whole.NewCache()
				if err := whole.Prefill(ctx, ref, prompt[:end], 16, nil); err != nil {
					t.Fatal(err)
				}
				var before []float64
				for _, p := range procs {
					before = append(before, counter(p.met))
				}
				var wg sync.WaitGroup
				errs := make([]error, len(procs))
				for _, i := range tc.stages {
					wg.Add(1)
					go func() {
						defer wg.Done()
						s, st, err := fetch(i, prompt, tc.start)
						if err != nil {
							errs[i] = err
							return
						}
						n, err := checkStream(s, ref, bounds[i], bounds[i+1], tc.start, end)
						if err == nil && n != st.PayloadBytes {
							err = fmt.Errorf("%d payload bytes, the stage's share is %d", st.PayloadBytes, n)
						}
						errs[i] = err
					}()
				}
				wg.Wait()
				ref.Free()
				// A stage counts its computed tokens when its computation ends,
				// which may be after the requests that followed it were served.
				testutil.Eventually(t, func() bool {
					return !slices.ContainsFunc(procs, func(p *stageProc) bool { return !p.prod.Idle() })
				}, 30*time.Second, "round %d: the stages' computations end", round)
				for i, err := range errs {
					if err != nil {
						t.Fatalf("round %d: stage %d: %v", round, i, err)
					}
				}
				// Each stage computes each token of a new prompt once, whoever
				// asked first (a stage's request, a Want, both); rounds 2 and 3
				// repeat prompts, which no stage computes again.
				for i, p := range procs {
					c := counter(p.met) - before[i]
					switch {
					case round < 2 && c != float64(end):
						t.Fatalf("round %d: stage %d computed %v tokens, want %d (each once)", round, i, c, end)
					case round >= 2 && c != 0:
						t.Fatalf("round %d: stage %d computed %v tokens; its prefix cache holds the prompt", round, i, c)
					}
				}
			}
			select {
			case err := <-lost:
				t.Fatalf("the group was lost: %v", err)
			default:
			}
			if carried {
				// Each stage but the last sent each new prompt's hidden
				// states once (70 and 53 tokens less the last, f32), and
				// the next stage received them all.
				want := int64((69 + 52) * whole.Info().Hidden * 4)
				for i, p := range procs {
					sent, recv := p.pipe.Carried()
					prevSent, _ := procs[(i+n-1)%n].pipe.Carried()
					switch {
					case i < n-1 && sent != want:
						t.Errorf("stage %d sent %d hidden-state bytes over the group, want %d", i, sent, want)
					case i == n-1 && sent != 0:
						t.Errorf("the last stage sent %d bytes over the group", sent)
					case recv != prevSent:
						t.Errorf("stage %d received %d bytes over the group, stage %d sent %d", i, recv, (i+n-1)%n, prevSent)
					}
				}
			}
		})
	}
}

// TestPipelineStageDies: stage 0 gone while stage 1's transfer runs (stage
// 0 computed a chunk and passed it on) fails that transfer with an error
// (it does not wait for a deadline), and stage 1 alone asked
// with stage 0 still gone fails at once.
func TestPipelineStageDies(t *testing.T) {
	g := &gate{release: make(chan struct{}), held: make(chan struct{})}
	defer close(g.release)
	procs := startPipeline(t, qwen2(t), []int{0, 1, 3}, stage0(func(m *engine.Model) StageModel { g.Model = m; return g }))
	fp := kvwire.Fingerprint(procs[0].m.Fingerprint())
	cl := kvwire.NewClient(kvwire.ClientConfig{})
	prompt := ramp(80)
	s := &sink{}
	done := make(chan error, 1)
	go func() {
		req := &kvwire.Request{ID: "x", Model: "m", Fingerprint: fp, Tokens: prompt, LayerStart: 1, LayerEnd: 3}
		_, err := cl.Fetch(context.Background(), procs[1].addr, req, nil, s)
		done <- err
	}()
	select {
	case <-g.held: // stage 0 passed its first chunk on and is held in its second
	case err := <-done:
		t.Fatalf("stage 1's transfer ended before stage 0 computed: %v", err)
	}
	procs[0].cancel()
	if err := <-done; !errors.Is(err, kvwire.ErrRemoteInternal) {
		t.Fatalf("a transfer whose upstream stage died: %v; want the stage's failure, not a timeout", err)
	}
	testutil.Eventually(t, func() bool { return !procs[1].pipe.Up() }, 30*time.Second, "stage 1 sees stage 0 gone")
	req := &kvwire.Request{ID: "y", Model: "m", Fingerprint: fp, Tokens: prompt[:40], LayerStart: 1, LayerEnd: 3}
	if _, err := cl.Fetch(context.Background(), procs[1].addr, req, nil, &sink{}); !errors.Is(err, kvwire.ErrRemoteInternal) {
		t.Fatalf("stage 1 alone with stage 0 gone: %v; want its failure at once", err)
	}
}

// TestPipelineStagesAskedInTurn: a decode pipeline fetches stage 0's
// layers, then (its stage 1, once stage 0's fill is done) stage 1's: a
// later prefill stage is asked after the computation it would have
// followed has ended. Prompts shorter than the prefix-cache block (which
// the cache does not keep) and longer ones, from position 0 and from past
// it (a decode side's cached prefix), are each served bit for bit; a
// fetch that waited for a computation no stage sends fails the test at
// its deadline (it hung before: the request asked stage 0 again, and the
// computation that answered began and ended before the request looked).
func TestPipelineStagesAskedInTurn(t *testing.T) {
	dir := qwen2(t)
	whole, err := engine.Load(context.Background(), dir, cpu.New(1), engine.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { whole.Close() })
	bounds := []int{0, 2, 3}
	procs := startPipeline(t, dir, bounds, nil)
	cl := kvwire.NewClient(kvwire.ClientConfig{})
	fp := kvwire.Fingerprint(whole.Fingerprint())
	for round := range 24 {
		// A shared 5-token "template" start, then a tail of 3 to 14
		// tokens (every third round 40 more: cached from then on).
		prompt := []int32{7, 8, 9, 10, 11}
		for i := range 3 + round%12 + 40*(round%3/2) {
			prompt = append(prompt, int32(20+(round*31+i*17)%400))
		}
		start := []int{0, 5}[round%2]
		end := len(prompt) - 1
		ref := whole.NewCache()
		if err := whole.Prefill(context.Background(), ref, prompt[:end], 16, nil); err != nil {
			t.Fatal(err)
		}
		for i := range procs {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			s := &sink{}
			req := &kvwire.Request{ID: fmt.Sprint("r", round, "s", i), Model: "m", Fingerprint: fp, Tokens: prompt, StartPos: start,
				LayerStart: bounds[i], LayerEnd: bounds[i+1], Deadline: 30 * time.Second}
			_, err := cl.Fetch(ctx, procs[i].addr, req, nil, s)
			cancel()
			if err == nil {
				_, err = checkStream(s, ref, bounds[i], bounds[i+1], start, end)
			}
			if err != nil {
				t.Fatalf("round %d (%d tokens from %d): stage %d: %v", round, len(prompt), start, i, err)
			}
		}
		ref.Free()
	}
}

// held blocks every StageForward until release is closed.
type held struct {
	*engine.Model
	release chan struct{}
}

func (h *held) StageForward(ctx context.Context, c engine.KVCache, tokens []int32, hidden []float32) ([]float32, error) {
	select {
	case <-h.release:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return h.Model.StageForward(ctx, c, tokens, hidden)
}

// TestPipelineStuckUpstream: a later stage asked for a prompt sends the
// header at once and then waits for the stages upstream; with stage 0's
// compute stuck (links up, keepalives flowing) the client's progress
// deadline ends the fetch with a timeout instead of the wait lasting as
// long as the request's deadline (it waited 10 minutes before the header
// went first).
func TestPipelineStuckUpstream(t *testing.T) {
	h := &held{release: make(chan struct{})}
	defer close(h.release)
	procs := startPipeline(t, qwen2(t), []int{0, 1, 3}, stage0(func(m *engine.Model) StageModel { h.Model = m; return h }))
	fp := kvwire.Fingerprint(procs[0].m.Fingerprint())
	cl := kvwire.NewClient(kvwire.ClientConfig{ProgressTimeout: 300 * time.Millisecond})
	prompt := ramp(40)
	s := &sink{}
	req := &kvwire.Request{ID: "x", Model: "m", Fingerprint: fp, Tokens: prompt, LayerStart: 1, LayerEnd: 3, Deadline: 10 * time.Minute}
	_, err := cl.Fetch(context.Background(), procs[1].addr, req, nil, s)
	if !errors.Is(err, kvwire.ErrTimeout) {
		t.Fatalf("a later stage whose upstream is stuck: %v, want the client's progress timeout", err)
	}
	if s.hdr.FirstLayer != 1 || s.hdr.Layers() != 2 {
		t.Fatalf("the later stage sent no header before waiting (got %+v)", s.hdr)
	}
}

// TestPipelineGroupFallback: a stage without a group keeps its neighbour
// on the stage link (each stage's Transport says why) and neither joins; stages that
// joined a group lose it (OnLost, once) when a neighbour's link goes.
func TestPipelineGroupFallback(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "qwen2")
	if err := testmodel.Write(dir, testmodel.Spec{Arch: "qwen2", Seed: 5, Layers: 3, MaxPositions: 1024}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		offers []bool
		want   []stage.Transport // each stage's
	}{
		{"one-offers", []bool{true, false}, []stage.Transport{stage.PeerDeclined(1), stage.NoGroup()}},
		{"both-offer", []bool{true, true}, []stage.Transport{{Transport: "test"}, {Transport: "test"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pipe := make(chan []float32)
			lost := make(chan error, 2)
			joins := make(chan int, 2)
			procs := startPipelineGroups(t, dir, []int{0, 1, 3}, nil, func(i int, b engine.Backend) *stage.Group {
				if !tc.offers[i] {
					return nil
				}
				c := &chanCarrier{b: b, in: pipe, out: pipe}
				return &stage.Group{Transport: "test", Join: func() (engine.Carrier, error) { joins <- i; return c, nil },
					OnLost: func(err error) { lost <- err }}
			})
			testutil.Eventually(t, func() bool {
				return procs[0].pipe.Transport().Transport != stage.TransportPending && procs[1].pipe.Transport().Transport != stage.TransportPending
			}, 30*time.Second, "the stages decide")
			for i, p := range procs {
				if tr := p.pipe.Transport(); tr != tc.want[i] {
					t.Fatalf("stage %d: hidden states over %+v, want %+v", i, tr, tc.want[i])
				}
			}
			if tc.want[0].Transport == stage.TransportTCP {
				if len(joins) != 0 {
					t.Fatalf("a stage joined a group its neighbour did not offer")
				}
				return
			}
			procs[1].cancel()
			select {
			case err := <-lost:
				if !errors.Is(err, stage.ErrGroupLost) {
					t.Fatalf("lost with %v, want ErrGroupLost", err)
				}
			case <-time.After(time.Minute): // a test's bound
				t.Fatal("stage 0 did not lose its group when stage 1 went")
			}
		})
	}
}

// TestPipelineCrossingPrompts: two prompts whose computations cross on the
// way down a 3-stage ring (stage 1 passes B on before A, although stage 0
// numbered A first: each computation from upstream runs in a goroutine of
// its own) do not make stage 0 compute A again when stage 2 is asked for A
// meanwhile: the Want names the newest computation of A stage 2 received
// (none), not B's number, so stage 0 sees that A's is still on its way,
// and stage 2's request follows it when stage 1 lets it go. Every stage
// computes each prompt once and stage 2 serves A bit for bit. Hooks order
// the crossing (no sleeps); the old Want (the highest origin of any
// prompt) made stage 0 compute A twice here every time.
func TestPipelineCrossingPrompts(t *testing.T) {
	dir := qwen2(t)
	whole, err := engine.Load(context.Background(), dir, cpu.New(1), engine.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { whole.Close() })
	bounds := []int{0, 1, 2, 3}
	procs := startPipeline(t, dir, bounds, nil)
	a, b := ramp(30), ramp(31)[1:] // two chunks each: stage 1's stream buffer holds them and the Ack
	holding, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	procs[1].pipe.hooks.Store(&testHooks{beforeOut: func(tokens []int32, _ uint64) {
		if slices.Equal(tokens, a) {
			once.Do(func() {
				close(holding)
				select {
				case <-release:
				case <-time.After(time.Minute): // a test's bound
				}
			})
		}
	}})
	answered := make(chan bool, 4)
	procs[0].pipe.hooks.Store(&testHooks{wantDone: func(computed bool) { answered <- computed }})
	fp := kvwire.Fingerprint(whole.Fingerprint())
	cl := kvwire.NewClient(kvwire.ClientConfig{})
	fetch := func(i int, prompt []int32) (*sink, error) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		s := &sink{}
		req := &kvwire.Request{ID: fmt.Sprint("s", i), Model: "m", Fingerprint: fp, Tokens: prompt,
			LayerStart: bounds[i], LayerEnd: bounds[i+1], Deadline: time.Minute}
		_, err := cl.Fetch(ctx, procs[i].addr, req, nil, s)
		return s, err
	}
	// A on stage 0 (numbered first), held on stage 1; then B, which
	// stage 1 passes on and stage 2 computes into its cache.
	if _, err := fetch(0, a); err != nil {
		t.Fatal(err)
	}
	<-holding
	if _, err := fetch(0, b); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, func() bool { return procs[2].prod.Cached(b, len(b)-1) == len(b)-1 },
		30*time.Second, "stage 2 holds B")
	testutil.Eventually(t, procs[0].prod.Idle, 30*time.Second, "stage 0's computations end")
	// Stage 2 asked for A now: it waits and asks stage 0, which must not
	// compute A again.
	type result struct {
		s   *sink
		err error
	}
	done := make(chan result, 1)
	go func() {
		s, err := fetch(2, a)
		done <- result{s, err}
	}()
	select {
	case computed := <-answered:
		if computed {
			t.Errorf("stage 0 computed A again for stage 2's Want while A's computation was on its way")
		}
	case <-time.After(time.Minute): // a test's bound
		t.Fatal("stage 0 never answered stage 2's Want")
	}
	close(release)
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	end := len(a) - 1
	ref := whole.NewCache()
	defer ref.Free()
	if err := whole.Prefill(context.Background(), ref, a[:end], 16, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := checkStream(r.s, ref, bounds[2], bounds[3], 0, end); err != nil {
		t.Fatalf("stage 2's A: %v", err)
	}
	testutil.Eventually(t, func() bool {
		return !slices.ContainsFunc(procs, func(p *stageProc) bool { return !p.prod.Idle() })
	}, 30*time.Second, "the stages' computations end")
	for i, p := range procs {
		if c, want := counter(p.met), float64(len(a)-1+len(b)-1); c != want {
			t.Errorf("stage %d computed %v tokens, want %v (A and B once each)", i, c, want)
		}
	}
}
