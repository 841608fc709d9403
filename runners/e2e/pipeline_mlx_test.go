package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/exo-pd/exo-pd/internal/testutil"
	"github.com/exo-pd/exo-pd/runners/internal/testenv"
	"github.com/exo-pd/exo-pd/runners/stage"
)

// mlxFlags run a runner on MLX's CPU device.
var mlxFlags = []string{"--backend", "mlx", "--device", "cpu"}

// startPipelineMLX starts a pipeline of model cut at bounds on MLX's CPU
// device, real exo processes on loopback: the stage links on every other
// port, so that each stage's MLX ring (its link port + 1) has its own.
// Two stages write their ring hostfile from their flags; three get
// MLX_HOSTFILE and MLX_RANK, as the runner requires there.
func startPipelineMLX(t *testing.T, name, model string, bounds []int, extra ...string) *pipeline {
	t.Helper()
	N := len(bounds) - 1
	pl := &pipeline{bounds: bounds, model: model, extra: append(append([]string{}, mlxFlags...), extra...)}
	base := testutil.Ports(t, 3*N)
	var ring [][]string
	for i := range N {
		pl.links = append(pl.links, fmt.Sprintf("127.0.0.1:%d", base+2*i))
		ring = append(ring, []string{fmt.Sprintf("127.0.0.1:%d", base+2*i+1)})
	}
	var hostfile string
	if N > 2 {
		raw, err := json.Marshal(ring)
		if err != nil {
			t.Fatal(err)
		}
		hostfile = filepath.Join(t.TempDir(), "hosts.json")
		if err := os.WriteFile(hostfile, raw, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for i := range N {
		listen := fmt.Sprintf("127.0.0.1:%d", base+2*N+i)
		pl.stages = append(pl.stages, launchStageEnv(t, name, model, i, bounds, pl.links, listen, pl.extra, hostfile))
	}
	waitHealthy(t, pl.stages...)
	return pl
}

// launchStageEnv is launchStage with MLX_HOSTFILE and MLX_RANK (when
// hostfile is set).
func launchStageEnv(t *testing.T, name, model string, i int, bounds []int, links []string, listen string, extra []string, hostfile string) *proc {
	t.Helper()
	if hostfile == "" {
		return launchStage(t, name, model, i, bounds, links, listen, extra)
	}
	N := len(bounds) - 1
	p := &proc{t: t, name: fmt.Sprintf("%s-stage%d", name, i), done: make(chan struct{}), listen: listen, http: listen,
		env: []string{"MLX_HOSTFILE=" + hostfile, "MLX_RANK=" + strconv.Itoa(i)}}
	args := []string{"runner", "decode", "--listen", listen, "--served-name", "m", "--backend", "cpu", "--offline", "--model", model,
		"--layers", fmt.Sprintf("%d:%d", bounds[i], bounds[i+1]), "--stage", fmt.Sprintf("%d/%d", i, N),
		"--stage-listen", links[i], "--stage-next", links[(i+1)%N]}
	p.launch(t, append(args, extra...), p.name, 4000)
	return p
}

// mlxCarried is a stage's hidden-state bytes over MLX's ring.
func mlxCarried(t *testing.T, p *proc, stage int, direction string) float64 {
	return p.metric(t, fmt.Sprintf(`exo_stage_link_bytes_total{direction=%q,model="m",stage="%d",transport="mlx"}`, direction, stage))
}

// checkMLXPipeline asks pl's stage 0 the requests (alone, and at once
// when concurrent) and expects want's texts; every stage's hidden states
// went over MLX's ring, each byte sent received by the next stage.
func checkMLXPipeline(t *testing.T, pl *pipeline, reqs []pipeReq, want []chatResult, concurrent bool) {
	t.Helper()
	modes := []bool{false}
	if concurrent {
		modes = append(modes, true)
	}
	for _, c := range modes {
		got := askAll(t, pl.stages[0].listen, reqs, c)
		for i := range want {
			if got[i].Text != want[i].Text || got[i].Completion != want[i].Completion {
				t.Errorf("request %d (concurrent %v): MLX pipeline %q (%d tokens), one MLX runner %q (%d)", i, c,
					got[i].Text, got[i].Completion, want[i].Text, want[i].Completion)
			}
		}
	}
	N := len(pl.stages)
	for i := range N - 1 {
		sent, recv := mlxCarried(t, pl.stages[i], i, "sent"), mlxCarried(t, pl.stages[i+1], i+1, "received")
		if sent <= 0 || sent != recv {
			t.Errorf("stage %d sent %v hidden-state bytes over MLX's ring, stage %d received %v: want equal and > 0", i, sent, i+1, recv)
		}
	}
	for i, s := range pl.stages {
		checkStageTransport(t, s, i, "mlx", "")
	}
}

// TestPipelineMLX: 2 and 3 stage processes on MLX's CPU device carry the
// hidden states over MLX's ring on loopback (send to the next rank, recv
// from the previous one; the stage link carries the rest) and answer as
// one MLX runner does, at temperature 0 and seeded, alone and four at
// once. By hand (EXO_MLXC_PATH).
func TestPipelineMLX(t *testing.T) {
	if os.Getenv("EXO_MLXC_PATH") == "" {
		t.Skip("by hand: set EXO_MLXC_PATH to libmlxc.so (README, \"Building MLX and mlx-c by hand\")")
	}
	for _, tc := range []struct {
		model  string
		bounds []int
	}{
		{tinyModel(t, "main"), []int{0, 1, 2}},
		{tinyModel(t, "other"), []int{0, 1, 2, 3}},
	} {
		t.Run(fmt.Sprintf("%s/%d-stages", filepath.Base(tc.model), len(tc.bounds)-1), func(t *testing.T) {
			ref := start(t, "pipe-mlx-ref", "decode", append([]string{"--model", tc.model}, mlxFlags...)...)
			want := askAll(t, ref.listen, pipelineRequests(), false)
			ref.stop()
			pl := startPipelineMLX(t, "pipe-mlx", tc.model, tc.bounds)
			checkMLXPipeline(t, pl, pipelineRequests(), want, true)
		})
	}
}

// TestPipelineMLXSmolLM2: SmolLM2 (GGUF Q4_1) in two stages on MLX's ring
// answers as one MLX runner does, greedy and seeded. By hand
// (EXO_MLXC_PATH); MLX's CPU device is slow at quantized matmuls here, so
// two requests alone.
func TestPipelineMLXSmolLM2(t *testing.T) {
	if os.Getenv("EXO_MLXC_PATH") == "" {
		t.Skip("by hand: set EXO_MLXC_PATH to libmlxc.so (README, \"Building MLX and mlx-c by hand\")")
	}
	gguf := testenv.SmolLM2(t)
	reqs := pipelineRequests()[:2]
	ref := start(t, "smol-mlx-ref", "decode", append([]string{"--model", gguf}, mlxFlags...)...)
	want := askAll(t, ref.listen, reqs, false)
	ref.stop()
	pl := startPipelineMLX(t, "smol-mlx", gguf, []int{0, 13, 30})
	checkMLXPipeline(t, pl, reqs, want, false)
}

// TestPipelineMLXStageKilled: kill -9 of stage 1 of an MLX pipeline mid
// stream ends the request with an error (no hang), and stage 0 exits
// with stage.ExitGroupLost: its MLX group cannot be joined again, so every
// stage restarts (the supervisor's part). By hand (EXO_MLXC_PATH).
func TestPipelineMLXStageKilled(t *testing.T) {
	if os.Getenv("EXO_MLXC_PATH") == "" {
		t.Skip("by hand: set EXO_MLXC_PATH to libmlxc.so (README, \"Building MLX and mlx-c by hand\")")
	}
	pl := startPipelineMLX(t, "pipe-mlx-kill", tinyModel(t, "main-long"), []int{0, 1, 2})
	res := make(chan chatResult, 1)
	go func() {
		res <- goChat(pl.stages[0].listen, user("Tell me a long story."), 100000, map[string]any{"ignore_eos": true})
	}()
	// Decoding: stage 1 (the last) has computed 20 steps (the prompt is
	// one or two), each of whose input came over MLX's ring.
	testutil.Eventually(t, func() bool {
		return pl.stages[1].metricPrefix(t, "exo_stage_step_seconds_count") >= 20 && mlxCarried(t, pl.stages[1], 1, "received") > 0
	}, time.Minute, "the request decodes")
	pl.stages[1].cmd.Process.Kill()
	select {
	case r := <-res:
		if r.Status == 200 && r.Done && r.ErrorBody == "" {
			t.Fatalf("a request whose stage 1 was killed ended well: %+v", r)
		}
		t.Logf("the request ended with: status %d, error %q", r.Status, r.ErrorBody)
	case <-time.After(2 * time.Minute):
		t.Fatal("the request still streams 2 minutes after stage 1 was killed")
	}
	select {
	case <-pl.stages[0].done:
	case <-time.After(time.Minute):
		t.Fatalf("stage 0 still runs a minute after its MLX group lost stage 1:\n%s", tail(pl.stages[0].logs(), 3000))
	}
	if code := pl.stages[0].cmd.ProcessState.ExitCode(); code != stage.ExitGroupLost {
		t.Errorf("stage 0 exited with status %d, want %d (its MLX group lost):\n%s", code, stage.ExitGroupLost, tail(pl.stages[0].logs(), 3000))
	}
}

// TestPipelineMLXFallback: a pipeline whose stage 1 runs on the cpu
// backend keeps every stage on the stage link (TCP): each stage's /health
// and exo_stage_transport say why (stage 0, on MLX: its neighbour does not
// offer the group; stage 1: the cpu backend), nothing goes over MLX's
// ring, and requests are answered. By hand (EXO_MLXC_PATH).
func TestPipelineMLXFallback(t *testing.T) {
	if os.Getenv("EXO_MLXC_PATH") == "" {
		t.Skip("by hand: set EXO_MLXC_PATH to libmlxc.so (README, \"Building MLX and mlx-c by hand\")")
	}
	model, bounds := tinyModel(t, "main"), []int{0, 1, 2}
	base := testutil.Ports(t, 6)
	links := []string{fmt.Sprintf("127.0.0.1:%d", base), fmt.Sprintf("127.0.0.1:%d", base+2)}
	pl := &pipeline{bounds: bounds, model: model, links: links}
	pl.stages = append(pl.stages,
		launchStage(t, "pipe-mixed", model, 0, bounds, links, fmt.Sprintf("127.0.0.1:%d", base+4), mlxFlags),
		launchStage(t, "pipe-mixed", model, 1, bounds, links, fmt.Sprintf("127.0.0.1:%d", base+5), nil))
	waitHealthy(t, pl.stages...)
	askAll(t, pl.stages[0].listen, pipelineRequests()[:2], false)
	if n := mlxCarried(t, pl.stages[0], 0, "sent"); n != 0 {
		t.Errorf("stage 0 sent %v bytes over MLX's ring beside a cpu stage", n)
	}
	checkStageTransport(t, pl.stages[0], 0, "tcp", stage.ReasonPeer)
	checkStageTransport(t, pl.stages[1], 1, "tcp", stage.ReasonCPUBackend)
}

// TestPrefillPipelineMLX: a 2-stage prefill pipeline on MLX's CPU device
// carries its hidden states over MLX's ring (each stage's ring on its
// stage link port + 1, the hostfile written by the runners) and fills a
// one-process MLX decode runner, whose answer equals its own local
// prefill's at temperature 0; each prefill stage counts the carried bytes
// (transport "mlx": stage 0 sent what stage 1 received). By hand
// (EXO_MLXC_PATH).
func TestPrefillPipelineMLX(t *testing.T) {
	if os.Getenv("EXO_MLXC_PATH") == "" {
		t.Skip("by hand: set EXO_MLXC_PATH to libmlxc.so (README, \"Building MLX and mlx-c by hand\")")
	}
	model := tinyModel(t, "other") // 3 layers
	reqs := []pipeReq{{user(words(5, 60)), 12, map[string]any{"temperature": 0, "ignore_eos": true}}}
	one := start(t, "pf-mlx-one", "decode", append([]string{"--model", model}, mlxFlags...)...)
	want := askAll(t, one.listen, reqs, false)
	one.stop()
	bounds := []int{0, 1, 3}
	base := testutil.Ports(t, 8)
	links := []string{fmt.Sprintf("127.0.0.1:%d", base), fmt.Sprintf("127.0.0.1:%d", base+2)} // base+1, base+3: the rings
	var pst []*proc
	for i := range 2 {
		pst = append(pst, launchPrefillStage(t, "pf-mlx", model, i, bounds, links,
			fmt.Sprintf("127.0.0.1:%d", base+4+2*i), fmt.Sprintf("127.0.0.1:%d", base+5+2*i), mlxFlags...))
	}
	waitHealthy(t, pst...)
	list := fmt.Sprintf("%s@0:1,%s@1:3", pst[0].listen, pst[1].listen)
	d := start(t, "pf-mlx-d", "decode", append([]string{"--model", model, "--prefill", list, "--remote-prefill-min-tokens", "16"}, mlxFlags...)...)
	if got := askAll(t, d.listen, reqs, false); got[0].Text != want[0].Text {
		t.Errorf("2-stage MLX prefill into one MLX runner: %q, local %q", got[0].Text, want[0].Text)
	}
	if n := d.metric(t, outcome("ok")); n != 1 {
		t.Errorf("the decode runner counts %v remote prefills ok, want 1\n%s", n, tail(d.logs(), 3000))
	}
	sent := pst[0].metric(t, `exo_stage_link_bytes_total{direction="sent",model="m",stage="0",transport="mlx"}`)
	recv := pst[1].metric(t, `exo_stage_link_bytes_total{direction="received",model="m",stage="1",transport="mlx"}`)
	if sent <= 0 || recv != sent {
		t.Errorf("prefill stage 0 sent %v bytes over MLX's ring, stage 1 received %v", sent, recv)
	}
	t.Logf("prefill stage 0 sent %v hidden-state bytes over MLX's ring, stage 1 received %v", sent, recv)
	for i, p := range pst {
		checkStageTransport(t, p, i, "mlx", "")
	}
}
