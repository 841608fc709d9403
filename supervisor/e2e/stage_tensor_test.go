package e2e

import (
	"fmt"
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
	s := setupHosts(t, []string{"s0r0", "s0r1", "s1r0", "s1r1"}, []string{"127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"})
	prompt := "Tell me about the stages."
	want := s.oneRunner(t, prompt)[0]
	runners := []string{"tiny-decode-stage0-rank0", "tiny-decode-stage0-rank1", "tiny-decode-stage1-rank0", "tiny-decode-stage1-rank1"}
	hs, pids, base := s.start(t, `{ hosts = ["s0r0", "s0r1", "s1r0", "s1r1"], shard = "pipeline", tensor = 2 }`, oneEach(runners))
	serving := "s0r0/" + runners[0]
	waitGateways(t, hs, 90*time.Second, "stage 0's rank 0", s.addrs[0]+":"+fmt.Sprint(base))
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

	r := breakStream(t, hs[0].api, "kill -9 of stage 1's rank 1", func() { syscall.Kill(pids[3][runners[3]], syscall.SIGKILL) }, 90*time.Second)
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
	s := setupHosts(t, []string{"s0r0", "s0r1", "s1r0", "s1r1"}, []string{"127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"})
	prompts := []string{"hello there, how are you today?", strings.Repeat("A long prompt for the prefill ranks and the stages. ", 10)}
	want := s.oneRunner(t, prompts...)
	hs, _, base := s.start(t, `{ hosts = ["s0r0", "s0r1", "s1r0", "s1r1"], shard = "pipeline", tensor = 2 }
prefill = { hosts = ["s0r1", "s1r1"], shard = "tensor" }
remote_prefill_min_tokens = 1
remote_prefill_route = "floor"`, [][]string{
		{"tiny-decode-stage0-rank0"}, {"tiny-decode-stage0-rank1", "tiny-prefill-rank0"},
		{"tiny-decode-stage1-rank0"}, {"tiny-decode-stage1-rank1", "tiny-prefill-rank1"}})
	waitGateways(t, hs, 90*time.Second, "stage 0's rank 0", s.addrs[0]+":"+fmt.Sprint(base))
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
