package tensor

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/exo-pd/exo-pd/internal/testutil"
	"github.com/exo-pd/exo-pd/runners/decode"
	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/engine/testmodel"
	"github.com/exo-pd/exo-pd/runners/kvwire"
	"github.com/exo-pd/exo-pd/runners/kvwire/kvwiretest"
	"github.com/exo-pd/exo-pd/runners/metrics"
	"github.com/exo-pd/exo-pd/runners/prefill"
	dto "github.com/prometheus/client_model/go"
)

// prefillGroup is a tensor-parallel prefill group of goroutines (ranks):
// rank 0's Leader and each rank's Producer serving the KV wire on
// loopback, over real TCP links; followers can be stopped and started
// again (a fresh model and prefix cache).
type prefillGroup struct {
	*ranks
	n     int
	kv    []string // each rank's KV-wire address
	prods []*prefill.Producer
	mets  []*metrics.Runner // each rank's Producer's metrics
	fols  []*Follower
}

const testChunk = 16

func newProducer(m *engine.Model, met *metrics.Runner) *prefill.Producer {
	return prefill.New(prefill.Options{Name: "m", Model: m, Chunk: testChunk, CacheBlock: testChunk, Metrics: met})
}

func startPrefillGroup(t *testing.T, path string, n int) *prefillGroup {
	t.Helper()
	pg := &prefillGroup{n: n, kv: make([]string, n), prods: make([]*prefill.Producer, n), mets: make([]*metrics.Runner, n), fols: make([]*Follower, n)}
	// After the ranks' cleanup (registered next), which stops them.
	t.Cleanup(func() {
		for _, p := range pg.prods {
			if p != nil {
				p.Close()
			}
		}
	})
	pg.ranks = startRanks(t, path, LeaderConfig{Size: n, Rejoin: true, Timeout: 20 * time.Second})
	m := load(t, path, pg.g.Collective())
	pg.mets[0] = metrics.New("prefill")
	pg.prods[0] = newProducer(m, pg.mets[0])
	if err := pg.g.PrefillLead(pg.ctx, pg.prods[0], m, nil); err != nil {
		t.Fatal(err)
	}
	pg.kv[0] = kvwiretest.Serve(t, pg.ctx, pg.prods[0])
	for r := 1; r < n; r++ {
		pg.start(r)
	}
	pg.whole()
	return pg
}

// whole waits until rank 0 and every follower see the group whole (a
// follower's requests fail while it sees its link down).
func (pg *prefillGroup) whole() {
	pg.t.Helper()
	testutil.Eventually(pg.t, func() bool {
		if pg.g.Health() != nil {
			return false
		}
		for _, f := range pg.fols[1:] {
			if f.Health() != nil {
				return false
			}
		}
		return true
	}, 30*time.Second, "the group is whole")
}

func (pg *prefillGroup) start(r int) {
	f, err := NewFollower(FollowerConfig{Rank: r, Size: pg.n, Leader: pg.addr, Rejoin: true, Timeout: 20 * time.Second})
	if err != nil {
		pg.t.Fatal(err)
	}
	m := load(pg.t, pg.path, f.Collective())
	if pg.prods[r] != nil {
		pg.prods[r].Close()
	}
	pg.mets[r] = metrics.New("prefill")
	pg.prods[r] = newProducer(m, pg.mets[r])
	if err := f.PrefillFollow(pg.prods[r], m); err != nil {
		pg.t.Fatal(err)
	}
	pg.fols[r] = f
	pg.follow(r, f, m, func(ctx context.Context) { pg.kv[r] = kvwiretest.Serve(pg.t, ctx, pg.prods[r]) })
}

// headSink collects one head range's stream: per layer, K and V of each
// head as [tokens, head_dim] rows in order.
type headSink struct {
	heads   int
	k, v    map[int][][]byte // layer → head → bytes
	payload int
}

func (s *headSink) Begin(h *kvwire.Header) error {
	s.heads, s.k, s.v = h.KVHeads, map[int][][]byte{}, map[int][][]byte{}
	return nil
}

func (s *headSink) Chunk(layer, start, n int, k, v []byte) error {
	if s.k[layer] == nil {
		s.k[layer], s.v[layer] = make([][]byte, s.heads), make([][]byte, s.heads)
	}
	per := len(k) / s.heads
	for h := range s.heads {
		s.k[layer][h] = append(s.k[layer][h], k[h*per:(h+1)*per]...)
		s.v[layer][h] = append(s.v[layer][h], v[h*per:(h+1)*per]...)
	}
	s.payload += len(k) + len(v)
	return nil
}

func (s *headSink) State(int, int, [][]byte) error { return errors.New("no recurrent layers here") }
func (s *headSink) Done(kvwire.Totals) error       { return nil }
func (s *headSink) Rollback()                      {}

// fetchHeads asks addr for heads [h0, h1) of prompt from start.
func fetchHeads(ctx context.Context, m *engine.Model, addr string, prompt []int32, start, h0, h1 int) (*headSink, error) {
	info := m.Info()
	req := &kvwire.Request{ID: fmt.Sprintf("h%d", h0), Model: "m", Fingerprint: kvwire.Fingerprint(m.Fingerprint()),
		Tokens: prompt, StartPos: start, HeadStart: h0, HeadEnd: h1}
	exp := &kvwire.Expect{Fingerprint: req.Fingerprint, Kinds: make([]kvwire.LayerKind, info.Layers), KVHeads: h1 - h0, HeadDim: info.HeadDim}
	s := &headSink{}
	_, err := kvwire.NewClient(kvwire.ClientConfig{}).Fetch(ctx, addr, req, exp, s)
	return s, err
}

// checkHeads compares s with heads [h0, h1) of positions [start, end) of
// a whole model's cache ref.
func checkHeads(t *testing.T, what string, s *headSink, ref engine.KVCache, heads, start, end, h0, h1 int) {
	t.Helper()
	for l := range ref.Geometry().Layers {
		k, v, err := ref.Export(l, start, end-start)
		if err != nil {
			t.Fatal(err)
		}
		per := len(k) / heads
		for h := h0; h < h1; h++ {
			gk, gv, wk, wv := s.k[l][h-h0], s.v[l][h-h0], k[h*per:(h+1)*per], v[h*per:(h+1)*per]
			if len(gk) != len(wk) || len(gv) != len(wv) {
				t.Fatalf("%s: layer %d head %d: %d/%d bytes, want %d/%d", what, l, h, len(gk), len(gv), len(wk), len(wv))
			}
			// Layer 0 is the same arithmetic; later layers' inputs went
			// through all_sums, which round as the in-process group does.
			if l == 0 && (!bytes.Equal(gk, wk) || !bytes.Equal(gv, wv)) {
				t.Fatalf("%s: layer 0 head %d differs from a whole model's local prefill", what, h)
			}
			if ck, cv := cosine(f32s(gk), f32s(wk)), cosine(f32s(gv), f32s(wv)); ck < 0.99999 || cv < 0.99999 {
				t.Fatalf("%s: layer %d head %d: cosine K %v V %v with a whole model's local prefill", what, l, h, ck, cv)
			}
		}
	}
}

func f32s(b []byte) []float32 {
	out := make([]float32, len(b)/4)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return out
}

// wholeModel writes the test model of spec and loads it whole (load):
// the reference the ranks' KV is compared with. It returns the model's
// path too, for the ranks to load.
func wholeModel(t *testing.T, spec testmodel.Spec) (string, *engine.Model) {
	t.Helper()
	path := t.TempDir()
	if err := testmodel.Write(path, spec); err != nil {
		t.Fatal(err)
	}
	return path, load(t, path, nil)
}

// fetchEach asks every rank r of pg for its KV heads [r, r+1) of p from
// start, all at once and beside more (when set), and returns what each
// rank sent once every one has answered and more has returned. It fails
// the test where a rank failed or sent other than those heads of
// positions [start, len(p)-1) of ref, m's local prefill.
func (pg *prefillGroup) fetchEach(ctx context.Context, what string, m *engine.Model, ref engine.KVCache, p []int32, start int, more func()) []*headSink {
	pg.t.Helper()
	var wg sync.WaitGroup
	sinks, errs := make([]*headSink, pg.n), make([]error, pg.n)
	for r := range pg.n {
		wg.Go(func() { sinks[r], errs[r] = fetchHeads(ctx, m, pg.kv[r], p, start, r, r+1) })
	}
	if more != nil {
		wg.Go(more)
	}
	wg.Wait()
	for r := range pg.n {
		if errs[r] != nil {
			pg.t.Fatalf("%s: rank %d: %v", what, r, errs[r])
		}
		checkHeads(pg.t, fmt.Sprintf("%s, rank %d", what, r), sinks[r], ref, m.Info().KVHeads, start, len(p)-1, r, r+1)
	}
	return sinks
}

// TestTensorPrefillHeads: a 2-rank tensor-parallel prefill group serves
// each rank's KV heads from that rank's KV port, equal to a whole model's
// local prefill (layer 0 byte for byte; later layers, whose inputs went
// through the all_sums, to f32 cosine ≥ 0.99999): both ranks asked at once,
// the follower alone (its Want makes rank 0 compute), a longer prompt
// over the cached prefix, and after the follower restarted with an empty
// prefix cache (rank 0 computes from position 0 on every rank). A rank
// asked for heads it does not hold refuses by name; each rank ships its
// heads' share of the bytes.
func TestTensorPrefillHeads(t *testing.T) {
	path, whole := wholeModel(t, testmodel.Spec{Arch: "llama", Seed: 3, Layers: 2, Heads: 4, KVHeads: 2, HeadDim: 16, MaxPositions: 512})
	pg := startPrefillGroup(t, path, 2)
	ctx := t.Context()
	prompt := testmodel.Ramp(90, 5, 37, 300)
	ref := testmodel.LocalPrefill(t, whole, prompt[:len(prompt)-1], testChunk)
	both := func(what string, p []int32, start int) {
		t.Helper()
		sinks := pg.fetchEach(ctx, what, whole, ref, p, start, nil)
		if sinks[0].payload != sinks[1].payload || sinks[0].payload == 0 {
			t.Fatalf("%s: the ranks shipped %d and %d bytes, want their equal shares", what, sinks[0].payload, sinks[1].payload)
		}
	}
	both("first", prompt[:40], 0)
	// The follower alone, a prompt no rank has: it asks rank 0.
	s, err := fetchHeads(ctx, whole, pg.kv[1], prompt[:55], 3, 1, 2)
	if err != nil {
		t.Fatal(err)
	}
	checkHeads(t, "follower alone", s, ref, 2, 3, 54, 1, 2)
	both("over the cached prefix", prompt[:70], 10)
	if _, err := fetchHeads(ctx, whole, pg.kv[1], prompt[:70], 0, 0, 2); !errors.Is(err, kvwire.ErrMismatch) {
		t.Fatalf("rank 1 asked for heads 0:2: %v, want a mismatch", err)
	}
	// The follower restarts with an empty prefix cache; rank 0's still
	// holds the prompt's first 69 positions: the next computation starts
	// from 0 on both ranks.
	pg.stop(1)
	testutil.Eventually(t, func() bool { return pg.g.Health() != nil }, 30*time.Second, "rank 0 sees rank 1 gone")
	if _, err := fetchHeads(ctx, whole, pg.kv[0], append(prompt[:60:60], 9, 9, 9), 0, 0, 1); err == nil {
		t.Fatal("rank 0 computed a new prompt without its group")
	}
	pg.start(1)
	pg.whole()
	both("after rank 1 restarted", prompt, 0)
}

// computed is how many prompt tokens the Producer whose metrics are met
// has computed.
func computed(t *testing.T, met *metrics.Runner) float64 {
	t.Helper()
	var m dto.Metric
	if err := met.PrefillTokens.WithLabelValues("prefill").Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// TestTensorPrefillWantMeetsRequest: a request on rank 0 and one on the
// follower (whose Want asks rank 0 for a computation) for the same new
// prompt, at once: every rank computes each token of the prompt exactly
// once, whichever of the Want and rank 0's request comes first — rank 0
// follows a computation of the prompt running now or opens one in one
// step, and a Want that comes after a computation its request follows
// began is not answered again — and both requests get their heads of a
// whole model's prefill. Prompts of one chunk and of several; every other
// round a Want is also handed to rank 0 directly, as its link reader
// does, so that a Want races rank 0's request from the start.
func TestTensorPrefillWantMeetsRequest(t *testing.T) {
	path, whole := wholeModel(t, testmodel.Spec{Arch: "llama", Seed: 6, Layers: 2, Heads: 4, KVHeads: 2, HeadDim: 8, MaxPositions: 256})
	pg := startPrefillGroup(t, path, 2)
	ctx := t.Context()
	for round := range 6 {
		// end a whole number of cache blocks: a request that comes after
		// the computation ended reads the prompt from the prefix cache.
		prompt := make([]int32, []int{1, 2, 3}[round%3]*testChunk+1)
		for i := range prompt {
			prompt[i] = int32(7 + (i*41+round*13)%300)
		}
		end := len(prompt) - 1
		ref := whole.NewCache()
		if err := whole.Prefill(ctx, ref, prompt[:end], testChunk, nil); err != nil {
			t.Fatal(err)
		}
		before := []float64{computed(t, pg.mets[0]), computed(t, pg.mets[1])}
		var want func()
		if round%2 == 1 {
			// Rank 1's Want as rank 0's link reader hands it on, naming
			// every computation begun so far as seen, beside the two
			// requests (rank 1's own Want may come too).
			pg.g.mu.Lock()
			handOn := pg.g.want
			pg.g.mu.Unlock()
			seen := pg.g.nextID.Load()
			want = func() { handOn(1, prompt, 0, seen) }
		}
		pg.fetchEach(ctx, fmt.Sprintf("round %d", round), whole, ref, prompt, 0, want)
		// A rank counts its computed tokens when its computation ends,
		// which may be after the requests following it were served.
		testutil.Eventually(t, func() bool { return pg.prods[0].Idle() && pg.prods[1].Idle() }, 30*time.Second,
			fmt.Sprintf("round %d: the ranks' computations end", round))
		for r := range 2 {
			if c := computed(t, pg.mets[r]) - before[r]; c != float64(end) {
				t.Fatalf("round %d: rank %d computed %v tokens of a new %d-token prompt, want %d (each once)", round, r, c, len(prompt), end)
			}
		}
		ref.Free()
	}
}

// TestTensorPrefillIntoDecodeShares: a decode cache is filled from the
// ranks of a tensor-parallel prefill group named ADDR#H0:H1 (decode's
// head-split fill) whatever the two group sizes: a whole model's cache
// (its heads span every prefill rank: pieces assembled), the shares of a
// 2-rank and a 4-rank decode group, from 2-rank and 4-rank prefill groups
// (a share inside one prefill rank, or spanning two). Each filled cache
// equals the heads of a whole model's local prefill, and each fill moves
// exactly its heads' share of the bytes.
func TestTensorPrefillIntoDecodeShares(t *testing.T) {
	path, whole := wholeModel(t, testmodel.Spec{Arch: "llama", Seed: 8, Layers: 2, Heads: 8, KVHeads: 4, HeadDim: 8, MaxPositions: 512})
	ctx := t.Context()
	prompt := testmodel.Ramp(50, 3, 53, 400)
	ref := testmodel.LocalPrefill(t, whole, prompt[:len(prompt)-1], testChunk)
	const start = 4
	fullBytes := map[int]int64{} // the whole model's KV bytes from a position
	for _, pos := range []int{0, start} {
		for l := range ref.Geometry().Layers {
			k, v, _ := ref.Export(l, pos, len(prompt)-1-pos)
			fullBytes[pos] += int64(len(k) + len(v))
		}
	}
	for _, np := range []int{2, 4} {
		pg := startPrefillGroup(t, path, np)
		var list []string
		for r := range np {
			if np == 4 { // the supervisor's form
				list = append(list, fmt.Sprintf("%s#%d/%d", pg.kv[r], r, np))
			} else {
				list = append(list, fmt.Sprintf("%s#%d:%d", pg.kv[r], r*4/np, (r+1)*4/np))
			}
		}
		_, parts, err := decode.ParsePrefillEndpoints(list)
		if err != nil {
			t.Fatal(err)
		}
		for _, nd := range []int{1, 2, 4} {
			for r := range nd {
				m := whole
				if nd > 1 {
					m = load(t, path, engine.NewLocalGroup(nd).Rank(r))
				}
				h0, h1 := m.KVHeadRange()
				what := fmt.Sprintf("prefill group of %d, decode rank %d of %d (kv heads %d:%d)", np, r, nd, h0, h1)
				rem := &decode.KVRemote{Client: kvwire.NewClient(kvwire.ClientConfig{}), Name: "m", Model: m, Parts: parts}
				c := m.NewCache()
				for _, pos := range []int{0, start} {
					if pos > 0 { // a cache holding a prefix already: prefill it locally (a whole model's only)
						if nd > 1 {
							continue
						}
						c.Truncate(0)
						if err := m.Prefill(ctx, c, prompt[:pos], testChunk, nil); err != nil {
							t.Fatal(err)
						}
					}
					st, err := rem.Prefill(ctx, what, prompt, pos, c, nil)
					if err != nil {
						t.Fatalf("%s from %d: %v", what, pos, err)
					}
					if c.Len() != len(prompt)-1 {
						t.Fatalf("%s: cache holds %d", what, c.Len())
					}
					if want := fullBytes[pos] * int64(h1-h0) / 4; st.Bytes != want {
						t.Fatalf("%s from %d: %d payload bytes, want its heads' share %d", what, pos, st.Bytes, want)
					}
				}
				s := &headSink{heads: h1 - h0, k: map[int][][]byte{}, v: map[int][][]byte{}}
				for l := range c.Geometry().Layers {
					k, v, err := c.Export(l, 0, len(prompt)-1)
					if err != nil {
						t.Fatal(err)
					}
					if err := s.Chunk(l, 0, len(prompt)-1, k, v); err != nil {
						t.Fatal(err)
					}
				}
				checkHeads(t, what, s, ref, 4, 0, len(prompt)-1, h0, h1)
				c.Free()
			}
		}
	}
}
