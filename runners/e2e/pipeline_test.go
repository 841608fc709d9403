package e2e

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/exo-pd/exo-pd/internal/testutil"
	"github.com/exo-pd/exo-pd/runners/engine/testmodel"
	"github.com/exo-pd/exo-pd/runners/internal/testenv"
)

// launchStage starts stage i of a pipeline (bounds: the stages' layer
// bounds, links: each stage's --stage-listen) without waiting for it.
func launchStage(t *testing.T, name, model string, i int, bounds []int, links []string, listen string, extra []string) *proc {
	t.Helper()
	N := len(bounds) - 1
	p := &proc{t: t, name: fmt.Sprintf("%s-stage%d", name, i), done: make(chan struct{}), listen: listen, http: listen}
	args := []string{"runner", "decode", "--listen", listen, "--served-name", "m", "--backend", "cpu", "--offline", "--model", model,
		"--layers", fmt.Sprintf("%d:%d", bounds[i], bounds[i+1]), "--stage", fmt.Sprintf("%d/%d", i, N),
		"--stage-listen", links[i], "--stage-next", links[(i+1)%N]}
	p.launch(t, append(args, extra...), p.name, 4000)
	return p
}

// stageTransport is a stage runner's /health "stage_transport" once it
// has decided (not "pending"): where its hidden states go and, on the
// stage link, why not over MLX's ring.
func stageTransport(t *testing.T, p *proc) (transport, reason string) {
	t.Helper()
	var body map[string]any
	if !testutil.Until(time.Minute, func() bool {
		_, body = health(p)
		tr, _ := body["stage_transport"].(map[string]any)
		transport, _ = tr["transport"].(string)
		reason, _ = tr["reason"].(string)
		return transport != "" && transport != "pending"
	}) {
		t.Fatalf("%s: /health has no decided stage_transport after a minute: %v\n%s", p.name, body, tail(p.logs(), 3000))
	}
	return transport, reason
}

// checkStageTransport: stage i's /health says its hidden states go over
// transport (for reason), and exo_stage_transport says the same.
func checkStageTransport(t *testing.T, p *proc, i int, transport, reason string) {
	t.Helper()
	if tr, why := stageTransport(t, p); tr != transport || why != reason {
		t.Errorf("stage %d (%s): /health stage_transport %q (reason %q), want %q (%q)\n%s", i, p.name, tr, why, transport, reason, tail(p.logs(), 3000))
	}
	series := fmt.Sprintf(`exo_stage_transport{model="m",reason=%q,stage="%d",transport=%q}`, reason, i, transport)
	if v := p.metric(t, series); v != 1 {
		t.Errorf("stage %d (%s): %s = %v, want 1", i, p.name, series, v)
	}
}

func waitHealthy(t *testing.T, ps ...*proc) {
	t.Helper()
	testutil.Eventually(t, func() bool {
		for _, p := range ps {
			select {
			case <-p.done:
				t.Fatalf("%s exited:\n%s", p.name, tail(p.logs(), 4000))
			default:
			}
		}
		for _, p := range ps {
			if code, _ := health(p); code != 200 {
				return false
			}
		}
		return true
	}, 120*time.Second, "every stage healthy")
}

// pipeline is a pipeline's stage processes.
type pipeline struct {
	stages []*proc
	bounds []int
	links  []string
	model  string
	extra  []string
}

// startPipeline starts a pipeline of model cut at bounds (real exo
// processes on loopback) and waits until every stage is healthy.
func startPipeline(t *testing.T, name, model string, bounds []int, extra ...string) *pipeline {
	t.Helper()
	N := len(bounds) - 1
	pl := &pipeline{bounds: bounds, model: model, extra: extra}
	base := testutil.Ports(t, 2*N) // one block: separately picked ports may coincide
	for i := range N {
		pl.links = append(pl.links, fmt.Sprintf("127.0.0.1:%d", base+i))
	}
	for i := range N {
		pl.stages = append(pl.stages, launchStage(t, name, model, i, bounds, pl.links, fmt.Sprintf("127.0.0.1:%d", base+N+i), extra))
	}
	waitHealthy(t, pl.stages...)
	return pl
}

// startPipelineWith is startPipeline with zero, stage 0's own flags.
func startPipelineWith(t *testing.T, name, model string, bounds []int, zero []string) *pipeline {
	t.Helper()
	N := len(bounds) - 1
	pl := &pipeline{bounds: bounds, model: model}
	base := testutil.Ports(t, 2*N)
	for i := range N {
		pl.links = append(pl.links, fmt.Sprintf("127.0.0.1:%d", base+i))
	}
	for i := range N {
		var extra []string
		if i == 0 {
			extra = zero
		}
		pl.stages = append(pl.stages, launchStage(t, name, model, i, bounds, pl.links, fmt.Sprintf("127.0.0.1:%d", base+N+i), extra))
	}
	waitHealthy(t, pl.stages...)
	return pl
}

// restart starts stage i again on its addresses.
func (pl *pipeline) restart(t *testing.T, i int) {
	old := pl.stages[i]
	pl.stages[i] = launchStage(t, strings.TrimSuffix(old.name, fmt.Sprintf("-stage%d", i)), pl.model, i, pl.bounds, pl.links, old.listen, pl.extra)
}

// pipelineModels are the tiny models of every layer kind (and their
// layer counts): dense, MoE, sliding-window (Gemma 3) and Gated DeltaNet
// (Qwen3-Next).
func pipelineModels(t *testing.T) map[string]int {
	t.Helper()
	gemma := filepath.Join(t.TempDir(), "gemma3")
	if err := testmodel.Write(gemma, testmodel.Spec{Arch: "gemma3", Seed: 7, Layers: 4, MaxPositions: 4096}); err != nil {
		t.Fatal(err)
	}
	next, err := filepath.Abs(filepath.Join("..", "engine", "testdata", "reference", "qwen3_next"))
	if err != nil {
		t.Fatal(err)
	}
	return map[string]int{tinyModel(t, "main"): 2, tinyModel(t, "moe"): 3, gemma: 4, next: 4}
}

type pipeReq struct {
	msgs  []msg
	max   int
	extra map[string]any
}

func pipelineRequests() []pipeReq {
	return []pipeReq{
		{user("Tell me about the sea."), 16, map[string]any{"ignore_eos": true}},
		{user(words(3, 60)), 12, map[string]any{"temperature": 0.9, "top_p": 0.95, "seed": 11, "ignore_eos": true}},
		{user("hi"), 10, map[string]any{"temperature": 1.1, "seed": 5, "top_k": 30, "frequency_penalty": 0.5, "ignore_eos": true}},
		{user(words(9, 20)), 8, map[string]any{"ignore_eos": true}},
	}
}

// askAll sends the requests one after another, or all at once.
func askAll(t *testing.T, addr string, reqs []pipeReq, concurrent bool) []chatResult {
	t.Helper()
	out := make([]chatResult, len(reqs))
	var wg sync.WaitGroup
	for i, r := range reqs {
		if concurrent {
			wg.Add(1)
			go func() { defer wg.Done(); out[i] = goChat(addr, r.msgs, r.max, r.extra) }()
		} else {
			out[i] = chatStream(t, addr, r.msgs, r.max, r.extra)
		}
	}
	wg.Wait()
	for i, r := range out {
		if r.Status != 200 || !r.Done || r.ErrorBody != "" {
			t.Fatalf("request %d: %+v", i, r)
		}
	}
	return out
}

// TestPipelineStagesEqualOneRunner: 2- and 3-stage pipelines of real exo
// processes over loopback (the stage links authenticated with a secret)
// answer with a one-process decode runner's text at temperature 0 and
// with seeded sampling and penalties, one request at a time and four at
// once, for a tiny model of each layer kind; stage 0 reports the stage
// metrics of contract C1, and a later stage serves /health and /metrics
// but not the API.
func TestPipelineStagesEqualOneRunner(t *testing.T) {
	secret := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secret, []byte("pipeline-secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for model, L := range pipelineModels(t) {
		one := start(t, "one", "decode", "--model", model)
		want := askAll(t, one.listen, pipelineRequests(), false)
		one.stop()
		cuts := [][]int{{0, 1, L}}
		if L >= 3 {
			cuts = append(cuts, []int{0, 1, L - 1, L})
		}
		for _, bounds := range cuts {
			name := fmt.Sprintf("%s/%d-stages", filepath.Base(model), len(bounds)-1)
			t.Run(name, func(t *testing.T) {
				pl := startPipeline(t, "pipe", model, bounds, "--secret-file", secret)
				s0 := pl.stages[0]
				for _, concurrent := range []bool{false, true} {
					got := askAll(t, s0.listen, pipelineRequests(), concurrent)
					for i := range want {
						if got[i].Text != want[i].Text || got[i].Completion != want[i].Completion {
							t.Errorf("request %d (concurrent %v): pipeline %q (%d tokens), one runner %q (%d)", i, concurrent,
								got[i].Text, got[i].Completion, want[i].Text, want[i].Completion)
						}
					}
				}
				if n := s0.metricPrefix(t, "exo_stage_link_bytes_total"); n <= 0 {
					t.Errorf("stage 0 reports %v stage-link bytes", n)
				}
				// cpu stages: the hidden states on the stage link, and why.
				for i, p := range pl.stages {
					checkStageTransport(t, p, i, "tcp", "cpu_backend")
				}
				last := pl.stages[len(pl.stages)-1]
				if n := last.metricPrefix(t, "exo_stage_step_seconds_count"); n <= 0 {
					t.Errorf("the last stage reports %v steps", n)
				}
				resp, err := http.Post("http://"+last.listen+"/v1/chat/completions", "application/json", strings.NewReader(`{}`))
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				if resp.StatusCode != http.StatusNotFound {
					t.Errorf("a later stage answered the API with %d, want 404", resp.StatusCode)
				}
			})
		}
	}
}

// TestPipelineSmolLM2: SmolLM2 cut in two stages answers as one runner
// does, greedy and seeded, alone and four at once.
func TestPipelineSmolLM2(t *testing.T) {
	gguf := testenv.SmolLM2(t)
	one := start(t, "one", "decode", "--model", gguf)
	reqs := pipelineRequests()
	want := askAll(t, one.listen, reqs, false)
	one.stop()
	pl := startPipeline(t, "smol", gguf, []int{0, 13, 30})
	for _, concurrent := range []bool{false, true} {
		got := askAll(t, pl.stages[0].listen, reqs, concurrent)
		for i := range want {
			if got[i].Text != want[i].Text {
				t.Errorf("request %d (concurrent %v): pipeline %q, one runner %q", i, concurrent, got[i].Text, want[i].Text)
			}
		}
	}
}

// TestPipelineStageKilled: kill -9 of the middle stage of three while a
// long generation streams ends that request with an error (no hang);
// stage 0's /health answers 503 until the stage is back, and then the
// next request succeeds with the one-runner text.
func TestPipelineStageKilled(t *testing.T) {
	model := tinyModel(t, "moe-long")
	one := start(t, "one", "decode", "--model", model)
	want := askAll(t, one.listen, pipelineRequests()[:1], false)
	one.stop()
	pl := startPipeline(t, "kill", model, []int{0, 1, 2, 3})
	s0 := pl.stages[0]
	s := startLongStream(t, s0.listen, "go on forever", 30000)
	pl.stages[1].kill()
	res := s.wait(t, 60*time.Second, "its stage being killed")
	if res.ErrorBody == "" {
		t.Fatalf("the request whose stage was killed ended without an error: %+v", res)
	}
	if !strings.Contains(res.ErrorBody, "stage link") {
		t.Errorf("the error does not name the stage link: %q", res.ErrorBody)
	}
	testutil.Eventually(t, func() bool { code, _ := health(s0); return code == http.StatusServiceUnavailable },
		30*time.Second, "stage 0 unhealthy with stage 1 gone")
	// A request stage 0 gets meanwhile is a 503 with Retry-After (the ring
	// is down for now: a gateway retries elsewhere), never a 500.
	resp, err := http.Post("http://"+s0.listen+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"hello"}],"max_tokens":4}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Errorf("a request with the ring down: %d (Retry-After %q) %s, want 503 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"), body)
	}
	pl.restart(t, 1)
	waitHealthy(t, pl.stages...)
	got := askAll(t, s0.listen, pipelineRequests()[:1], false)
	if got[0].Text != want[0].Text {
		t.Errorf("after the stage came back: %q, want %q", got[0].Text, want[0].Text)
	}
}

// TestPipelineStageStopped: SIGSTOP of the middle stage of three while a
// generation streams (the process hangs, its sockets stay open) ends the
// request with an error naming the stage link once its neighbours miss its
// keepalives (the links' 10 s idle timeout), not never; stage 0 answers
// 503 meanwhile; after SIGCONT the stage finds its links gone, the ring is
// rebuilt, and the next request succeeds with the one-runner text.
func TestPipelineStageStopped(t *testing.T) {
	model := tinyModel(t, "moe-long")
	one := start(t, "one", "decode", "--model", model)
	want := askAll(t, one.listen, pipelineRequests()[:1], false)
	one.stop()
	pl := startPipeline(t, "stop", model, []int{0, 1, 2, 3})
	s0, mid := pl.stages[0], pl.stages[1]
	s := startLongStream(t, s0.listen, "go on forever", 30000)
	if err := mid.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := true
	defer func() {
		if stopped {
			mid.cmd.Process.Signal(syscall.SIGCONT)
		}
	}()
	res := s.wait(t, 90*time.Second, "its stage being stopped")
	if !strings.Contains(res.ErrorBody, "stage link") {
		t.Fatalf("the request whose stage hung: %+v, want an error naming the stage link", res)
	}
	if code, _ := health(s0); code != http.StatusServiceUnavailable {
		t.Errorf("stage 0's /health answers %d with stage 1 hung, want 503", code)
	}
	if err := mid.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	stopped = false
	waitHealthy(t, pl.stages...)
	got := askAll(t, s0.listen, pipelineRequests()[:1], false)
	if got[0].Text != want[0].Text {
		t.Errorf("after the stage resumed: %q, want %q", got[0].Text, want[0].Text)
	}
}

// TestPipelineRemotePrefill: a 2-stage decode pipeline with a prefill
// runner (real processes): a long prompt is filled remotely, each stage
// fetching its own layers over the KV wire, and the answer equals a one-
// process runner that prefilled locally.
func TestPipelineRemotePrefill(t *testing.T) {
	for model, bounds := range map[string][]int{tinyModel(t, "moe"): {0, 1, 3}, pipelineModelsNext(t): {0, 2, 4}} {
		t.Run(filepath.Base(model), func(t *testing.T) {
			one := start(t, "one", "decode", "--model", model)
			reqs := pipelineRequests()[1:2] // the long prompt
			want := askAll(t, one.listen, reqs, false)
			one.stop()
			pf := start(t, "prefill", "prefill", "--model", model)
			// Only stage 0 is told the prefill runner (as the supervisor's
			// plan does); the later stage fetches from the one stage 0 names.
			pl := startPipelineWith(t, "pd", model, bounds, []string{"--prefill", pf.listen, "--remote-prefill-min-tokens", "16"})
			got := askAll(t, pl.stages[0].listen, reqs, false)
			if got[0].Text != want[0].Text {
				t.Errorf("remote prefill into the pipeline: %q, one runner %q", got[0].Text, want[0].Text)
			}
			if n := pl.stages[0].metric(t, outcome("ok")); n != 1 {
				t.Errorf("stage 0 counts %v remote prefills ok, want 1", n)
			}
		})
	}
}

// pipelineModelsNext is the Qwen3-Next reference model (Gated DeltaNet).
func pipelineModelsNext(t *testing.T) string {
	next, err := filepath.Abs(filepath.Join("..", "engine", "testdata", "reference", "qwen3_next"))
	if err != nil {
		t.Fatal(err)
	}
	return next
}
