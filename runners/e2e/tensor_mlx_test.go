package e2e

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/exo-pd/exo-pd/internal/testutil"
	"github.com/exo-pd/exo-pd/runners/stage"
	"github.com/exo-pd/exo-pd/runners/tensor"
)

// mlxRunner is the flags that put a runner on MLX's CPU device; it skips
// the test unless EXO_MLXC_PATH names libmlxc (these run by hand).
func mlxRunner(t *testing.T) []string {
	t.Helper()
	if os.Getenv("EXO_MLXC_PATH") == "" {
		t.Skip("by hand: set EXO_MLXC_PATH to libmlxc.so (README, \"Building MLX and mlx-c by hand\")")
	}
	return []string{"--backend", "mlx", "--device", "cpu"}
}

// TestTensorParallelTinyMLX is TestTensorParallelTiny's group on MLX's CPU
// device, by hand (EXO_MLXC_PATH names libmlxc): two rank processes sum
// over MLX's ring on loopback (the runner writes the hostfile from
// --tensor-peers) and answer as one MLX runner does, alone and four at
// once, at temperature 0 and seeded.
func TestTensorParallelTinyMLX(t *testing.T) {
	mlx := mlxRunner(t)
	dir := tinyModel(t, "main-long")
	ref := start(t, "tp-mlx-ref", "decode", append([]string{"--model", dir}, mlx...)...)
	g := startTensor(t, dir, 2, mlx...)
	checkTensorGroup(t, g, ref, []string{"hello there", words(11, 60)}, 2, true)
	checkTensorSums(t, g, "ring", "")
}

// TestTensorParallelTinyMLXLostRank: on MLX a killed rank ends the
// request in hand with an error naming the group, and rank 0 exits
// (contract C3: a process cannot join MLX's group again, so the whole
// group restarts). MLX 0.31.1 does not fail a collective whose peer died
// (runners/engine/mlx TestDistributedPeerLost): rank 0's step may stay in
// the ring all_sum for good, so the tensor link's loss ends the call in
// hand (the step left behind) and the runner leaves with syscall.Exit
// (status stage.ExitGroupLost, as a lost pipeline stage) once its
// requests have their error events. By hand (EXO_MLXC_PATH).
func TestTensorParallelTinyMLXLostRank(t *testing.T) {
	mlx := mlxRunner(t)
	g := startTensor(t, tinyModel(t, "main-long"), 2, mlx...)
	killRankMidStream(t, g)
	select {
	case <-g.ranks[0].done:
	case <-time.After(60 * time.Second):
		t.Fatalf("rank 0 on MLX still runs 60 s after rank 1 died:\n%s", g.ranks[0].logs())
	}
	if code := g.ranks[0].cmd.ProcessState.ExitCode(); code != stage.ExitGroupLost {
		t.Errorf("rank 0 exited with status %d, want %d (its MLX group lost):\n%s", code, stage.ExitGroupLost, g.ranks[0].logs())
	}
}

// TestTensorParallelRemotePrefillMLX is TestTensorParallelRemotePrefill
// with the ranks and the reference on MLX's CPU device: two rank processes
// fill their caches from a prefill runner, each fetching its own KV heads,
// and answer as one MLX runner with local prefill does, for both turns. By
// hand (EXO_MLXC_PATH).
func TestTensorParallelRemotePrefillMLX(t *testing.T) {
	checkTensorRemotePrefill(t, "tp-mlx", mlxRunner(t)...)
}

// TestTensorParallelTinyMLXJACCLFallback: ranks given a JACCL device
// matrix (--tensor-rdma) on a host whose libmlx has no JACCL (any but a
// Mac with RDMA enabled) say why on /health and exo_tensor_group
// (jaccl_unavailable) and join MLX's ring instead, answering
// as one MLX runner does. By hand (EXO_MLXC_PATH); not on macOS, where
// JACCL may be there and the fake devices would fail it.
func TestTensorParallelTinyMLXJACCLFallback(t *testing.T) {
	if runtime.GOOS == "darwin" {
		t.Skip("checks the fallback where JACCL is unavailable; macOS may have it")
	}
	mlx := mlxRunner(t)
	dir := tinyModel(t, "main-long")
	ref := start(t, "tp-mlx-jaccl-ref", "decode", append([]string{"--model", dir}, mlx...)...)
	g := startTensor(t, dir, 2, append(mlx, "--tensor-rdma", `[[null,"rdma_en3"],["rdma_en4",null]]`)...)
	checkTensorGroup(t, g, ref, []string{"hello there"}, 2, true)
	checkTensorSums(t, g, "ring", tensor.ReasonNoJACCL)
}

// TestTensorPrefillMLX is TestTensorPrefill on MLX's CPU device, by hand
// (EXO_MLXC_PATH names libmlxc), for the tiny dense model and the tiny
// MoE: two prefill rank processes sum over MLX's ring on loopback and each
// serves its KV heads; a one-process MLX decode runner (its heads spanning
// both ranks) and a 2-rank MLX decode group (each rank asking the prefill
// rank of its heads) answer as one MLX runner with local prefill does, and
// the prefill ranks send equal shares of the bytes.
func TestTensorPrefillMLX(t *testing.T) {
	mlx := mlxRunner(t)
	for _, model := range []string{"main", "moe"} {
		t.Run(model, func(t *testing.T) {
			dir := tinyModel(t, model)
			ref := start(t, "tpp-mlx-ref", "decode", append([]string{"--model", dir}, mlx...)...)
			pg := startTensorPrefill(t, dir, 2, 2, mlx...)
			for r, p := range pg.ranks {
				if l := p.records("model loaded"); len(l) != 1 || l[0]["backend"] != "mlx-cpu" {
					t.Fatalf("prefill rank %d loaded %v, want one model on mlx-cpu", r, l)
				}
			}
			bytes := pg.served(t)
			one := start(t, "tpp-mlx-one", "decode", append([]string{"--model", dir, "--prefill", pg.list(true)}, mlx...)...)
			checkRemoteEqualsLocal(t, "MLX: 2-rank prefill into one decode runner", one, ref, 800)
			now := checkShares(t, "MLX: into one decode runner", pg, bytes)
			one.stop()
			dg := startTensor(t, dir, 2, append([]string{"--prefill", pg.list(true), "--remote-prefill-route", "floor"}, mlx...)...)
			checkRemoteEqualsLocal(t, "MLX: 2-rank prefill into a 2-rank decode group", dg.ranks[0], ref, 900)
			checkShares(t, "MLX: into a 2-rank decode group", pg, now)
			for r, p := range pg.ranks {
				if n := p.metric(t, fmt.Sprintf(`exo_tensor_allsum_total{model="m",rank="%d"}`, r)); n == 0 {
					t.Errorf("prefill rank %d ran no all_sums", r)
				}
			}
		})
	}
}

// TestTensorBackendMismatchMLX: a group whose rank 0 runs MLX and whose
// follower runs cpu (and the reverse) does not wait in MLX's join for
// ever: the ranks link first and each side refuses the other. The MLX
// rank exits with an error (status 1; the supervisor restarts it) without
// joining MLX's group; the cpu rank stays up, its /health degraded and
// naming the refusal (tensor.ErrMismatch, the MLX rank's backend) even
// once the MLX rank is gone. By hand (EXO_MLXC_PATH).
func TestTensorBackendMismatchMLX(t *testing.T) {
	mlx := mlxRunner(t)
	dir := tinyModel(t, "main-long")
	for _, mlxRank := range []int{0, 1} {
		t.Run(fmt.Sprintf("mlx-rank%d", mlxRank), func(t *testing.T) {
			peers := strings.Join([]string{freeAddr(t), freeAddr(t)}, ",")
			ranks := make([]*proc, 2)
			for r := range 2 {
				p := &proc{t: t, name: fmt.Sprintf("tp-mismatch-rank%d", r), done: make(chan struct{})}
				p.listen = freeAddr(t)
				p.http = p.listen
				args := []string{"runner", "decode", "--listen", p.listen, "--served-name", "m", "--backend", "cpu", "--offline",
					"--model", dir, "--tensor", fmt.Sprintf("%d/2", r), "--tensor-peers", peers}
				if r == mlxRank {
					args = append(args, mlx...)
				}
				p.launch(t, args, p.name, 4000)
				ranks[r] = p
			}
			select {
			case <-ranks[mlxRank].done:
			case <-time.After(120 * time.Second): // MLX's join would wait its 2 min bound
				t.Fatalf("the MLX rank %d still runs 120 s after its cpu peer linked:\n%s", mlxRank, ranks[mlxRank].logs())
			}
			if code := ranks[mlxRank].cmd.ProcessState.ExitCode(); code != 1 {
				t.Errorf("the MLX rank exited with status %d, want 1 (an error: refused by its group)\n%s", code, tail(ranks[mlxRank].logs(), 3000))
			}
			if joined := ranks[mlxRank].records("tensor: every rank linked: joining MLX's group"); len(joined) != 0 {
				t.Errorf("the MLX rank went on to join MLX's group: %v", joined)
			}
			cpuRank := 1 - mlxRank
			var code int
			var body map[string]any
			testutil.Eventually(t, func() bool {
				code, body = health(ranks[cpuRank])
				return code == 503 && strings.Contains(fmt.Sprint(body["error"]), tensor.ErrMismatch.Error())
			}, 60*time.Second, "the cpu rank %d's /health is 503 naming the refusal", cpuRank)
			if body["status"] != "degraded" || !strings.Contains(fmt.Sprint(body["error"]), fmt.Sprintf("rank %d runs backend mlx-cpu", mlxRank)) {
				t.Errorf("the cpu rank's /health %v: want degraded, naming rank %d's backend mlx-cpu", body, mlxRank)
			}
			if tg, _ := body["tensor_group"].(map[string]any); tg["group"] != "link" {
				t.Errorf("the cpu rank's /health tensor_group %v, want group link", body["tensor_group"])
			}
		})
	}
}
