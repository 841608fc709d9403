package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/exo-pd/exo-pd/internal/testutil"
)

// TestPipelineRingHosts: three and four supervisors (127.0.0.2–.5) run a
// decode pipeline of as many stages and answer as one runner. With
// EXO_E2E_HOST_BACKEND=mlx-cpu (by hand, EXO_MLXC_PATH) each supervisor
// writes MLX's ring hostfile and starts its stage with MLX_HOSTFILE and
// MLX_RANK, and the stages carry their hidden states over MLX's ring (four
// stages too, where a stage sees only its neighbours' Hellos): each stage
// reports transport="mlx" bytes, each byte a stage sent received by the
// next, and exo doctor's stage MLX ring check passes. On cpu nothing goes
// over MLX's ring and doctor has no such check.
func TestPipelineRingHosts(t *testing.T) {
	if testing.Short() {
		t.Skip("builds exo and runs real runners")
	}
	allNames := []string{"spark", "mac", "studio", "mini"}
	allAddrs := []string{"127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"}
	needAddrs(t, allAddrs...)
	root, dir, exe, _ := buildExoAndModel(t)
	model := filepath.Join(dir, "tiny4")
	run(t, root, "go", "run", "./runners/engine/testmodel/cmd/gen", "-arch", "llama", "-layers", "4", model)
	cfgPath, secret := filepath.Join(dir, "cluster.toml"), filepath.Join(dir, "secret")
	if err := os.WriteFile(secret, []byte("e2e secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	prompts := []string{"hello there, how are you today?", "Tell me a story about a ring of three."}
	want := oneRunnerAnswers(t, exe, dir, cfgPath, model, secret, prompts)
	for _, n := range []int{3, 4} {
		t.Run(fmt.Sprintf("%d-stages", n), func(t *testing.T) {
			ringHosts(t, exe, dir, cfgPath, model, secret, allNames[:n], allAddrs[:n], prompts, want)
		})
	}
}

// ringHosts runs a pipeline with one stage on each of names and checks it
// (TestPipelineRingHosts).
func ringHosts(t *testing.T, exe, dir, cfgPath, model, secret string, names, addrs, prompts, want []string) {
	hosts := `"` + strings.Join(names, `", "`) + `"`
	base, apiPort := freePort(t), freePort(t)
	src := hostsCluster(base, apiPort, model, secret, names, addrs, `{ hosts = [`+hosts+`], shard = "pipeline" }`)
	if err := os.WriteFile(cfgPath, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	var stages []string
	var wants [][]string
	for i := range names {
		stages = append(stages, fmt.Sprintf("tiny-decode-stage%d", i))
		wants = append(wants, []string{stages[i]})
	}
	hs, _ := startHosts(t, exe, dir, cfgPath, apiPort, names, addrs, wants)
	for i, p := range prompts {
		if _, text := chatText(t, hs[0].api, p); text != want[i] {
			t.Errorf("prompt %d: %d stages %q, one runner %q", i, len(names), text, want[i])
		}
	}
	mlx := hostBackend() != "cpu"
	var sent, recv []float64
	for i, h := range hs {
		m := stageMetrics(t, h, stages[i])
		s, r := m[`direction="sent"`], m[`direction="received"`]
		t.Logf("%s: hidden-state bytes over MLX's ring: %v sent, %v received", stages[i], s, r)
		sent, recv = append(sent, s), append(recv, r)
		want := "tcp/cpu_backend"
		if mlx {
			want = "mlx/"
		}
		if got := stageTransport(t, h, stages[i]); got != want {
			t.Errorf("%s: exo_stage_transport %q, want %q (see %s)", stages[i], got, want, h.log)
		}
	}
	for i := range hs {
		next := (i + 1) % len(hs)
		if i == len(hs)-1 {
			continue // the last stage sends only tokens back, on the stage link
		}
		switch {
		case mlx && (sent[i] <= 0 || sent[i] != recv[next]):
			t.Errorf("stage %d sent %v bytes over MLX's ring, stage %d received %v: want equal and > 0", i, sent[i], next, recv[next])
		case !mlx && (sent[i] != 0 || recv[next] != 0):
			t.Errorf("cpu stages: %v / %v bytes over MLX's ring", sent[i], recv[next])
		}
	}
	// exo doctor on each host probes the next stage's ring port (joined:
	// nothing listens, the host answers) beside its stage link.
	for _, h := range hs {
		rep, _ := doctor(t, exe, "--config", cfgPath, "--host", h.name, "--probe-mib", "0")
		rep.expect(t, "stage link ", "ok", "")
		if !mlx {
			if cs := rep.find("stage MLX ring"); len(cs) != 0 {
				t.Errorf("doctor on %s (cpu): %+v", h.name, cs)
			}
			continue
		}
		rep.expect(t, "stage MLX ring ", "ok", "")
		for _, c := range rep.find("stage MLX ring") {
			t.Logf("doctor on %s: %s: %s", h.name, c.Name, c.Detail)
		}
	}
}

// runnerMetrics returns the /metrics lines of the runner name on h (its
// HTTP address from h's /exo/status: a decode runner's listen, a prefill
// runner's metrics).
func runnerMetrics(t *testing.T, h *host, name string) []string {
	t.Helper()
	resp, err := http.Get("http://" + h.api + "/exo/status")
	if err != nil {
		t.Fatal(err)
	}
	var st struct {
		Runners []struct {
			Spec struct {
				Name    string `json:"name"`
				Listen  string `json:"listen"`
				Metrics string `json:"metrics"`
			} `json:"spec"`
		} `json:"runners"`
	}
	err = json.NewDecoder(resp.Body).Decode(&st)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	addr := ""
	for _, r := range st.Runners {
		if r.Spec.Name == name {
			addr = r.Spec.Listen
			if r.Spec.Metrics != "" {
				addr = r.Spec.Metrics
			}
		}
	}
	if addr == "" {
		t.Fatalf("%s does not run %s: %+v", h.name, name, st)
	}
	resp, err = http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var lines []string
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	return lines
}

// stageMetrics sums the runner name's hidden-state bytes over MLX's ring
// (exo_stage_link_bytes_total{transport="mlx"}) by direction.
func stageMetrics(t *testing.T, h *host, name string) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for _, line := range runnerMetrics(t, h, name) {
		if !strings.HasPrefix(line, "exo_stage_link_bytes_total{") || !strings.Contains(line, `transport="mlx"`) {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("%s: %q: %v", name, line, err)
		}
		for _, d := range []string{`direction="sent"`, `direction="received"`} {
			if strings.Contains(line, d) {
				out[d] += v
			}
		}
	}
	return out
}

// stageTransport is the runner name's exo_stage_transport series whose
// value is 1, as "transport/reason" ("" when none); h's /exo/status
// (the runner's /health as the supervisor last polled it) must come to say
// the same, or the test fails.
func stageTransport(t *testing.T, h *host, name string) string {
	t.Helper()
	got := metricTransport(t, h, name)
	var seen string
	if !testutil.Until(30*time.Second, func() bool { seen = statusTransport(t, h, name); return seen == got }) {
		t.Errorf("%s on %s: /exo/status stage_transport %q, its exo_stage_transport %q", name, h.name, seen, got)
	}
	return got
}

// statusTransport is the runner name's stage_transport in h's
// /exo/status, as "transport/reason".
func statusTransport(t *testing.T, h *host, name string) string {
	t.Helper()
	resp, err := http.Get("http://" + h.api + "/exo/status")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st struct {
		Runners []struct {
			Spec struct {
				Name string `json:"name"`
			} `json:"spec"`
			Status struct {
				Health *struct {
					StageTransport *struct{ Transport, Reason string } `json:"stage_transport"`
				} `json:"health"`
			} `json:"status"`
		} `json:"runners"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatal(err)
	}
	for _, r := range st.Runners {
		if r.Spec.Name == name && r.Status.Health != nil && r.Status.Health.StageTransport != nil {
			return r.Status.Health.StageTransport.Transport + "/" + r.Status.Health.StageTransport.Reason
		}
	}
	return ""
}

// metricTransport is the runner name's exo_stage_transport series whose
// value is 1, as "transport/reason" ("" when none).
func metricTransport(t *testing.T, h *host, name string) string {
	t.Helper()
	for _, line := range runnerMetrics(t, h, name) {
		if !strings.HasPrefix(line, "exo_stage_transport{") || !strings.HasSuffix(line, "} 1") {
			continue
		}
		label := func(k string) string {
			_, v, _ := strings.Cut(line, k+`="`)
			v, _, _ = strings.Cut(v, `"`)
			return v
		}
		return label("transport") + "/" + label("reason")
	}
	return ""
}
