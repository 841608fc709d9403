package tensor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/exo-pd/exo-pd/internal/testutil"
	"github.com/exo-pd/exo-pd/runners/decode"
	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/engine/backend"
	"github.com/exo-pd/exo-pd/runners/engine/testmodel"
)

// group is a tensor-parallel decode group of goroutines over real TCP
// links on loopback (ranks): rank 0's Model, and followers that can be
// stopped and started again (a fresh model and no caches).
type group struct {
	*ranks
	secret []byte
	model  *Model
	opts   engine.LoadOptions // every rank's (a pipeline stage's layers)
}

func load(t *testing.T, path string, c engine.Collective) *engine.Model {
	t.Helper()
	return loadWith(t, path, engine.LoadOptions{Tensor: c})
}

func loadWith(t *testing.T, path string, o engine.LoadOptions) *engine.Model {
	t.Helper()
	b, err := backend.Open("cpu", backend.Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	m, err := engine.Load(context.Background(), path, b, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

func startGroup(t *testing.T, path string, n int, secret []byte) *group {
	t.Helper()
	return startGroupWith(t, path, n, secret, engine.LoadOptions{})
}

// startGroupWith is startGroup with every rank loaded with o (its Tensor
// set per rank).
func startGroupWith(t *testing.T, path string, n int, secret []byte, o engine.LoadOptions) *group {
	t.Helper()
	gr := &group{ranks: startRanks(t, path, LeaderConfig{Size: n, Secret: secret, Rejoin: true, Timeout: 10 * time.Second}), secret: secret, opts: o}
	o.Tensor = Meter(gr.g.Collective(), NewMetrics(nil), "tiny")
	gr.model = gr.g.Model(loadWith(t, path, o))
	for r := 1; r < n; r++ {
		gr.start(r, secret)
	}
	return gr
}

// start runs rank r as a follower (a fresh model and no caches).
func (gr *group) start(r int, secret []byte) {
	f, err := NewFollower(FollowerConfig{Rank: r, Size: len(gr.stops), Leader: gr.addr, Secret: secret, Rejoin: true})
	if err != nil {
		gr.t.Fatal(err)
	}
	o := gr.opts
	o.Tensor = f.Collective()
	gr.follow(r, f, loadWith(gr.t, gr.path, o), nil)
}

func (gr *group) waitWhole() {
	gr.t.Helper()
	testutil.Eventually(gr.t, func() bool { return gr.g.Health() == nil }, 30*time.Second, "the group is whole")
}

func argmax(v []float32) int32 {
	best := 0
	for i, x := range v {
		if x > v[best] {
			best = i
		}
	}
	return int32(best)
}

func cosine(a, b []float32) float64 {
	var ab, aa, bb float64
	for i := range a {
		ab += float64(a[i]) * float64(b[i])
		aa += float64(a[i]) * float64(a[i])
		bb += float64(b[i]) * float64(b[i])
	}
	return ab / math.Sqrt(aa*bb)
}

// greedy prefills prompt (in chunks of 3) and decodes n tokens greedily,
// each step a batch of the two caches (the same prompt in both, so the
// rows must agree).
func greedy(t *testing.T, m interface {
	NewCache() engine.KVCache
	Prefill(ctx context.Context, c engine.KVCache, tokens []int32, chunk int, onChunk func(start, n int) error) error
	Forward(ctx context.Context, c engine.KVCache, tokens []int32) ([]float32, error)
	ForwardBatch(ctx context.Context, caches []engine.KVCache, tokens []int32) ([][]float32, error)
}, prompt []int32, n int) ([]int32, [][]float32) {
	t.Helper()
	ctx := context.Background()
	a, b := m.NewCache(), m.NewCache()
	defer a.Free()
	defer b.Free()
	var rows [][]float32
	var last []float32
	for _, c := range []engine.KVCache{a, b} {
		if err := m.Prefill(ctx, c, prompt[:len(prompt)-1], 3, nil); err != nil {
			t.Fatal(err)
		}
		lg, err := m.Forward(ctx, c, prompt[len(prompt)-1:])
		if err != nil {
			t.Fatal(err)
		}
		last = lg
	}
	rows = append(rows, last)
	var out []int32
	tok := argmax(last)
	for range n {
		out = append(out, tok)
		lg, err := m.ForwardBatch(ctx, []engine.KVCache{a, b}, []int32{tok, tok})
		if err != nil {
			t.Fatal(err)
		}
		if c := cosine(lg[0], lg[1]); c < 0.999999 {
			t.Fatalf("the batch's two rows of one sequence differ (cosine %v)", c)
		}
		rows = append(rows, lg[0])
		tok = argmax(lg[0])
	}
	return out, rows
}

// TestGroupEqualsWhole: 2 and 3 ranks over TCP links (with and without a
// secret) give the whole model's logits and greedy tokens, through
// chunked prefill, Forward and batched steps.
func TestGroupEqualsWhole(t *testing.T) {
	dir := t.TempDir()
	if err := testmodel.Write(dir, testmodel.Spec{Arch: "llama", Heads: 12, KVHeads: 6, HeadDim: 8, Hidden: 96, Intermediate: 192, Seed: 5}); err != nil {
		t.Fatal(err)
	}
	prompt := []int32{5, 17, 99, 3, 250, 41, 7, 8, 300, 12}
	want, wantRows := greedy(t, load(t, dir, nil), prompt, 12)
	for _, c := range []struct {
		n      int
		secret []byte
	}{{2, nil}, {3, []byte("s3cret")}} {
		gr := startGroup(t, dir, c.n, c.secret)
		gr.waitWhole()
		got, rows := greedy(t, gr.model, prompt, 12)
		if !slicesEqual(got, want) {
			t.Fatalf("%d ranks: greedy %v, whole model %v", c.n, got, want)
		}
		for i := range rows {
			if cs := cosine(rows[i], wantRows[i]); cs < 0.99999 {
				t.Fatalf("%d ranks: step %d logits cosine %v", c.n, i, cs)
			}
		}
	}
}

func slicesEqual(a, b []int32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestRankLost: a follower that goes away fails rank 0's next call with
// ErrGroup (no hang) and its Health; once it is back the group is whole,
// a sequence from before the loss is refused (its cache was lost), and a
// new one runs.
func TestRankLost(t *testing.T) {
	dir := t.TempDir()
	if err := testmodel.Write(dir, testmodel.Spec{Arch: "llama", Heads: 4, KVHeads: 2}); err != nil {
		t.Fatal(err)
	}
	gr := startGroup(t, dir, 2, nil)
	gr.waitWhole()
	ctx := context.Background()
	c := gr.model.NewCache()
	if _, err := gr.model.Forward(ctx, c, []int32{1, 2, 3}); err != nil {
		t.Fatal(err)
	}
	gr.stop(1)
	testutil.Eventually(t, func() bool { return gr.g.Health() != nil }, 10*time.Second, "rank 0 sees rank 1 gone")
	if _, err := gr.model.Forward(ctx, c, []int32{4}); !errors.Is(err, ErrGroup) {
		t.Fatalf("a step without rank 1: %v, want ErrGroup", err)
	}
	if err := gr.g.Health(); !strings.Contains(err.Error(), "rank 1") {
		t.Fatalf("health while rank 1 is gone: %v", err)
	}
	gr.start(1, nil)
	gr.waitWhole()
	if _, err := gr.model.Forward(ctx, c, []int32{4}); !errors.Is(err, ErrCacheLost) {
		t.Fatalf("a sequence from before the restart: %v, want ErrCacheLost", err)
	}
	if c.Len() != 0 || c.CanTruncate(1) || !c.CanTruncate(0) {
		t.Fatalf("the lost cache: len %d", c.Len())
	}
	c.Truncate(0)
	if _, err := gr.model.Forward(ctx, c, []int32{1, 2, 3}); err != nil {
		t.Fatalf("the emptied cache after the restart: %v", err)
	}
	c.Free()
}

// TestWrongSecret: a follower with another secret never joins, and says
// why.
func TestWrongSecret(t *testing.T) {
	dir := t.TempDir()
	if err := testmodel.Write(dir, testmodel.Spec{Arch: "llama", Heads: 4, KVHeads: 2}); err != nil {
		t.Fatal(err)
	}
	rs := startRanks(t, dir, LeaderConfig{Size: 2, Secret: []byte("a"), Rejoin: true})
	for _, s := range [][]byte{[]byte("b"), nil} {
		f, err := NewFollower(FollowerConfig{Rank: 1, Size: 2, Leader: rs.addr, Secret: s})
		if err != nil {
			t.Fatal(err)
		}
		_, err = f.dial(rs.ctx)
		if !errors.Is(err, ErrAuth) {
			t.Fatalf("secret %q: %v, want ErrAuth", s, err)
		}
	}
	if rs.g.Health() == nil {
		t.Fatal("the group is whole without rank 1")
	}
}

// TestBackendsDiffer: a rank on another backend (or MLX group) than rank
// 0 is refused by name on both sides over real links, before any rank
// would join MLX's group: the follower's dial and rank 0's awaitWhole
// (which Collective runs before the join) fail at once with ErrMismatch
// naming both ranks' backends, and the group never becomes whole.
func TestBackendsDiffer(t *testing.T) {
	type side struct {
		mlx            bool
		group, backend string
	}
	cpu := side{false, "", "cpu"}
	ring := side{true, "ring", "mlx-cpu"}
	// says is how a side names itself in the refusal: backend (where).
	says := func(s side) (string, string) {
		if s.group == "" {
			return s.backend, "the tensor link"
		}
		return s.backend, "MLX's " + s.group
	}
	for _, tc := range []struct{ leader, follower side }{
		{ring, cpu},
		{cpu, ring},
		{side{true, "nccl", "mlx-gpu"}, ring},
		{side{true, "jaccl", "mlx-gpu"}, side{true, "ring", "mlx-gpu"}},
	} {
		lb, lw := says(tc.leader)
		fb, fw := says(tc.follower)
		// Each side names the peer first, then itself.
		want0 := fmt.Sprintf("rank 1 runs backend %s (sums over %s), rank 0 %s (over %s)", fb, fw, lb, lw)
		want1 := fmt.Sprintf("rank 0 runs backend %s (sums over %s), rank 1 %s (over %s)", lb, lw, fb, fw)
		rs := startRanks(t, "", LeaderConfig{Size: 2, MLX: tc.leader.mlx, Group: tc.leader.group, Backend: tc.leader.backend})
		g, ctx := rs.g, rs.ctx
		f, err := NewFollower(FollowerConfig{Rank: 1, Size: 2, Leader: rs.addr,
			MLX: tc.follower.mlx, Group: tc.follower.group, Backend: tc.follower.backend})
		if err != nil {
			t.Fatal(err)
		}
		// The follower's side: the pre-join link ends at once, not at
		// its timeout.
		err = f.link(ctx, time.Hour)
		if !errors.Is(err, ErrMismatch) || !strings.Contains(err.Error(), want1) {
			t.Errorf("%+v/%+v: follower: %v, want %q", tc.leader, tc.follower, err, want1)
		}
		// Rank 0's side: awaitWhole fails on the refusal, not at its
		// timeout.
		err = g.awaitWhole(time.Hour, []string{rs.addr, "127.0.0.1:1"})
		if !errors.Is(err, ErrMismatch) || !strings.Contains(err.Error(), want0) || !strings.Contains(err.Error(), ErrMismatch.Error()) {
			t.Errorf("%+v/%+v: rank 0: %v, want %q", tc.leader, tc.follower, err, want0)
		}
		if g.Health() == nil {
			t.Errorf("%+v/%+v: the group is whole", tc.leader, tc.follower)
		}
	}
}

// TestSameBackendLinks: ranks on the same MLX group link (Follower.link,
// before the join) and rank 0's awaitWhole sees the group whole; a rank
// that never links fails awaitWhole at its bound naming the missing rank.
func TestSameBackendLinks(t *testing.T) {
	rs := startRanks(t, "", LeaderConfig{Size: 3, MLX: true, Group: "ring", Backend: "mlx-cpu"})
	g, ctx := rs.g, rs.ctx
	f, err := NewFollower(FollowerConfig{Rank: 1, Size: 3, Leader: rs.addr, MLX: true, Group: "ring", Backend: "mlx-cpu"})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.link(ctx, time.Hour); err != nil || f.pending == nil {
		t.Fatalf("link: %v", err)
	}
	// The test holds each rank's link until it ends: an unreachable
	// Follower's connection is closed by the garbage collector (rank 1
	// "lost" at random, or awaitWhole waiting for it for an hour).
	t.Cleanup(func() { f.pending.close() })
	// Rank 2 never links: the bound (a short one: nothing will come)
	// names it.
	err = g.awaitWhole(time.Millisecond, []string{"a:1", "b:2", "c:3"})
	if err == nil || !strings.Contains(err.Error(), "waiting for ranks [2]") || !strings.Contains(err.Error(), "a:1,b:2,c:3") {
		t.Fatalf("awaitWhole without rank 2: %v", err)
	}
	f2, err := NewFollower(FollowerConfig{Rank: 2, Size: 3, Leader: rs.addr, MLX: true, Group: "ring", Backend: "mlx-cpu"})
	if err != nil {
		t.Fatal(err)
	}
	if err := f2.link(ctx, time.Hour); err != nil {
		t.Fatalf("link rank 2: %v", err)
	}
	t.Cleanup(func() { f2.pending.close() })
	if err := g.awaitWhole(time.Hour, nil); err != nil {
		t.Fatalf("awaitWhole: %v", err)
	}
	if err := g.Health(); err != nil {
		t.Fatalf("whole group: %v", err)
	}
}

// TestBoundedJoin: a join that never returns fails at the bound, or at
// once when a rank's link drops (lost); a join that returns passes its
// result through. The join is injected (MLX's is not needed).
func TestBoundedJoin(t *testing.T) {
	never := make(chan struct{})
	defer close(never)
	hang := func() (int, error) { <-never; return 0, errors.New("unreachable") }
	if _, err := boundedJoin(hang, time.Millisecond, nil); !errors.Is(err, errJoinTimeout) {
		t.Fatalf("hung join: %v", err)
	}
	lost := make(chan struct{})
	close(lost)
	if _, err := boundedJoin(hang, time.Hour, lost); !errors.Is(err, errRankLost) {
		t.Fatalf("lost rank: %v", err)
	}
	if g, err := boundedJoin(func() (int, error) { return 7, nil }, time.Hour, nil); g != 7 || err != nil {
		t.Fatalf("join: %v %v", g, err)
	}
	fail := errors.New("refused")
	if _, err := boundedJoin(func() (int, error) { return 0, fail }, time.Hour, nil); !errors.Is(err, fail) {
		t.Fatalf("failed join: %v", err)
	}
}

// localFill is a decode.Remote that fills rank 0's share as a prefill
// runner would, without the network: the whole model computes the prompt
// and rank 0's KV heads are imported (no all_sums).
type localFill struct {
	whole  *engine.Model
	h0, h1 int
}

func (f localFill) Prefill(ctx context.Context, _ string, prompt []int32, start int, c engine.KVCache, _ []string) (decode.RemoteStats, error) {
	wc := f.whole.NewCache()
	defer wc.Free()
	n := len(prompt) - 1
	if err := f.whole.Prefill(ctx, wc, prompt[:n], 0, nil); err != nil {
		return decode.RemoteStats{}, err
	}
	heads := f.whole.Info().KVHeads
	for l := range f.whole.Info().Layers {
		k, v, err := wc.Export(l, start, n-start)
		if err != nil {
			return decode.RemoteStats{}, err
		}
		per := len(k) / heads
		if err := c.Import(l, start, n-start, k[f.h0*per:f.h1*per], v[f.h0*per:f.h1*per]); err != nil {
			return decode.RemoteStats{}, err
		}
	}
	return decode.RemoteStats{}, c.Commit(n)
}
func (f localFill) Classify(error) string { return "fallback_error" }

// TestFillAllOrNothing: a remote fill that succeeds on rank 0 and fails on
// a follower (it has no prefill endpoints) is refused as a whole: every
// rank is back at start_pos, the group stays whole, and the sequence then
// computes the whole model's logits.
func TestFillAllOrNothing(t *testing.T) {
	dir := t.TempDir()
	if err := testmodel.Write(dir, testmodel.Spec{Arch: "llama", Heads: 4, KVHeads: 2}); err != nil {
		t.Fatal(err)
	}
	gr := startGroup(t, dir, 2, nil)
	gr.waitWhole()
	ctx := context.Background()
	prompt := []int32{3, 1, 4, 1, 5, 9, 2, 6}
	c := gr.model.NewCache()
	defer c.Free()
	whole := load(t, dir, nil)
	h0, h1 := gr.model.KVHeadRange()
	r := gr.g.Remote(localFill{whole: whole, h0: h0, h1: h1})
	_, err := r.Prefill(ctx, "req", prompt, 0, c, nil)
	if err == nil || !strings.Contains(err.Error(), "no prefill endpoints") {
		t.Fatalf("fill with a follower that cannot: %v", err)
	}
	if c.Len() != 0 || gr.g.Health() != nil {
		t.Fatalf("after the refused fill: len %d, health %v", c.Len(), gr.g.Health())
	}
	got, err := gr.model.Forward(ctx, c, prompt)
	if err != nil {
		t.Fatal(err)
	}
	want, err := whole.Forward(ctx, whole.NewCache(), prompt)
	if err != nil {
		t.Fatal(err)
	}
	if cs := cosine(got, want); cs < 0.99999 {
		t.Fatalf("after the refused fill: cosine %v to the whole model", cs)
	}
}

// TestOldVersionPeer: a rank 0 that speaks version 1 or 2 of the link
// (shorter hellos) is refused as that version, not as a short read.
func TestOldVersionPeer(t *testing.T) {
	for v, old := range map[int][]byte{
		// magic, version, rank, size, auth, sum, nonce
		1: append([]byte{'E', 'X', 'O', 'T', 'P', 1, 0, 0, 2, 0, 0, 0}, make([]byte, 32)...),
		// … sum, backend [16], nonce
		2: append([]byte{'E', 'X', 'O', 'T', 'P', 2, 0, 0, 2, 0, 0, 0}, make([]byte, 48)...),
	} {
		leader := testutil.Peer(t, func(c net.Conn) {
			c.Write(old)
			io.Copy(io.Discard, c)
		})
		f, err := NewFollower(FollowerConfig{Rank: 1, Size: 2, Leader: leader, Backend: "cpu"})
		if err != nil {
			t.Fatal(err)
		}
		_, err = f.dial(context.Background())
		want := fmt.Sprintf("the peer speaks tensor link version %d, this side 3", v)
		if !errors.Is(err, ErrLink) || !strings.Contains(err.Error(), want) {
			t.Fatalf("v%d rank 0: %v, want %q", v, err, want)
		}
	}
}
