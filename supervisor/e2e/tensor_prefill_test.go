package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
)

// TestTensorPrefillTwoHosts: two real supervisors (spark 127.0.0.2, mac
// 127.0.0.3) with the tiny model's decode and prefill both tensor-parallel
// over both hosts: the plan gives each prefill host a rank
// (tiny-prefill-rank0/1) and each decode rank --prefill ADDR#I/N, every
// prompt is filled remotely (each decode rank fetching its KV heads from the
// prefill rank that computed them) and the answers through both gateways
// equal one runner's with local prefill; mac's prefill rank killed -9 is
// restarted by its supervisor and new prompts are answered as one runner
// does (remotely once the group is whole, else by the local fallback).
func TestTensorPrefillTwoHosts(t *testing.T) {
	if testing.Short() {
		t.Skip("builds exo and runs real runners")
	}
	needLoopbackHosts(t)
	root, dir, exe, _ := buildExoAndModel(t)
	if out, _ := exec.Command(exe, "runner", "prefill", "--help").CombinedOutput(); !strings.Contains(string(out), "exo runner prefill") || !strings.Contains(string(out), "--tensor I/N --tensor-peers") {
		t.Skip("exo runner prefill has no --tensor")
	}
	model := filepath.Join(dir, "tiny4")
	run(t, root, "go", "run", "./runners/engine/testmodel/cmd/gen", "-arch", "llama", "-layers", "4", model)
	cfgPath, secret := filepath.Join(dir, "cluster.toml"), filepath.Join(dir, "secret")
	if err := os.WriteFile(secret, []byte("e2e secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	prompts := []string{"hello there, how are you today?", "Tell me a story about a tensor group.",
		strings.Repeat("A long prompt that both prefill ranks compute together. ", 10)}
	// New to the decode ranks after the prefill rank's restart.
	after := []string{"What comes after the restart?", strings.Repeat("Another long prompt once the prefill rank is back. ", 8)}
	want := oneRunnerAnswers(t, exe, dir, cfgPath, model, secret, append(slices.Clone(prompts), after...))

	base, apiPort := freePort(t), freePort(t)
	decode := `{ hosts = ["spark", "mac"], shard = "tensor" }
prefill = { hosts = ["spark", "mac"], shard = "tensor" }
remote_prefill_min_tokens = 1
remote_prefill_route = "floor"`
	if err := os.WriteFile(cfgPath, []byte(pipelineCluster(base, apiPort, model, secret, decode)), 0o644); err != nil {
		t.Fatal(err)
	}
	spark, mac := startTwoHosts(t, exe, dir, cfgPath, apiPort)
	spark.waitRunners(t, "tiny-decode-rank0", "tiny-prefill-rank0")
	macPIDs := mac.waitRunners(t, "tiny-decode-rank1", "tiny-prefill-rank1")
	for _, h := range []*host{spark, mac} {
		for i, p := range prompts {
			if _, text := chatText(t, h.api, p); text != want[i] {
				t.Errorf("via %s, prompt %d: %q, one runner %q", h.name, i, text, want[i])
			}
		}
	}
	if n := remotePrefillOK(t, spark.api); n != float64(2*len(prompts)) {
		t.Errorf("remote prefill ok = %v on spark (rank 0, where both gateways route), want every one of the %d requests", n, 2*len(prompts))
	}
	t.Logf("remote prefill outcomes: spark %v", remotePrefillOutcomes(t, spark.api))

	// kill -9 of mac's prefill rank: restarted by mac's supervisor, the
	// prefill group whole again, and the answers the same.
	syscall.Kill(macPIDs["tiny-prefill-rank1"], syscall.SIGKILL)
	waitRestarted(t, mac, "tiny-prefill-rank1", macPIDs["tiny-prefill-rank1"])
	for i, p := range after {
		if _, text := chatText(t, mac.api, p); text != want[len(prompts)+i] {
			t.Errorf("after the restart, prompt %d: %q, one runner %q", i, text, want[len(prompts)+i])
		}
	}
	t.Logf("remote prefill outcomes after the restart: spark %v", remotePrefillOutcomes(t, spark.api))
	for _, h := range []*host{spark, mac} {
		stopHost(t, h)
	}
}
