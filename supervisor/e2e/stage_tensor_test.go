package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/exo-pd/exo-pd/internal/testutil"
)

// TestStageTensorHosts: decode = { hosts = [4], shard = "pipeline",
// tensor = 2 } over four real supervisors (127.0.0.2–.5): two stages of
// two tensor ranks each, every host running the runner its plan names.
// Every gateway answers with the whole model's greedy text (stage 0's
// rank 0 serves); kill -9 of stage 1's rank 1 mid-stream ends that stream
// with an error event, its supervisor starts it again, and the model
// answers as before once the stage's group and the ring are whole.
func TestStageTensorHosts(t *testing.T) {
	if testing.Short() {
		t.Skip("builds exo and runs real runners")
	}
	names := []string{"s0r0", "s0r1", "s1r0", "s1r1"}
	addrs := []string{"127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"}
	needAddrs(t, addrs...)
	root, dir, exe, _ := buildExoAndModel(t)
	model := tinyLong(t, root, dir)
	cfgPath, secret := filepath.Join(dir, "cluster.toml"), filepath.Join(dir, "secret")
	if err := os.WriteFile(secret, []byte("e2e secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	prompt := "Tell me about the stages."
	want := oneRunnerAnswers(t, exe, dir, cfgPath, model, secret, []string{prompt})[0]

	base, apiPort := freePort(t), freePort(t)
	src := hostsCluster(base, apiPort, model, secret, names, addrs, `{ hosts = ["s0r0", "s0r1", "s1r0", "s1r1"], shard = "pipeline", tensor = 2 }`)
	if err := os.WriteFile(cfgPath, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	runners := []string{"tiny-decode-stage0-rank0", "tiny-decode-stage0-rank1", "tiny-decode-stage1-rank0", "tiny-decode-stage1-rank1"}
	hs, pids := startHosts(t, exe, dir, cfgPath, apiPort, names, addrs, [][]string{{runners[0]}, {runners[1]}, {runners[2]}, {runners[3]}})
	serving := "s0r0/" + runners[0]
	for _, h := range hs {
		if !testutil.Until(90*time.Second, func() bool { v := h.gatewayView(t); return v[addrs[0]+":"+fmt.Sprint(base)].OK }) {
			t.Fatalf("%s's gateway never saw stage 0's rank 0 healthy: %+v", h.name, h.gatewayView(t))
		}
	}
	for _, h := range hs {
		runner, text := chatText(t, h.api, prompt)
		if text != want || runner != serving {
			t.Errorf("via %s (served by %s): %q, one runner %q", h.name, runner, text, want)
		}
	}
	// The dashboard names each stage's ranks, and each runner its stage,
	// layers and rank.
	if browser := maybeChromium(t); browser != "" {
		p := newPage(t, browser)
		p.run(chromedp.Navigate("http://" + hs[3].api + "/"))
		p.wait("the tensor stages' placement and ranks", `(() => {
			const pl = document.querySelector('[data-model="tiny"] [data-placement="decode"]');
			const r = document.querySelector('[data-runner="s1r1/tiny-decode-stage1-rank1"]');
			return !!pl && /stage 0 s0r0\+s0r1 layers 0:\d+ · stage 1 s1r0\+s1r1 layers \d+:4/.test(pl.textContent) &&
				!!r && r.dataset.state === "ready" && /1\/2 · layers \d+:4 · rank 1\/2/.test(r.textContent);
		})()`)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	streaming := make(chan struct{})
	done := make(chan streamResult, 1)
	go func() { done <- streamChat(ctx, hs[0].api, "go on and on", 30000, func() { close(streaming) }) }()
	select {
	case <-streaming:
	case r := <-done:
		t.Fatalf("the stream ended before the kill: %+v", r)
	}
	syscall.Kill(pids[3][runners[3]], syscall.SIGKILL)
	var r streamResult
	select {
	case r = <-done:
	case <-time.After(90 * time.Second):
		t.Fatal("the stream did not end within 90 s of stage 1's rank 1 being killed")
	}
	t.Logf("the broken stream: status %d after %v, %d chars, error %q, done %v, err %v", r.Status, r.Took, len(r.Text), r.ErrorMsg, r.Done, r.Err)
	if r.Status != 200 || r.Done || (r.ErrorMsg == "" && r.Err == nil) {
		t.Errorf("the stream whose stage lost a rank: %+v, want a 200 stream ending in an error", r)
	}
	waitRestarted(t, hs[3], runners[3], pids[3][runners[3]])
	last := ""
	if !testutil.Until(120*time.Second, func() bool {
		code, text, body := tryChat(hs[0].api, prompt)
		last = fmt.Sprintf("%d %q %s", code, text, body)
		return code == 200 && text == want
	}) {
		t.Logf("last answer: %s", last)
		t.Fatalf("the model did not answer as before after stage 1's rank 1 came back: %+v", hs[0].gatewayView(t))
	}
}

// TestStageTensorHostsTensorPrefill: the same four hosts decode as two
// stages of two tensor ranks, and two of them also prefill as a 2-rank
// tensor group (prefill.shard = "tensor"): every decode rank asks the
// prefill rank of its KV heads for its stage's layers, every prompt is
// filled remotely, and every gateway's answer equals one runner's.
func TestStageTensorHostsTensorPrefill(t *testing.T) {
	if testing.Short() {
		t.Skip("builds exo and runs real runners")
	}
	names := []string{"s0r0", "s0r1", "s1r0", "s1r1"}
	addrs := []string{"127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"}
	needAddrs(t, addrs...)
	root, dir, exe, _ := buildExoAndModel(t)
	model := tinyLong(t, root, dir)
	cfgPath, secret := filepath.Join(dir, "cluster.toml"), filepath.Join(dir, "secret")
	if err := os.WriteFile(secret, []byte("e2e secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	prompts := []string{"hello there, how are you today?", strings.Repeat("A long prompt for the prefill ranks and the stages. ", 10)}
	want := oneRunnerAnswers(t, exe, dir, cfgPath, model, secret, prompts)

	base, apiPort := freePort(t), freePort(t)
	src := hostsCluster(base, apiPort, model, secret, names, addrs, `{ hosts = ["s0r0", "s0r1", "s1r0", "s1r1"], shard = "pipeline", tensor = 2 }
prefill = { hosts = ["s0r1", "s1r1"], shard = "tensor" }
remote_prefill_min_tokens = 1
remote_prefill_route = "floor"`)
	if err := os.WriteFile(cfgPath, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	hs, _ := startHosts(t, exe, dir, cfgPath, apiPort, names, addrs, [][]string{
		{"tiny-decode-stage0-rank0"}, {"tiny-decode-stage0-rank1", "tiny-prefill-rank0"},
		{"tiny-decode-stage1-rank0"}, {"tiny-decode-stage1-rank1", "tiny-prefill-rank1"}})
	for _, h := range hs {
		if !testutil.Until(90*time.Second, func() bool { v := h.gatewayView(t); return v[addrs[0]+":"+fmt.Sprint(base)].OK }) {
			t.Fatalf("%s's gateway never saw stage 0's rank 0 healthy: %+v", h.name, h.gatewayView(t))
		}
	}
	n := 0
	for _, h := range hs {
		for i, p := range prompts {
			if _, text := chatText(t, h.api, p); text != want[i] {
				t.Errorf("via %s, prompt %d: %q, one runner %q", h.name, i, text, want[i])
			}
			n++
		}
	}
	// A fill counts only when every rank of every stage fetched its part.
	if ok := remotePrefillOK(t, hs[0].api); ok != float64(n) {
		t.Errorf("remote prefill ok = %v on stage 0's host, want every one of the %d requests", ok, n)
	}
	t.Logf("%d requests; remote prefill outcomes on stage 0's host: %v", n, remotePrefillOutcomes(t, hs[0].api))
}
