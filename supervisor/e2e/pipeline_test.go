package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/exo-pd/exo-pd/internal/testutil"
)

// chatText asks api for a greedy completion of prompt and returns the
// runner that served it and the text.
func chatText(t *testing.T, api, prompt string) (string, string) {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"model": "tiny", "messages": []map[string]string{{"role": "user", "content": prompt}},
		"max_tokens": 12, "temperature": 0})
	resp, err := http.Post("http://"+api+"/v1/chat/completions", "application/json", strings.NewReader(string(body)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var v struct {
		Choices []struct {
			Message struct{ Content string }
		}
	}
	if resp.StatusCode != 200 || json.Unmarshal(b, &v) != nil || len(v.Choices) != 1 {
		t.Fatalf("chat via %s: %d %s", api, resp.StatusCode, b)
	}
	return resp.Header.Get("X-Exo-Runner"), v.Choices[0].Message.Content
}

// tryChat is chatText that reports the status and body instead of failing.
// Its request may take up to 10 minutes (one that waits out a group's
// 2-minute join still answers, as callers polling with Until expect).
func tryChat(api, prompt string) (code int, text, body string) {
	code, s, body := postChat(&http.Client{Timeout: 10 * time.Minute}, api, prompt)
	return code, s.text, body
}

// stopHost ends h's supervisor with SIGTERM and waits for it.
func stopHost(t *testing.T, h *host) {
	t.Helper()
	if _, exited := h.stop(30 * time.Second); !exited {
		t.Fatalf("%s did not exit after SIGTERM", h.name)
	}
}

// hostBackend is the backend of both hosts: cpu, or $EXO_E2E_HOST_BACKEND
// (e.g. "mlx-cpu" by hand with EXO_MLXC_PATH set: the sharded tests then run
// MLX ranks and stages, compared with one MLX runner).
func hostBackend() string {
	if b := os.Getenv("EXO_E2E_HOST_BACKEND"); b != "" {
		return b
	}
	return "cpu"
}

func pipelineCluster(base, apiPort int, model, secret, decode string) string {
	return fmt.Sprintf(`[cluster]
name = "e2e"
runner_port_base = %[1]d
secret_file = %[2]q

[api]
port = %[3]d

[hosts.spark]
address = "127.0.0.2"
backend = %[6]q

[hosts.mac]
address = "127.0.0.3"
backend = %[6]q

[[models]]
name = "tiny"
source = %[4]q
decode = %[5]s
`, base, secret, apiPort, model, decode, hostBackend())
}

// TestPipelineTwoHosts: the tiny model split into two pipeline stages by two
// real supervisors (spark 127.0.0.2 holds stage 0, mac 127.0.0.3 stage 1,
// layers split by memory from the model's headers) answers through both
// gateways exactly as one decode runner holding the whole model does, at
// temperature 0; both gateways route to stage 0.
func TestPipelineTwoHosts(t *testing.T) {
	shardedTwoHosts(t, `{ hosts = ["spark", "mac"], shard = "pipeline" }`, "stage-next", "tiny-decode-stage0", "tiny-decode-stage1")
}

// TestTensorTwoHosts: the same with two tensor-parallel ranks (contract
// C3: rank 0 on spark serves the API, rank 1 on mac holds the other half
// of every layer).
func TestTensorTwoHosts(t *testing.T) {
	shardedTwoHosts(t, `{ hosts = ["spark", "mac"], shard = "tensor" }`, "tensor-peers", "tiny-decode-rank0", "tiny-decode-rank1")
}

// TestTensorTwoHostsRemotePrefill: tensor ranks on spark and mac, every
// prompt prefilled by spark's prefill runner (each rank fetching its own KV
// heads), answer as one runner with local prefill does.
func TestTensorTwoHostsRemotePrefill(t *testing.T) {
	shardedTwoHosts(t, `{ hosts = ["spark", "mac"], shard = "tensor" }
prefill = { hosts = ["spark"] }
remote_prefill_min_tokens = 1
remote_prefill_route = "floor"`, "tensor-peers", "tiny-decode-rank0", "tiny-decode-rank1")
}

// TestPipelineTwoHostsRemotePrefill: two pipeline stages (stage 0 on
// spark, stage 1 on mac, each given the prefill runner by the plan) fill
// every prompt, a long one among them, from spark's prefill runner — stage
// 0 its layers, then stage 1 its own layer range over the KV wire — and
// answer as one runner with local prefill does; stage 0 counts every fill
// ok (a later stage's failure would count as a fallback) and none other.
func TestPipelineTwoHostsRemotePrefill(t *testing.T) {
	shardedTwoHosts(t, `{ hosts = ["spark", "mac"], shard = "pipeline" }
prefill = { hosts = ["spark"] }
remote_prefill_min_tokens = 1
remote_prefill_route = "floor"`, "stage-next", "tiny-decode-stage0", "tiny-decode-stage1")
}

// oneRunnerAnswers is the reference: the greedy answers to prompts of one
// decode runner holding the whole model on spark, with local prefill (its
// supervisor is stopped before it returns; cfgPath is overwritten).
func oneRunnerAnswers(t *testing.T, exe, dir, cfgPath, model, secret string, prompts []string) []string {
	t.Helper()
	base, apiPort := freePort(t), freePort(t)
	if err := os.WriteFile(cfgPath, []byte(pipelineCluster(base, apiPort, model, secret, `{ hosts = ["spark"] }`)), 0o644); err != nil {
		t.Fatal(err)
	}
	one := startHost(t, exe, dir, cfgPath, "spark", "127.0.0.2", apiPort)
	one.waitRunners(t, "tiny-decode")
	var want []string
	for _, p := range prompts {
		_, text := chatText(t, one.api, p)
		if text == "" {
			t.Fatalf("one runner answered %q with nothing", p)
		}
		want = append(want, text)
	}
	stopHost(t, one)
	return want
}

// shardedTwoHosts runs the tiny model (4 layers) first as one decode runner
// on spark, then sharded by decode over spark and mac (whose runners are
// sparkRunner and macRunner), and compares greedy answers through both
// gateways; flag is the runner flag the shard needs (skip without it).
func shardedTwoHosts(t *testing.T, decode, flag, sparkRunner, macRunner string) {
	if testing.Short() {
		t.Skip("builds exo and runs real runners")
	}
	needLoopbackHosts(t)
	root, dir, exe, _ := buildExoAndModel(t)
	if out, _ := exec.Command(exe, "runner", "decode", "--help").CombinedOutput(); !strings.Contains(string(out), flag) {
		t.Skipf("exo runner decode has no --%s", flag)
	}
	model := filepath.Join(dir, "tiny4")
	run(t, root, "go", "run", "./runners/engine/testmodel/cmd/gen", "-arch", "llama", "-layers", "4", model)
	cfgPath, secret := filepath.Join(dir, "cluster.toml"), filepath.Join(dir, "secret")
	if err := os.WriteFile(secret, []byte("e2e secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	prompts := []string{"hello there, how are you today?", "Tell me a story about a pipeline.", "1 2 3 4 5 6 7 8 9 10 11 12 13"}
	remote := strings.Contains(decode, "prefill =")
	if remote { // a long prompt too
		prompts = append(prompts, strings.Repeat("A long prompt that the prefill runner computes for every stage. ", 10)) // about 320 of the 512-token context
	}

	want := oneRunnerAnswers(t, exe, dir, cfgPath, model, secret, prompts)

	// Sharded over two supervisors.
	base, apiPort := freePort(t), freePort(t)
	if err := os.WriteFile(cfgPath, []byte(pipelineCluster(base, apiPort, model, secret, decode)), 0o644); err != nil {
		t.Fatal(err)
	}
	spark, mac := startTwoHosts(t, exe, dir, cfgPath, apiPort)
	if remote {
		spark.waitRunners(t, sparkRunner, "tiny-prefill")
	} else {
		spark.waitRunners(t, sparkRunner)
	}
	macPIDs := mac.waitRunners(t, macRunner)
	for _, h := range []*host{spark, mac} {
		for i, p := range prompts {
			runner, text := chatText(t, h.api, p)
			if runner != "spark/"+sparkRunner {
				t.Errorf("via %s: served by %q, want spark/%s", h.name, runner, sparkRunner)
			}
			if text != want[i] {
				t.Errorf("via %s, prompt %d: sharded %q, one runner %q", h.name, i, text, want[i])
			}
		}
	}
	if flag == "stage-next" {
		// On MLX the stages carry their hidden states over MLX's ring; on
		// cpu they stay on the stage link.
		want := "tcp/cpu_backend"
		if hostBackend() != "cpu" {
			want = "mlx/"
		}
		for h, runner := range map[*host]string{spark: sparkRunner, mac: macRunner} {
			if got := stageTransport(t, h, runner); got != want {
				t.Errorf("%s on %s: exo_stage_transport %q, want %q (see %s)", runner, h.name, got, want, h.log)
			}
		}
	}
	if n := remotePrefillOK(t, spark.api); remote && n < float64(2*len(prompts)) {
		t.Errorf("remote prefill ok = %v on spark, want every one of the %d requests (counted before the kill below: on MLX a lost rank restarts the whole group, rank 0 and its counters too)", n, 2*len(prompts))
	}
	if remote {
		t.Logf("remote prefill outcomes: spark %v, mac %v", remotePrefillOutcomes(t, spark.api), remotePrefillOutcomes(t, mac.api))
		for outcome, n := range remotePrefillOutcomes(t, spark.api) {
			if outcome != "ok" && n > 0 {
				t.Errorf("remote prefill outcome %q = %v on spark, want only ok", outcome, n)
			}
		}
	}
	// exo doctor on each host checks the links its runners send on:
	// reachable, latency, and goodput from the far host's supervisor.
	kind := map[string]string{"stage-next": "stage link", "tensor-peers": "tensor link"}[flag]
	for _, h := range []*host{spark, mac} {
		if kind == "tensor link" && h == spark {
			continue // rank 0 dials no one
		}
		rep, _ := doctor(t, exe, "--config", cfgPath, "--host", h.name, "--probe-mib", "4")
		rep.expect(t, kind+" ", "ok", "")
		for _, c := range rep.find(kind + " ") {
			t.Logf("doctor on %s: %s: %s", h.name, c.Name, c.Detail)
			if c.Data["goodput_gbps"] == nil || c.Data["latency_s"] == nil {
				t.Errorf("%s: %s lacks goodput or latency: %+v", h.name, c.Name, c)
			}
		}
	}
	// kill -9 of mac's runner: mac's supervisor starts it again, the group
	// re-forms, and the next request through mac's gateway answers as before.
	syscall.Kill(macPIDs[macRunner], syscall.SIGKILL)
	waitRestarted(t, mac, macRunner, macPIDs[macRunner])
	spark.waitRunners(t, append([]string{sparkRunner}, map[bool][]string{true: {"tiny-prefill"}}[remote]...)...)
	// The gateways learn from /health that the group is whole again.
	var text string
	var last string
	if !testutil.Until(60*time.Second, func() bool {
		var code int
		code, text, last = tryChat(mac.api, prompts[0])
		return code == 200
	}) {
		t.Fatalf("no answer after the restart; last: %s", last)
	}
	if text != want[0] {
		t.Errorf("after the restart: %q, one runner %q", text, want[0])
	}
	t.Logf("answers %q", want)
	for _, h := range []*host{spark, mac} {
		stopHost(t, h)
	}
}
