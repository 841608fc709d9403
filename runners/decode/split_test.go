package decode_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/exo-pd/exo-pd/internal/testutil"
	"github.com/exo-pd/exo-pd/runners/decode"
	"github.com/exo-pd/exo-pd/runners/engine"
	_ "github.com/exo-pd/exo-pd/runners/engine/backend"
	"github.com/exo-pd/exo-pd/runners/engine/cpu"
	"github.com/exo-pd/exo-pd/runners/engine/testmodel"
	"github.com/exo-pd/exo-pd/runners/kvwire"
	"github.com/exo-pd/exo-pd/runners/kvwire/kvwiretest"
	"github.com/exo-pd/exo-pd/runners/prefill"
	"github.com/exo-pd/exo-pd/runners/prefill/pipeline"
)

func load(t *testing.T, dir string, r engine.LayerRange) *engine.Model {
	t.Helper()
	m, err := engine.Load(context.Background(), dir, cpu.New(1), engine.LoadOptions{Layers: r})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// prefillStages starts a prefill pipeline of dir cut at bounds over
// loopback TCP and returns each stage's KV address.
func prefillStages(t *testing.T, dir string, bounds []int) []string {
	t.Helper()
	return prefillStagesWrap(t, dir, bounds, nil)
}

// prefillStagesWrap is prefillStages with stage i's model wrap(i, m)
// (wrap nil: as loaded).
func prefillStagesWrap(t *testing.T, dir string, bounds []int, wrap func(i int, m *engine.Model) pipeline.StageModel) []string {
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
	var addrs []string
	var pipes []*pipeline.Pipe
	for i := range n {
		r := engine.LayerRange{Start: bounds[i], End: bounds[i+1]}
		var m pipeline.StageModel = load(t, dir, r)
		if wrap != nil {
			m = wrap(i, m.(*engine.Model))
		}
		prod := prefill.New(prefill.Options{Name: "m", Model: m, Chunk: 16, CacheBlock: 16, Stage: r})
		t.Cleanup(prod.Close)
		pp, err := pipeline.NewPipe(prod, m, pipeline.PipeConfig{Stage: i, Stages: n, Listener: ls[i], Next: ls[(i+1)%n].Addr().String()})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		addrs = append(addrs, kvwiretest.Serve(t, ctx, prod))
		go pp.Run(ctx)
		pipes = append(pipes, pp)
	}
	for i, pp := range pipes {
		testutil.Eventually(t, pp.Up, 30*time.Second, "prefill stage %d's links", i)
	}
	return addrs
}

// TestSplitFillFromPrefillStages: a decode cache (a whole model's, and a
// decode stage's whose layers span both prefill stages) filled from a
// 2-stage prefill pipeline with --prefill ADDR@A:B endpoints holds the KV
// of a local prefill bit for bit and received its layers' share only; a
// stage that cannot be reached fails the fill and leaves the cache at
// start.
func TestSplitFillFromPrefillStages(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "qwen2")
	if err := testmodel.Write(dir, testmodel.Spec{Arch: "qwen2", Seed: 5, Layers: 3, MaxPositions: 1024}); err != nil {
		t.Fatal(err)
	}
	addrs := prefillStages(t, dir, []int{0, 1, 3})
	list := []string{addrs[1] + "@1:3", addrs[0] + "@0:1"}
	eps, parts, err := decode.ParsePrefillEndpoints(list)
	if err != nil || len(eps) != 2 || len(parts) != 2 || parts[0].Start != 0 || parts[1].Endpoints[0] != addrs[1] {
		t.Fatalf("parse %q: %v %+v %v", list, eps, parts, err)
	}
	whole := load(t, dir, engine.LayerRange{})
	ctx := context.Background()
	prompt := testmodel.Ramp(75, 7, 31, 450)
	end := len(prompt) - 1
	ref := testmodel.LocalPrefill(t, whole, prompt[:end], 16)
	for _, r := range []engine.LayerRange{{}, {Start: 0, End: 2}} {
		m := whole
		if r != (engine.LayerRange{}) {
			m = load(t, dir, r)
		} else {
			r = engine.LayerRange{Start: 0, End: 3}
		}
		const start = 0
		rem := &decode.KVRemote{Client: kvwire.NewClient(kvwire.ClientConfig{}), Name: "m", Model: m, Parts: parts}
		c := m.NewCache()
		st, err := rem.Prefill(ctx, "split", prompt, start, c, nil)
		if err != nil {
			t.Fatalf("layers %v: %v", r, err)
		}
		if c.Len() != end {
			t.Fatalf("layers %v: cache holds %d, want %d", r, c.Len(), end)
		}
		if share := sameLayers(t, fmt.Sprintf("layers %v, against local prefill", r), ref, c, r.Start, r.End, end); st.Bytes != share {
			t.Fatalf("layers %v: received %d bytes, its layers' share is %d", r, st.Bytes, share)
		}
		c.Free()
	}
	// A stage nobody answers at: the fill fails, the cache stays at start.
	dead := testutil.Addr(t)
	_, bad, err := decode.ParsePrefillEndpoints([]string{addrs[0] + "@0:1", dead + "@1:3"})
	if err != nil {
		t.Fatal(err)
	}
	rem := &decode.KVRemote{Client: kvwire.NewClient(kvwire.ClientConfig{ConnectTimeout: time.Second}), Name: "m", Model: whole, Parts: bad}
	c := whole.NewCache()
	defer c.Free()
	other := append([]int32{1, 2, 3}, prompt[3:]...)
	if _, err := rem.Prefill(ctx, "dead", other, 0, c, nil); err == nil || c.Len() != 0 {
		t.Fatalf("a dead prefill stage: %v, cache holds %d", err, c.Len())
	}
	for _, l := range [][]string{{"a:1", "b:2@0:1"}, {"a:1@0:2", "b:1@1:3"}, {"@0:1"}, {"a:1@x"}} {
		if _, _, err := decode.ParsePrefillEndpoints(l); err == nil {
			t.Errorf("%q parsed", l)
		}
	}
	if _, _, err := decode.ParsePrefillEndpoints([]string{"a:1"}); errors.Is(err, kvwire.ErrNoEndpoint) {
		t.Fatal(err)
	}
}

// stuckStage serves the KV wire like a prefill stage (or a tensor prefill
// rank) whose stages upstream never compute: it sends a request's header
// (the layers and KV heads it asks for), then nothing; it records the
// deadline each request carried (a request whose deadline is longer than
// a minute fails at once, so that the test need not wait for it).
func stuckStage(t *testing.T, model *engine.Model) (string, <-chan time.Duration) {
	t.Helper()
	got := make(chan time.Duration, 8)
	info := model.Info()
	p := kvwire.ProducerFunc(func(ctx context.Context, r *kvwire.Request, e *kvwire.Emitter) error {
		got <- r.Deadline
		if r.Deadline > time.Minute {
			return errors.New("a long deadline: recorded, not waited for")
		}
		a, b := r.LayerStart, r.LayerEnd
		if b == 0 {
			a, b = 0, info.Layers
		}
		heads := info.KVHeads
		if r.HasHeads() {
			heads = r.HeadEnd - r.HeadStart
		}
		hdr := kvwire.Header{Fingerprint: kvwire.Fingerprint(model.Fingerprint()), DType: kvwire.DTypeF32, KVHeads: heads, FirstHead: r.HeadStart,
			HeadDim: info.HeadDim, FirstLayer: a, Kinds: make([]kvwire.LayerKind, b-a), TokenStart: r.StartPos, TokenEnd: len(r.Tokens) - 1}
		if err := e.Header(hdr); err != nil {
			return err
		}
		<-ctx.Done()
		return context.Cause(ctx)
	})
	return kvwiretest.Serve(t, context.Background(), p), got
}

// TestFillDeadline: every remote fill sends the prefill side a deadline —
// its configured one, what is left of its context (plus the second the
// client keeps to hear the server), or DefaultFetchDeadline — so a prefill
// stage that sends its header and then never computes (its stages
// upstream stuck) fails the fill with a timeout at that deadline, and the
// cache is back at start (the decode side then prefills locally): from a
// 2-stage prefill pipeline (KVRemote with parts), from the ranks of a
// tensor prefill group (head pieces: one rank's KV heads from a prefill
// runner that computes, the other's from one that never does) and for a
// decode stage's own fill (StageFill).
func TestFillDeadline(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "qwen2")
	if err := testmodel.Write(dir, testmodel.Spec{Arch: "qwen2", Seed: 5, Layers: 3, MaxPositions: 1024}); err != nil {
		t.Fatal(err)
	}
	addrs := prefillStages(t, dir, []int{0, 1, 3})
	whole := load(t, dir, engine.LayerRange{})
	stuck, seen := stuckStage(t, whole)
	_, parts, err := decode.ParsePrefillEndpoints([]string{addrs[0] + "@0:1", stuck + "@1:3"})
	if err != nil {
		t.Fatal(err)
	}
	// Head pieces: heads 0:1 from a prefill runner of the whole model, 1:2
	// from the stuck one.
	prod := prefill.New(prefill.Options{Name: "m", Model: whole, Chunk: 16, CacheBlock: 16})
	t.Cleanup(prod.Close)
	_, headParts, err := decode.ParsePrefillEndpoints([]string{kvwiretest.Serve(t, context.Background(), prod) + "#0:1", stuck + "#1:2"})
	if err != nil {
		t.Fatal(err)
	}
	prompt := testmodel.Ramp(40, 9, 37, 450)
	for _, tc := range []struct {
		name     string
		heads    bool          // head pieces, else layer ranges
		deadline time.Duration // KVRemote.Deadline
		ctx      time.Duration // the fill's context (0: none)
		lo, hi   time.Duration // the deadline the stuck stage must see
	}{
		{"configured", false, 2 * time.Second, 0, 2 * time.Second, 2 * time.Second},
		{"from the context", false, 0, 2 * time.Second, time.Second, 3 * time.Second},
		{"default", false, 0, 0, decode.DefaultFetchDeadline, decode.DefaultFetchDeadline},
		{"head pieces, configured", true, 2 * time.Second, 0, 2 * time.Second, 2 * time.Second},
		{"head pieces, from the context", true, 0, 2 * time.Second, time.Second, 3 * time.Second},
		{"head pieces, default", true, 0, 0, decode.DefaultFetchDeadline, decode.DefaultFetchDeadline},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			if tc.ctx > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tc.ctx)
				defer cancel()
			}
			ps := parts
			if tc.heads {
				ps = headParts
			}
			rem := &decode.KVRemote{Client: kvwire.NewClient(kvwire.ClientConfig{}), Name: "m", Model: whole, Parts: ps, Deadline: tc.deadline}
			c := whole.NewCache()
			defer c.Free()
			_, err := rem.Prefill(ctx, "stuck", prompt, 0, c, nil)
			if d := <-seen; d < tc.lo || d > tc.hi {
				t.Fatalf("the prefill stage was sent a deadline of %v, want [%v, %v]", d, tc.lo, tc.hi)
			}
			if err == nil || c.Len() != 0 {
				t.Fatalf("a prefill stage that never computes: %v, cache holds %d", err, c.Len())
			}
			if tc.hi < time.Minute && !errors.Is(err, kvwire.ErrTimeout) {
				t.Fatalf("a prefill stage that never computes: %v, want a timeout", err)
			}
		})
	}
	// A decode stage's own fill (layers 1:3) from the stuck stage.
	m := load(t, dir, engine.LayerRange{Start: 1, End: 3})
	f := &decode.StageFill{Client: kvwire.NewClient(kvwire.ClientConfig{}), Name: "m", Model: m, Deadline: 2 * time.Second}
	c := m.NewCache()
	defer c.Free()
	if _, err := f.Fill(context.Background(), "stage", c, prompt, 0, []string{stuck}); !errors.Is(err, kvwire.ErrTimeout) || c.Len() != 0 {
		t.Fatalf("a decode stage's fill from a stage that never computes: %v, cache holds %d", err, c.Len())
	}
	if d := <-seen; d != 2*time.Second {
		t.Fatalf("the stage fill sent a deadline of %v, want 2s", d)
	}
}

// TestSplitFillHybrid: a hybrid model (Gated DeltaNet layers, their state
// in State frames) filled from two prefill stages gives the next token's
// logits of a local prefill.
func TestSplitFillHybrid(t *testing.T) {
	dir := filepath.Join("..", "engine", "testdata", "reference", "qwen3_next")
	whole := load(t, dir, engine.LayerRange{})
	L := whole.Info().Layers
	addrs := prefillStages(t, dir, []int{0, L / 2, L})
	_, parts, err := decode.ParsePrefillEndpoints([]string{fmt.Sprintf("%s@0:%d", addrs[0], L/2), fmt.Sprintf("%s@%d:%d", addrs[1], L/2, L)})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	prompt := testmodel.Ramp(70, 5, 17, 300)
	end := len(prompt) - 1
	ref := testmodel.LocalPrefill(t, whole, prompt[:end], 16)
	want, err := whole.Forward(ctx, ref, prompt[end:])
	if err != nil {
		t.Fatal(err)
	}
	rem := &decode.KVRemote{Client: kvwire.NewClient(kvwire.ClientConfig{}), Name: "m", Model: whole, Parts: parts}
	c := whole.NewCache()
	defer c.Free()
	st, err := rem.Prefill(ctx, "hybrid", prompt, 0, c, nil)
	if err != nil || c.Len() != end || st.States == 0 {
		t.Fatalf("fill: %v, cache %d of %d, %d states", err, c.Len(), end, st.States)
	}
	got, err := whole.Forward(ctx, c, prompt[end:])
	if err != nil {
		t.Fatal(err)
	}
	for i := range want {
		if d := got[i] - want[i]; d > 1e-4 || d < -1e-4 {
			t.Fatalf("logit %d: %v after the split fill, %v after local prefill", i, got[i], want[i])
		}
	}
}

// firstHeld is a prefill stage model whose first StageForward waits until
// release is closed (held is closed as it starts waiting).
type firstHeld struct {
	*engine.Model
	once          sync.Once
	held, release chan struct{}
}

func (f *firstHeld) StageForward(ctx context.Context, c engine.KVCache, tokens []int32, hidden []float32) ([]float32, error) {
	first := false
	f.once.Do(func() { first = true })
	if first {
		close(f.held)
		select {
		case <-f.release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return f.Model.StageForward(ctx, c, tokens, hidden)
}

// TestPrefillGroupPerFill: with two prefill groups (2-stage pipelines,
// --prefill A0@0:1,A1@1:3,B0@0:1,B1@1:3) one decode runner picks the group
// per fill, the one with the fewest of its fills in flight: a fill held
// on group A's stage 0 leaves the next fill to group B (it went to A
// before, behind the first, while B idled), each fill takes all its
// ranges from its group (the answer equal to local prefill's), and once
// both ended the next fill goes to A again (the earliest of equals).
func TestPrefillGroupPerFill(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "qwen2")
	if err := testmodel.Write(dir, testmodel.Spec{Arch: "qwen2", Seed: 5, Layers: 3, MaxPositions: 1024}); err != nil {
		t.Fatal(err)
	}
	bounds := []int{0, 1, 3}
	hold := &firstHeld{held: make(chan struct{}), release: make(chan struct{})}
	var once sync.Once
	release := func() { once.Do(func() { close(hold.release) }) }
	defer release()
	a := prefillStagesWrap(t, dir, bounds, func(i int, m *engine.Model) pipeline.StageModel {
		if i == 0 {
			hold.Model = m
			return hold
		}
		return m
	})
	b := prefillStages(t, dir, bounds)
	_, parts, err := decode.ParsePrefillEndpoints([]string{a[0] + "@0:1", a[1] + "@1:3", b[0] + "@0:1", b[1] + "@1:3"})
	if err != nil {
		t.Fatal(err)
	}
	whole := load(t, dir, engine.LayerRange{})
	rem := &decode.KVRemote{Client: kvwire.NewClient(kvwire.ClientConfig{}), Name: "m", Model: whole, Parts: parts}
	fill := func(name string, prompt []int32) (decode.RemoteStats, error) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // a test's bound
		defer cancel()
		c := whole.NewCache()
		defer c.Free()
		st, err := rem.Prefill(ctx, name, prompt, 0, c, nil)
		if err == nil {
			end := len(prompt) - 1
			sameLayers(t, name+" against local prefill", testmodel.LocalPrefill(t, whole, prompt[:end], 16), c, 0, 3, end)
		}
		return st, err
	}
	group := func(st decode.RemoteStats) string {
		switch st.Endpoint {
		case a[0] + "," + a[1]:
			return "A"
		case b[0] + "," + b[1]:
			return "B"
		}
		return "mixed " + st.Endpoint
	}
	type result struct {
		st  decode.RemoteStats
		err error
	}
	first := make(chan result, 1)
	go func() {
		st, err := fill("one", testmodel.Ramp(40, 3, 13, 400))
		first <- result{st, err}
	}()
	select {
	case <-hold.held:
	case <-time.After(time.Minute): // a test's bound
		t.Fatal("the first fill never reached group A's stage 0")
	}
	st, err := fill("two", testmodel.Ramp(45, 5, 17, 400))
	if err != nil || group(st) != "B" {
		t.Fatalf("the second fill, the first in flight on group A: %v, group %s; want group B", err, group(st))
	}
	release()
	r := <-first
	if r.err != nil || group(r.st) != "A" {
		t.Fatalf("the first fill: %v, group %s; want group A", r.err, group(r.st))
	}
	st, err = fill("three", testmodel.Ramp(50, 7, 19, 400))
	if err != nil || group(st) != "A" {
		t.Fatalf("a fill with none in flight: %v, group %s; want group A", err, group(st))
	}
}
