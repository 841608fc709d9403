package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestPrefillPipelineTwoHosts: prefill = { hosts = ["spark", "mac"], shard =
// "pipeline" } over two real supervisors (spark runs prefill stage 0, mac
// stage 1, each a C4 runner the plan started, ring on base+6) beside a
// decode that is one runner on mac, and beside a decode pipeline over both
// hosts (N×M: each decode stage asks the prefill stage that holds its layers;
// a later prompt starts past the cached template prefix);
// every prompt, a long one among them, is filled remotely from the two
// prefill stages (the decode runners count only ok fills, no fallback) and
// the answers equal one runner's with local prefill at temperature 0.
func TestPrefillPipelineTwoHosts(t *testing.T) {
	if testing.Short() {
		t.Skip("builds exo and runs real runners")
	}
	needLoopbackHosts(t)
	root, dir, exe, _ := buildExoAndModel(t)
	if out, _ := exec.Command(exe, "runner", "prefill", "--help").CombinedOutput(); !strings.Contains(string(out), "stage-next") {
		t.Skip("exo runner prefill has no --stage-next")
	}
	model := filepath.Join(dir, "tiny4")
	run(t, root, "go", "run", "./runners/engine/testmodel/cmd/gen", "-arch", "llama", "-layers", "4", model)
	cfgPath, secret := filepath.Join(dir, "cluster.toml"), filepath.Join(dir, "secret")
	if err := os.WriteFile(secret, []byte("e2e secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	prompts := []string{"hello there, how are you today?", "1 2 3 4 5 6 7 8 9 10 11 12 13",
		strings.Repeat("A long prompt that two prefill stages compute for the decode side. ", 10)}
	want := oneRunnerAnswers(t, exe, dir, cfgPath, model, secret, prompts)

	const prefill = `
prefill = { hosts = ["spark", "mac"], shard = "pipeline" }
remote_prefill_min_tokens = 1`
	for _, tc := range []struct {
		name, decode string
		spark, mac   []string // each host's runners
		api          string   // the runner serving the API, "host/name"
	}{
		{"one decode runner", `{ hosts = ["mac"] }`, []string{"tiny-prefill-stage0"}, []string{"tiny-decode", "tiny-prefill-stage1"}, "mac/tiny-decode"},
		{"decode pipeline", `{ hosts = ["spark", "mac"], shard = "pipeline" }`, []string{"tiny-decode-stage0", "tiny-prefill-stage0"}, []string{"tiny-decode-stage1", "tiny-prefill-stage1"}, "spark/tiny-decode-stage0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base, apiPort := freePort(t), freePort(t)
			if err := os.WriteFile(cfgPath, []byte(pipelineCluster(base, apiPort, model, secret, tc.decode+prefill)), 0o644); err != nil {
				t.Fatal(err)
			}
			spark, mac := startTwoHosts(t, exe, dir, cfgPath, apiPort)
			defer func() { stopHost(t, spark); stopHost(t, mac) }()
			spark.waitRunners(t, tc.spark...)
			mac.waitRunners(t, tc.mac...)
			for _, h := range []*host{spark, mac} {
				for i, p := range prompts {
					runner, text := chatText(t, h.api, p)
					if runner != tc.api {
						t.Errorf("via %s: served by %q, want %s", h.name, runner, tc.api)
					}
					if text != want[i] {
						t.Errorf("via %s, prompt %d: from prefill stages %q, one runner %q", h.name, i, text, want[i])
					}
				}
			}
			// The API runner's host counts the fills: all ok, no fallback.
			apiHost := map[bool]*host{true: spark, false: mac}[strings.HasPrefix(tc.api, "spark/")]
			out := remotePrefillOutcomes(t, apiHost.api)
			t.Logf("remote prefill outcomes on %s: %v", apiHost.name, out)
			if out["ok"] < float64(2*len(prompts)) {
				t.Errorf("remote prefill ok = %v on %s, want every one of the %d requests", out["ok"], apiHost.name, 2*len(prompts))
			}
			for outcome, n := range out {
				if outcome != "ok" && n > 0 {
					t.Errorf("remote prefill outcome %q = %v on %s, want only ok", outcome, n, apiHost.name)
				}
			}
			// On MLX hosts (EXO_E2E_HOST_BACKEND, by hand) the prefill
			// stages carry their hidden states over MLX's ring (the
			// supervisors' hostfile); on cpu they stay on the stage link.
			want := "tcp/cpu_backend"
			if hostBackend() != "cpu" {
				want = "mlx/"
			}
			for i, h := range []*host{spark, mac} {
				name := fmt.Sprintf("tiny-prefill-stage%d", i)
				if got := stageTransport(t, h, name); got != want {
					t.Errorf("%s on %s: exo_stage_transport %q, want %q (see %s)", name, h.name, got, want, h.log)
				}
			}
		})
	}
}
