package e2e

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/exo-pd/exo-pd/internal/testutil"
	"github.com/exo-pd/exo-pd/runners/stage"
)

// stageTensor is a pipeline whose stages are tensor groups, as real runner
// processes on loopback: ranks[i][j] is rank j of stage i. Rank 0 of each
// stage is on the stage ring (--stage-listen, --stage-next) and leads its
// group; the other ranks take only --layers and --stage and talk to their
// rank 0 over the tensor link.
type stageTensor struct {
	ranks [][]*proc
	args  [][][]string // each process's arguments after `runner decode`, to start it again
}

// startStageTensor starts len(bounds)−1 stages of m ranks each of model
// (extra: every rank's flags; zero: stage 0's ranks') and waits until
// every process is healthy.
func startStageTensor(t *testing.T, name, model string, bounds []int, m int, extra, zero []string) *stageTensor {
	t.Helper()
	S := len(bounds) - 1
	// One block (separately picked ports may coincide): the stage links,
	// then each rank's tensor address and the port after it (MLX's ring),
	// then each rank's --listen.
	base := testutil.Ports(t, S+3*S*m)
	port := func(k int) string { return fmt.Sprintf("127.0.0.1:%d", base+k) }
	st := &stageTensor{ranks: make([][]*proc, S), args: make([][][]string, S)}
	for i := range S {
		peers := make([]string, m)
		for j := range m {
			peers[j] = port(S + 2*(i*m+j))
		}
		st.ranks[i], st.args[i] = make([]*proc, m), make([][]string, m)
		for j := range m {
			a := []string{"--listen", port(S + 2*S*m + i*m + j), "--served-name", "m", "--backend", "cpu", "--offline", "--model", model,
				"--layers", fmt.Sprintf("%d:%d", bounds[i], bounds[i+1]), "--stage", fmt.Sprintf("%d/%d", i, S),
				"--tensor", fmt.Sprintf("%d/%d", j, m), "--tensor-peers", strings.Join(peers, ",")}
			if j == 0 {
				a = append(a, "--stage-listen", port(i), "--stage-next", port((i+1)%S))
			}
			a = append(a, extra...)
			if i == 0 {
				a = append(a, zero...)
			}
			st.args[i][j] = a
		}
	}
	var all []*proc
	for i := range S {
		for j := m - 1; j >= 0; j-- { // followers first: rank 0 listens for them once it loads
			st.launch(t, name, i, j)
			all = append(all, st.ranks[i][j])
		}
	}
	waitHealthy(t, all...)
	return st
}

// launch starts rank j of stage i (without waiting for its health).
func (st *stageTensor) launch(t *testing.T, name string, i, j int) {
	t.Helper()
	a := st.args[i][j]
	p := &proc{t: t, name: fmt.Sprintf("%s-stage%d-rank%d", name, i, j), done: make(chan struct{}), listen: a[1], http: a[1]}
	p.launch(t, append([]string{"runner", "decode"}, a...), p.name, 4000)
	st.ranks[i][j] = p
}

func (st *stageTensor) all() []*proc {
	var out []*proc
	for _, r := range st.ranks {
		out = append(out, r...)
	}
	return out
}

// TestStageTensorEqualsOneRunner: two stages of two tensor ranks each (four
// real processes) answer with a one-process runner's text at temperature 0
// and with seeded sampling, one request at a time and four at once, for a
// dense and an MoE tiny model; every rank of both stages ran all_sums (the
// followers computed their shares of their stage's layers), and a
// follower's rank serves no API.
func TestStageTensorEqualsOneRunner(t *testing.T) {
	for _, c := range []struct {
		which  string
		bounds []int
	}{{"main", []int{0, 1, 2}}, {"moe", []int{0, 1, 3}}} {
		t.Run(c.which, func(t *testing.T) {
			model := tinyModel(t, c.which)
			one := start(t, "one", "decode", "--model", model)
			want := askAll(t, one.listen, pipelineRequests(), false)
			one.stop()
			st := startStageTensor(t, "st-"+c.which, model, c.bounds, 2, nil, nil)
			s0 := st.ranks[0][0]
			for _, concurrent := range []bool{false, true} {
				got := askAll(t, s0.listen, pipelineRequests(), concurrent)
				for i := range want {
					if got[i].Text != want[i].Text || got[i].Completion != want[i].Completion {
						t.Errorf("request %d (concurrent %v): 2 stages × 2 ranks %q (%d tokens), one runner %q (%d)", i, concurrent,
							got[i].Text, got[i].Completion, want[i].Text, want[i].Completion)
					}
				}
			}
			for i := range st.ranks {
				// A stage of tensor ranks keeps its hidden states on the
				// stage link (its process's group is its ranks').
				checkStageTransport(t, st.ranks[i][0], i, "tcp", stage.ReasonTensorStage)
				for j, p := range st.ranks[i] {
					if n := p.metric(t, fmt.Sprintf(`exo_tensor_allsum_total{model="m",rank="%d"}`, j)); n <= 0 {
						t.Errorf("stage %d rank %d ran %v all_sums", i, j, n)
					}
				}
			}
			if n := s0.metricPrefix(t, "exo_stage_link_bytes_total"); n <= 0 {
				t.Errorf("stage 0 reports %v stage-link bytes", n)
			}
			resp, err := http.Post("http://"+st.ranks[1][1].listen+"/v1/chat/completions", "application/json", strings.NewReader(`{}`))
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusNotFound {
				t.Errorf("a later stage's follower answered the API with %d, want 404", resp.StatusCode)
			}
		})
	}
}

// TestStageTensorRemotePrefill: a one-process prefill runner into two
// stages of two ranks: only stage 0's ranks are told the prefill runner
// (stage 1's fetch from the one stage 0 names), each of the four ranks
// asks for its stage's layers and its KV heads in one request, and the
// answer equals a one-process runner's with local prefill.
func TestStageTensorRemotePrefill(t *testing.T) {
	model := tinyModel(t, "moe")
	first := user(words(300, 160))
	turns := []pipeReq{{first, 12, ignoreEOS},
		{append(first, msg{Role: "assistant", Content: "ok"}, msg{Role: "user", Content: words(301, 140)}), 12, ignoreEOS}}
	one := start(t, "one", "decode", "--model", model)
	want := askAll(t, one.listen, turns, false)
	one.stop()
	pf := start(t, "prefill", "prefill", "--model", model)
	st := startStageTensor(t, "st-pd", model, []int{0, 1, 3}, 2, nil, []string{"--prefill", pf.listen, "--remote-prefill-min-tokens", "16"})
	s0 := st.ranks[0][0]
	for i, turn := range turns { // the second starts past the first's cached prefix
		got := askAll(t, s0.listen, []pipeReq{turn}, false)
		if got[0].Text != want[i].Text {
			t.Errorf("turn %d, remote prefill into 2 stages × 2 ranks: %q, one runner %q", i+1, got[0].Text, want[i].Text)
		}
		if n := s0.metric(t, outcome("ok")); n != float64(i+1) {
			t.Fatalf("turn %d: stage 0 counts %v remote prefills ok (last %q)", i+1, n, s0.lastOutcome())
		}
	}
	served := map[string]int{}
	for _, msg := range []string{"prefill served", "prefill served (followed a request computing the same prompt)"} {
		for _, r := range pf.records(msg) {
			served[r["layers"]+" "+r["kv_heads"]]++
		}
	}
	for _, k := range []string{"0:1 0:1", "0:1 1:2", "1:3 0:1", "1:3 1:2"} {
		if served[k] != 2 {
			t.Errorf("the prefill runner served layers and kv heads %v, want each stage × rank's twice (%q)", served, k)
		}
	}
	if len(served) != 4 {
		t.Errorf("the prefill runner served %v, want 4 ranges", served)
	}
}

// TestStageTensorFollowerKilled: kill -9 of stage 1's follower rank while
// a long generation streams ends that request with an error (no hang),
// stage 0 answers 503 until the rank is back, and then the next request
// gives the one-runner text; the same for stage 0's own follower.
func TestStageTensorFollowerKilled(t *testing.T) {
	model := tinyModel(t, "moe-long")
	one := start(t, "one", "decode", "--model", model)
	want := askAll(t, one.listen, pipelineRequests()[:1], false)
	one.stop()
	st := startStageTensor(t, "st-kill", model, []int{0, 1, 3}, 2, nil, nil)
	s0 := st.ranks[0][0]
	s := startLongStream(t, s0.listen, "go on forever", 30000)
	st.ranks[1][1].kill()
	res := s.wait(t, 60*time.Second, "stage 1's follower being killed")
	if res.ErrorBody == "" || res.Completion >= 30000 {
		t.Fatalf("the request whose stage lost a rank ended without an error: %+v", res)
	}
	if !strings.Contains(res.ErrorBody, "tensor") && !strings.Contains(res.ErrorBody, "stage link") {
		t.Errorf("the error names neither the tensor group nor the stage link: %q", res.ErrorBody)
	}
	t.Logf("the request in hand ended: %s", res.ErrorBody)
	testutil.Eventually(t, func() bool { code, _ := health(s0); return code == http.StatusServiceUnavailable },
		30*time.Second, "stage 0 unhealthy with stage 1's rank 1 gone")
	if code, body := health(st.ranks[1][0]); code != http.StatusServiceUnavailable || !strings.Contains(fmt.Sprint(body["error"]), "rank 1") {
		t.Errorf("stage 1's rank 0 /health with its rank 1 gone: %d %v", code, body)
	}
	st.launch(t, "st-kill-again", 1, 1)
	waitHealthy(t, st.all()...)
	got := askAll(t, s0.listen, pipelineRequests()[:1], false)
	if got[0].Text != want[0].Text {
		t.Errorf("after the rank came back: %q, want %q", got[0].Text, want[0].Text)
	}

	// Stage 0's own follower: the step in hand fails on stage 0 itself,
	// stage 0 answers 503 naming its group until the rank is back, and
	// its conversations cached from before start over.
	s = startLongStream(t, s0.listen, "go on forever again", 30000)
	st.ranks[0][1].kill()
	res = s.wait(t, 60*time.Second, "stage 0's follower being killed")
	if !strings.Contains(res.ErrorBody, "tensor") {
		t.Errorf("the request whose stage 0 lost a rank: %+v, want an error naming the tensor group", res)
	}
	testutil.Eventually(t, func() bool {
		code, body := health(s0)
		return code == http.StatusServiceUnavailable && strings.Contains(fmt.Sprint(body["error"]), "tensor group")
	}, 30*time.Second, "stage 0 unhealthy, naming its tensor group, with its rank 1 gone")
	st.launch(t, "st-kill-again", 0, 1)
	waitHealthy(t, st.all()...)
	got = askAll(t, s0.listen, pipelineRequests()[:1], false)
	if got[0].Text != want[0].Text {
		t.Errorf("after stage 0's rank came back: %q, want %q", got[0].Text, want[0].Text)
	}
}

// TestStageTensorMLX is TestStageTensorEqualsOneRunner's dense model on
// MLX's CPU device, by hand (EXO_MLXC_PATH names libmlxc): each stage's
// two ranks sum over MLX's ring, the stages pass hidden states on the TCP
// stage link (a process joins one MLX group: its ranks'), and the answers
// equal one MLX runner's, alone and four at once.
func TestStageTensorMLX(t *testing.T) {
	mlx := mlxRunner(t)
	model := tinyModel(t, "main")
	one := start(t, "one-mlx", "decode", append([]string{"--model", model}, mlx...)...)
	want := askAll(t, one.listen, pipelineRequests(), false)
	one.stop()
	st := startStageTensor(t, "st-mlx", model, []int{0, 1, 2}, 2, mlx, nil)
	for _, concurrent := range []bool{false, true} {
		got := askAll(t, st.ranks[0][0].listen, pipelineRequests(), concurrent)
		for i := range want {
			if got[i].Text != want[i].Text {
				t.Errorf("request %d (concurrent %v): 2 stages × 2 MLX ranks %q, one MLX runner %q", i, concurrent, got[i].Text, want[i].Text)
			}
		}
	}
	for i := range st.ranks {
		checkStageTransport(t, st.ranks[i][0], i, "tcp", stage.ReasonTensorStage)
		for j, p := range st.ranks[i] {
			if r := p.records("model loaded"); len(r) != 1 || !strings.HasPrefix(r[0]["backend"], "mlx") {
				t.Errorf("stage %d rank %d loaded %v, want one MLX model", i, j, r)
			}
			if n := p.metric(t, fmt.Sprintf(`exo_tensor_allsum_total{model="m",rank="%d"}`, j)); n <= 0 {
				t.Errorf("stage %d rank %d ran %v all_sums", i, j, n)
			}
		}
	}
}

// TestStageTensorMLXFollowerKilled: on MLX, kill -9 of stage 1's follower
// while a generation streams ends the request with an error, stage 1's
// rank 0 exits (its MLX group cannot be joined again), stage 0 answers
// 503, and once both of stage 1's ranks are started again the ring serves
// one MLX runner's text. By hand (EXO_MLXC_PATH).
func TestStageTensorMLXFollowerKilled(t *testing.T) {
	mlx := mlxRunner(t)
	model := tinyModel(t, "main-long")
	one := start(t, "one-mlx", "decode", append([]string{"--model", model}, mlx...)...)
	want := askAll(t, one.listen, pipelineRequests()[:1], false)
	one.stop()
	st := startStageTensor(t, "st-mlx-kill", model, []int{0, 1, 2}, 2, mlx, nil)
	s0 := st.ranks[0][0]
	s := startLongStream(t, s0.listen, "go on forever", 30000)
	st.ranks[1][1].kill()
	res := s.wait(t, 60*time.Second, "stage 1's follower being killed")
	if res.ErrorBody == "" || res.Completion >= 30000 {
		t.Fatalf("the request whose stage lost a rank ended without an error: %+v", res)
	}
	t.Logf("the request in hand ended: %s", res.ErrorBody)
	select {
	case <-st.ranks[1][0].done:
	case <-time.After(60 * time.Second):
		t.Fatalf("stage 1's rank 0 on MLX still runs 60 s after its rank 1 died")
	}
	testutil.Eventually(t, func() bool { code, _ := health(s0); return code == http.StatusServiceUnavailable },
		30*time.Second, "stage 0 unhealthy with stage 1 gone")
	st.launch(t, "st-mlx-kill-again", 1, 1)
	st.launch(t, "st-mlx-kill-again", 1, 0)
	waitHealthy(t, st.all()...)
	got := askAll(t, s0.listen, pipelineRequests()[:1], false)
	if got[0].Text != want[0].Text {
		t.Errorf("after stage 1 came back: %q, want %q", got[0].Text, want[0].Text)
	}
}

// TestStageTensorFromTensorPrefill: a 2-rank tensor-parallel prefill into
// two stages of two decode ranks (every rank given the prefill ranks, as
// the supervisor would): each decode rank asks the prefill rank holding
// its KV heads for its stage's layers, and the answers equal local
// prefill's (a first turn, a second past its cached prefix, one seeded).
func TestStageTensorFromTensorPrefill(t *testing.T) {
	model := tinyModel(t, "moe")
	ref := start(t, "ref", "decode", "--model", model)
	pg := startTensorPrefill(t, model, 2, 2)
	st := startStageTensor(t, "st-tpp", model, []int{0, 1, 3}, 2, []string{"--prefill", pg.list(true), "--remote-prefill-min-tokens", "16"}, nil)
	before := pg.served(t)
	checkRemoteEqualsLocal(t, "2-rank prefill into 2 stages × 2 ranks", st.ranks[0][0], ref, 700)
	checkShares(t, "into 2 stages × 2 ranks", pg, before)
}

// TestPipelineFromTensorPrefill: a 2-rank tensor-parallel prefill into a
// 2-stage decode pipeline (every stage given the prefill ranks): each
// stage assembles its layers' KV from both prefill ranks' heads, and the
// answers equal local prefill's.
func TestPipelineFromTensorPrefill(t *testing.T) {
	model := tinyModel(t, "moe")
	ref := start(t, "ref", "decode", "--model", model)
	pg := startTensorPrefill(t, model, 2, 2)
	pl := startPipeline(t, "pipe-tpp", model, []int{0, 1, 3}, "--prefill", pg.list(true), "--remote-prefill-min-tokens", "16")
	before := pg.served(t)
	checkRemoteEqualsLocal(t, "2-rank prefill into a 2-stage pipeline", pl.stages[0], ref, 800)
	checkShares(t, "into a 2-stage pipeline", pg, before)
}
