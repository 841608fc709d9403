package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/exo-pd/exo-pd/internal/testutil"
)

// tpPrefill is a tensor-parallel prefill model served by real runner
// processes, one per rank, each serving its KV heads on its own KV port.
type tpPrefill struct {
	ranks []*proc
	args  [][]string // each rank's arguments, to start it again
	heads int        // the model's KV heads
}

// startTensorPrefill starts n ranks of `exo runner prefill --tensor i/n`
// on loopback: the followers first (healthy once linked to rank 0), then
// rank 0 (healthy once the group is whole).
func startTensorPrefill(t *testing.T, model string, n, heads int, extra ...string) *tpPrefill {
	t.Helper()
	peers := make([]string, n)
	for i := range peers {
		peers[i] = freeAddr(t)
	}
	g := &tpPrefill{ranks: make([]*proc, n), args: make([][]string, n), heads: heads}
	for r := range n {
		g.args[r] = append([]string{"--model", model, "--prefill-chunk", "64", "--tensor", fmt.Sprintf("%d/%d", r, n),
			"--tensor-peers", strings.Join(peers, ",")}, extra...)
	}
	for r := 1; r < n; r++ {
		g.launch(t, r)
	}
	g.ranks[0] = start(t, "tpp-rank0", "prefill", g.args[0]...)
	for r := 1; r < n; r++ {
		g.waitHealth(t, r, 200)
	}
	return g
}

// launch starts follower rank r without waiting for its health; started
// again, it listens where it did (the decode runners' --prefill names
// its KV port).
func (g *tpPrefill) launch(t *testing.T, r int) {
	t.Helper()
	p := &proc{t: t, name: fmt.Sprintf("tpp-rank%d", r), done: make(chan struct{})}
	p.listen, p.http = freeAddr(t), freeAddr(t)
	if old := g.ranks[r]; old != nil {
		p.listen, p.http = old.listen, old.http
	}
	// The flags start gives rank 0 (prefillBackendArgs: with
	// EXO_E2E_PREFILL_BACKEND=mlx a cpu follower would be refused by an
	// MLX rank 0, which then exits).
	full := append([]string{"runner", "prefill", "--listen", p.listen, "--metrics", p.http, "--served-name", "m", "--backend", "cpu", "--offline"}, prefillBackendArgs()...)
	full = append(full, g.args[r]...)
	p.launch(t, full, p.name, 4000)
	g.ranks[r] = p
}

func (g *tpPrefill) waitHealth(t *testing.T, r, code int) {
	t.Helper()
	testutil.Eventually(t, func() bool { c, _ := health(g.ranks[r]); return c == code }, 120*time.Second,
		"prefill rank %d's /health answers %d", r, code)
}

// list is the decode runners' --prefill: each rank's KV port with its
// KV heads (ADDR#H0:H1), or with ranks its rank (ADDR#I/N, the
// supervisor's form).
func (g *tpPrefill) list(ranks bool) string {
	var out []string
	n := len(g.ranks)
	for r, p := range g.ranks {
		if ranks {
			out = append(out, fmt.Sprintf("%s#%d/%d", p.listen, r, n))
		} else {
			out = append(out, fmt.Sprintf("%s#%d:%d", p.listen, r*g.heads/n, (r+1)*g.heads/n))
		}
	}
	return strings.Join(out, ",")
}

// served is each rank's KV bytes sent.
func (g *tpPrefill) served(t *testing.T) []float64 {
	out := make([]float64, len(g.ranks))
	for r, p := range g.ranks {
		out[r] = p.metric(t, `exo_kv_transfer_bytes_total{role="prefill"}`)
	}
	return out
}

// checkRemoteEqualsLocal sends a first turn and a second one past its
// cached prefix to the decode runner at dec (rank 0 of a group, or a
// runner) at temperature 0, and another prompt seeded, and checks each
// answer equals ref's (local prefill) and was filled remotely.
func checkRemoteEqualsLocal(t *testing.T, what string, dec, ref *proc, seed int) {
	t.Helper()
	seeded := map[string]any{"temperature": 0.8, "seed": 42, "ignore_eos": true}
	first := user(words(seed, 160))
	// Each request's prompt is new to the decode runner (its own prefix
	// cache would answer a repeated one locally).
	for i, c := range []struct {
		m     []msg
		extra map[string]any
	}{
		{first, ignoreEOS},
		{append(first, msg{Role: "assistant", Content: "ok"}, msg{Role: "user", Content: words(seed+1, 140)}), ignoreEOS},
		{user(words(seed+2, 160)), seeded},
	} {
		before := dec.metric(t, outcome("ok"))
		got := chatStream(t, dec.listen, c.m, genTokens, c.extra)
		want := chatStream(t, ref.listen, c.m, genTokens, c.extra)
		expectSame(t, fmt.Sprintf("%s: request %d", what, i+1), got, want)
		if after := dec.metric(t, outcome("ok")); after != before+1 {
			t.Fatalf("%s: request %d: remote prefill ok %v → %v (last %q)", what, i+1, before, after, dec.lastOutcome())
		}
	}
}

// checkShares: every prefill rank has sent the same bytes (each its KV
// heads' share of every fill), and more than before.
func checkShares(t *testing.T, what string, g *tpPrefill, before []float64) []float64 {
	t.Helper()
	now := g.served(t)
	for r := range now {
		if now[r]-before[r] <= 0 || now[r]-before[r] != now[0]-before[0] {
			t.Fatalf("%s: prefill ranks sent %v bytes (before %v): want equal shares", what, now, before)
		}
	}
	return now
}

// TestTensorPrefill: a 2-rank tensor-parallel prefill (real processes,
// cpu backend) fills a one-process decode runner (its cache's heads span
// both ranks: two pieces assembled) and a 2-rank tensor decode group (each
// decode rank asks the prefill rank of its heads), and a one-process
// prefill fills the 2-rank decode group; every answer equals local
// prefill's at temperature 0 and seeded, for the tiny dense model and a
// tiny MoE (qwen3moe), and each prefill rank sends its heads' share of
// the bytes (the one-process decode receives their sum). The MoE's decode
// runners name the ranks as the supervisor does (ADDR#I/N).
func TestTensorPrefill(t *testing.T) {
	for _, model := range []string{"main", "moe"} {
		t.Run(model, func(t *testing.T) {
			dir := tinyModel(t, model)
			ref := start(t, "tpp-ref", "decode", "--model", dir)
			pg := startTensorPrefill(t, dir, 2, 2)
			one := start(t, "tpp-one", "decode", "--model", dir, "--prefill", pg.list(model == "moe"))
			bytes := pg.served(t)
			checkRemoteEqualsLocal(t, "2-rank prefill into one decode runner", one, ref, 400)
			now := checkShares(t, "into one decode runner", pg, bytes)
			if got := one.metric(t, `exo_kv_transfer_bytes_total{role="decode"}`); got != now[0]-bytes[0]+now[1]-bytes[1] {
				t.Fatalf("the decode runner received %v bytes, the prefill ranks sent %v", got, now[0]-bytes[0]+now[1]-bytes[1])
			}
			one.stop()

			dg := startTensor(t, dir, 2, "--prefill", pg.list(model == "moe"), "--remote-prefill-route", "floor")
			checkRemoteEqualsLocal(t, "2-rank prefill into a 2-rank decode group", dg.ranks[0], ref, 500)
			checkShares(t, "into a 2-rank decode group", pg, now)
			for _, r := range dg.ranks {
				r.stop()
			}

			whole := start(t, "tpp-whole", "prefill", "--model", dir, "--prefill-chunk", "64")
			dg = startTensor(t, dir, 2, "--prefill", whole.listen, "--remote-prefill-route", "floor")
			checkRemoteEqualsLocal(t, "one prefill runner into a 2-rank decode group", dg.ranks[0], ref, 600)
		})
	}
}

// TestTensorPrefillRankKilled: with a rank of the prefill group killed,
// a decode runner's long prompts fall back to local prefill (answers
// still equal local prefill's, each within its deadline), rank 0's
// /health fails and names the lost rank; once the rank is started again
// the group is whole and fills remotely again (its empty prefix cache
// makes the first computation start over from position 0 on both ranks).
// The ranks run on the cpu backend whatever EXO_E2E_PREFILL_BACKEND says:
// a restarted rank rejoins the cpu link's group, while on MLX a lost rank
// ends the whole group by design (a process cannot join MLX's group again:
// rank 0 exits for every rank to restart, TestTensorParallelTinyMLXLostRank),
// which is what this test saw there.
func TestTensorPrefillRankKilled(t *testing.T) {
	dir := tinyModel(t, "main")
	ref := start(t, "tpp-ref", "decode", "--model", dir)
	pg := startTensorPrefill(t, dir, 2, 2, "--backend", "cpu")
	dec := start(t, "tpp-dec", "decode", "--model", dir, "--prefill", pg.list(false))
	p := user(words(700, 160))
	want := chatStream(t, ref.listen, p, genTokens, ignoreEOS)
	expectSame(t, "before the kill", chatStream(t, dec.listen, p, genTokens, ignoreEOS), want)
	if ok := dec.metric(t, outcome("ok")); ok != 1 {
		t.Fatalf("remote fills ok %v, want 1 (last %q)", ok, dec.lastOutcome())
	}

	pg.ranks[1].kill()
	pg.waitHealth(t, 0, 503)
	if _, body := health(pg.ranks[0]); !strings.Contains(fmt.Sprint(body["error"]), "rank 1") {
		t.Fatalf("prefill rank 0's /health while rank 1 is dead: %v", body)
	}
	for i, q := range []string{words(701, 160), words(702, 170)} {
		t0 := time.Now()
		got := chatStream(t, dec.listen, user(q), genTokens, ignoreEOS)
		expectSame(t, fmt.Sprintf("rank 1 dead, prompt %d", i), got, chatStream(t, ref.listen, user(q), genTokens, ignoreEOS))
		t.Logf("prompt %d answered in %v with rank 1 dead (outcome %q)", i, time.Since(t0).Round(time.Millisecond), dec.lastOutcome())
	}
	if ok := dec.metric(t, outcome("ok")); ok != 1 {
		t.Fatalf("remote fills ok %v with a prefill rank dead, want still 1", ok)
	}

	pg.launch(t, 1)
	pg.waitHealth(t, 1, 200)
	pg.waitHealth(t, 0, 200)
	// The decode runner skips endpoints that failed until a probe finds
	// them answering: wait for a fill to go remote again.
	seed := 710
	testutil.Eventually(t, func() bool {
		seed++
		q := user(words(seed, 180))
		before := dec.metric(t, outcome("ok"))
		got := chatStream(t, dec.listen, q, genTokens, ignoreEOS)
		expectSame(t, "after rank 1 came back", got, chatStream(t, ref.listen, q, genTokens, ignoreEOS))
		return dec.metric(t, outcome("ok")) == before+1
	}, 60*time.Second, "a fill goes remote again once the prefill group is whole")
	// A second turn of the first prompt: rank 0's prefix cache holds its
	// first turn, the restarted rank's does not.
	q2 := append(p, msg{Role: "assistant", Content: "ok"}, msg{Role: "user", Content: words(704, 120)})
	before := dec.metric(t, outcome("ok"))
	expectSame(t, "over rank 0's cached prefix", chatStream(t, dec.listen, q2, genTokens, ignoreEOS), chatStream(t, ref.listen, q2, genTokens, ignoreEOS))
	if after := dec.metric(t, outcome("ok")); after != before+1 {
		t.Fatalf("over rank 0's cached prefix: remote ok %v → %v (last %q)", before, after, dec.lastOutcome())
	}
	// Which way the group got there depends on which rank's request came
	// first (rank 1's Want from position 0, or rank 0's Begin refused by
	// rank 1); TestTensorPrefillHeads (runners/tensor) covers the refusal.
	t.Logf("rank 0 recomputed a prefix rank 1 lacked %d times", len(pg.ranks[0].records("tensor prefill: a rank's prefix cache differs from rank 0's: computing the prompt from position 0 on every rank")))
}
