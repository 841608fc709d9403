package e2e

import (
	"cmp"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/exo-pd/exo-pd/internal/testutil"
	"github.com/exo-pd/exo-pd/runners/internal/testenv"
)

// tpGroup is a tensor-parallel decode model served by real runner
// processes, one per rank (rank 0 serves the API).
type tpGroup struct {
	ranks     []*proc
	args      [][]string // each follower's arguments, to start it again
	rank0Args []string
}

// startTensor starts n ranks of `exo runner decode --tensor i/n` on
// loopback: the followers first (their /health is 200 once linked to
// rank 0), then rank 0, which is healthy once the group is whole.
func startTensor(t *testing.T, model string, n int, extra ...string) *tpGroup {
	t.Helper()
	peers := make([]string, n)
	for i := range peers {
		peers[i] = freeAddr(t)
	}
	g := &tpGroup{ranks: make([]*proc, n), args: make([][]string, n)}
	for r := 1; r < n; r++ {
		g.args[r] = append([]string{"--model", model, "--tensor", fmt.Sprintf("%d/%d", r, n), "--tensor-peers", strings.Join(peers, ",")}, extra...)
		g.launch(t, r)
	}
	g.rank0Args = append([]string{"--model", model, "--tensor", fmt.Sprintf("0/%d", n), "--tensor-peers", strings.Join(peers, ",")}, extra...)
	g.ranks[0] = start(t, "tp-rank0", "decode", g.rank0Args...)
	for r := 1; r < n; r++ {
		g.waitHealth(t, r, 200)
	}
	return g
}

// launch starts follower rank r (without waiting for its health: that
// needs rank 0).
func (g *tpGroup) launch(t *testing.T, r int) {
	t.Helper()
	p := &proc{t: t, name: fmt.Sprintf("tp-rank%d", r), done: make(chan struct{})}
	p.listen = freeAddr(t)
	p.http = p.listen
	full := append([]string{"runner", "decode", "--listen", p.listen, "--served-name", "m", "--backend", "cpu", "--offline"}, g.args[r]...)
	p.launch(t, full, p.name, 4000)
	g.ranks[r] = p
}

// health returns a rank's /health status code and body (0 when it does
// not answer).
func health(p *proc) (int, map[string]any) {
	resp, err := http.Get("http://" + p.http + "/health")
	if err != nil {
		return 0, nil
	}
	defer resp.Body.Close()
	var body map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&body)
	return resp.StatusCode, body
}

func (g *tpGroup) waitHealth(t *testing.T, r, code int) {
	t.Helper()
	testutil.Eventually(t, func() bool { c, _ := health(g.ranks[r]); return c == code }, 120*time.Second,
		"rank %d's /health answers %d", r, code)
}

// allSums is a rank's exo_tensor_allsum_total.
func (g *tpGroup) allSums(t *testing.T, r int) float64 {
	return g.ranks[r].metric(t, fmt.Sprintf(`exo_tensor_allsum_total{model="m",rank="%d"}`, r))
}

// checkTensorGroup: the group answers as one runner does, alone and with
// 4 concurrent requests, at temperature 0 and seeded (seededRef: seeded
// answers equal the whole model's; else they equal the group's own
// answer to the same request again: a model whose sharded sums round
// differently, as Q4_1 SmolLM2's do, may sample another token where two
// are nearly equally likely); every rank ran the same all_sums.
func checkTensorGroup(t *testing.T, g *tpGroup, ref *proc, prompts []string, layers int, seededRef bool) {
	t.Helper()
	seeded := map[string]any{"temperature": 0.8, "seed": 42, "ignore_eos": true}
	for i, p := range prompts {
		got := chatStream(t, g.ranks[0].listen, user(p), 16, ignoreEOS)
		want := chatStream(t, ref.listen, user(p), 16, ignoreEOS)
		expectSame(t, fmt.Sprintf("prompt %d at temperature 0", i), got, want)
		got = chatStream(t, g.ranks[0].listen, user(p), 16, seeded)
		if seededRef {
			want = chatStream(t, ref.listen, user(p), 16, seeded)
		} else {
			want = chatStream(t, g.ranks[0].listen, user(p), 16, seeded)
		}
		expectSame(t, fmt.Sprintf("prompt %d seeded", i), got, want)
	}
	// 4 at once: batched steps on every rank.
	wants := make([]chatResult, 4)
	for i := range wants {
		wants[i] = chatStream(t, ref.listen, user(fmt.Sprintf("%s (%d)", prompts[0], i)), 16, ignoreEOS)
	}
	ch := make(chan struct {
		i int
		r chatResult
	}, 4)
	for i := range 4 {
		go func() {
			ch <- struct {
				i int
				r chatResult
			}{i, goChat(g.ranks[0].listen, user(fmt.Sprintf("%s (%d)", prompts[0], i)), 16, ignoreEOS)}
		}()
	}
	for range 4 {
		x := <-ch
		expectSame(t, fmt.Sprintf("concurrent %d", x.i), x.r, wants[x.i])
	}
	sums := g.allSums(t, 0)
	// Two per layer and forward (a prefill chunk, whose last layer's
	// output nothing reads, skips that layer's).
	if sums < float64(2*layers) {
		t.Fatalf("rank 0 ran %v all_sums (%d layers)", sums, layers)
	}
	for r := 1; r < len(g.ranks); r++ {
		testutil.Eventually(t, func() bool { return g.allSums(t, r) == sums }, 30*time.Second,
			"rank %d's all_sums equal rank 0's %v", r, sums)
	}
	if b := g.ranks[0].metric(t, `exo_tensor_allsum_bytes_total{model="m",rank="0"}`); b <= 0 {
		t.Fatalf("all_sum bytes %v", b)
	}
}

// checkTensorSums: every rank's /health "tensor_group" and
// exo_tensor_group say its all_sums run over group (for reason).
func checkTensorSums(t *testing.T, g *tpGroup, group, reason string) {
	t.Helper()
	for r, p := range g.ranks {
		_, body := health(p)
		tg, _ := body["tensor_group"].(map[string]any)
		if tg["group"] != group || fmt.Sprint(cmp.Or(tg["reason"], "")) != reason {
			t.Errorf("rank %d: /health tensor_group %v, want group %q reason %q\n%s", r, body["tensor_group"], group, reason, tail(p.logs(), 3000))
		}
		series := fmt.Sprintf(`exo_tensor_group{group=%q,model="m",rank="%d",reason=%q}`, group, r, reason)
		if v := p.metric(t, series); v != 1 {
			t.Errorf("rank %d: %s = %v, want 1", r, series, v)
		}
	}
}

// TestTensorParallelTiny: two rank processes of the tiny model answer as
// one runner does; a killed rank ends the request in hand with an error
// naming the group, rank 0's /health fails, and once the rank is started
// again the next request succeeds.
func TestTensorParallelTiny(t *testing.T) {
	dir := tinyModel(t, "main-long")
	ref := start(t, "tp-ref", "decode", "--model", dir)
	g := startTensor(t, dir, 2)
	checkTensorGroup(t, g, ref, []string{"hello there", words(11, 60)}, 2, true)
	checkTensorSums(t, g, "link", "") // the cpu backend: over the tensor link

	// A long generation, and rank 1 killed while it streams.
	killRankMidStream(t, g)
	g.waitHealth(t, 0, 503)
	if _, body := health(g.ranks[0]); !strings.Contains(fmt.Sprint(body["error"]), "rank 1") {
		t.Fatalf("rank 0's /health while rank 1 is dead: %v", body)
	}
	g.launch(t, 1)
	g.waitHealth(t, 0, 200)
	g.waitHealth(t, 1, 200)
	got := chatStream(t, g.ranks[0].listen, user("hello there"), 16, ignoreEOS)
	want := chatStream(t, ref.listen, user("hello there"), 16, ignoreEOS)
	expectSame(t, "after the rank came back", got, want)

	// Rank 0 killed and started again: the followers drop their caches,
	// dial the new rank 0 and the group serves again.
	g.ranks[0].kill()
	testutil.Eventually(t, func() bool { c, _ := health(g.ranks[1]); return c == 503 }, 30*time.Second, "rank 1 sees rank 0 gone")
	g.ranks[0] = start(t, "tp-rank0-again", "decode", g.rank0Args...)
	got = chatStream(t, g.ranks[0].listen, user("hello there"), 16, ignoreEOS)
	expectSame(t, "after rank 0 came back", got, want)
}

// TestTensorParallelSmolLM2: SmolLM2 (9 heads, 3 KV heads) over three
// rank processes answers as one runner does.
func TestTensorParallelSmolLM2(t *testing.T) {
	gguf := testenv.SmolLM2(t)
	ref := start(t, "tp-smol-ref", "decode", "--model", gguf)
	g := startTensor(t, gguf, 3)
	r := chatStream(t, g.ranks[0].listen, user("What is the capital of France? Answer in one word."), 12, nil)
	if r.Status != 200 || !r.Done || !strings.Contains(r.Text, "Paris") {
		t.Fatalf("SmolLM2 over 3 ranks answered %q (%+v)", r.Text, r)
	}
	checkTensorGroup(t, g, ref, []string{"Name three colors.", "Summarize: " + words(5, 80)}, 30, false)
}

// TestTensorParallelRemotePrefill: a tensor-parallel decode group over a
// prefill runner (whole model): each rank fetches its own KV heads (the
// prefill runner serves kv_heads 0:1 and 1:2 of the tiny model's two),
// and the answers equal local prefill's, for a first turn and a second
// one that starts past the cached prefix.
func TestTensorParallelRemotePrefill(t *testing.T) {
	checkTensorRemotePrefill(t, "tp")
}

// checkTensorRemotePrefill is TestTensorParallelRemotePrefill with the
// ranks and the one-runner reference on backend (flags; none: cpu); the
// prefill runner is the harness's (cpu, or $EXO_E2E_PREFILL_BACKEND).
func checkTensorRemotePrefill(t *testing.T, name string, backend ...string) {
	t.Helper()
	dir := tinyModel(t, "main")
	secret := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secret, []byte("tp-secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	pre := start(t, name+"-prefill", "prefill", "--model", dir, "--prefill-chunk", "128", "--secret-file", secret)
	ref := start(t, name+"-ref", "decode", append([]string{"--model", dir}, backend...)...)
	g := startTensor(t, dir, 2, append(backend, "--prefill", pre.listen, "--secret-file", secret, "--remote-prefill-route", "floor")...)
	first := user(words(300, 160))
	for i, m := range [][]msg{first, append(first, msg{Role: "assistant", Content: "ok"}, msg{Role: "user", Content: words(301, 140)})} {
		before := g.ranks[0].metric(t, outcome("ok"))
		got := chatStream(t, g.ranks[0].listen, m, genTokens, ignoreEOS)
		want := chatStream(t, ref.listen, m, genTokens, ignoreEOS)
		expectSame(t, fmt.Sprintf("turn %d", i+1), got, want)
		if after := g.ranks[0].metric(t, outcome("ok")); after != before+1 {
			t.Fatalf("turn %d: remote prefill ok %v → %v (last %q)", i+1, before, after, g.ranks[0].lastOutcome())
		}
	}
	served := map[string]int{}
	for _, msg := range []string{"prefill served", "prefill served (followed a request computing the same prompt)"} {
		for _, r := range pre.records(msg) {
			served[r["kv_heads"]]++
		}
	}
	if served["0:1"] != 2 || served["1:2"] != 2 || len(served) != 2 {
		t.Fatalf("the prefill runner served kv heads %v, want 0:1 and 1:2 twice each", served)
	}
}

// TestTensorParallelSpeculative: prompt-lookup speculation on a tensor
// group (ForwardAll verifications and truncations of rejected drafts on
// every rank) answers as one plain runner does at temperature 0.
func TestTensorParallelSpeculative(t *testing.T) {
	dir := tinyModel(t, "main")
	ref := start(t, "tp-spec-ref", "decode", "--model", dir)
	g := startTensor(t, dir, 2, "--speculative", "prompt-lookup")
	// A prompt that repeats itself gives prompt lookup drafts to verify.
	p := strings.Repeat("the cat sat on the mat and ", 12)
	got := chatStream(t, g.ranks[0].listen, user(p), 48, ignoreEOS)
	want := chatStream(t, ref.listen, user(p), 48, ignoreEOS)
	expectSame(t, "speculative", got, want)
	acc := g.ranks[0].metric(t, `exo_speculative_tokens_total{outcome="accepted"}`)
	rej := g.ranks[0].metric(t, `exo_speculative_tokens_total{outcome="rejected"}`)
	t.Logf("drafts accepted %v, rejected %v", acc, rej)
	if acc+rej == 0 {
		t.Fatal("no drafts were verified: the test did not exercise speculation")
	}
}

// killRankMidStream starts a long generation on g's rank 0, kills rank 1
// once the first token has streamed, and asserts that the request in hand
// ends within 60 s with an error naming the tensor group.
func killRankMidStream(t *testing.T, g *tpGroup) {
	t.Helper()
	s := startLongStream(t, g.ranks[0].listen, "tell me a long story", 20000)
	g.ranks[1].kill()
	r := s.wait(t, 60*time.Second, "its rank's death")
	if r.Done && r.ErrorBody == "" || r.Completion >= 20000 {
		t.Fatalf("the request in hand completed although rank 1 died: %+v", r)
	}
	if !strings.Contains(r.ErrorBody, "tensor") {
		t.Fatalf("the request in hand ended without naming the group: %+v", r)
	}
	t.Logf("the request in hand ended: %+v", r)
}
