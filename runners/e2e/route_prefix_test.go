package e2e

import (
	"regexp"
	"strings"
	"testing"
	"time"
)

var logDecisionEndpoint = regexp.MustCompile(`msg="route decision".* route=(\w+) .* endpoint=(\S+) prefix_hits="?map\[([^\]]*)\]`)

// TestCostRoutePrefixHitPicksWarmHost: two prefill runners behind one
// decode runner, the cold one listed first and 1.5× faster (both capped
// by the test-only rate limit: 1500 and 1000 tok/s), so that without
// prefix probes the router picks the cold one. The
// first turn of a conversation is prefilled on the second host only (a
// decode runner pinned to it), so its prefix cache holds that prompt. The
// second turn, sent to the two-host decode runner (which holds nothing of
// the conversation), must be routed to the warm host: the prefix probe
// (PROTOCOL.md §18) tells the router that host has ~90 % of the prompt
// already, so it computes ~90 tokens instead of ~590. The reply equals a
// local-only decode runner's (temperature 0).
func TestCostRoutePrefixHitPicksWarmHost(t *testing.T) {
	dir := tinyModel(t, "main")
	cold := start(t, "prefill-cold", "prefill", "--model", dir, "--test-slow-prefill-tokens-per-sec", "1500")
	warm := start(t, "prefill-warm", "prefill", "--model", dir, "--test-slow-prefill-tokens-per-sec", "1000")
	pin := start(t, "decode-pin", "decode", "--model", dir, "--prefill", warm.listen, "--remote-prefill-min-tokens", "64")
	both := start(t, "decode-both", "decode", "--model", dir, "--prefill", cold.listen+","+warm.listen,
		"--remote-prefill-route", "cost", "--remote-prefill-min-tokens", "64", "--test-slow-prefill-tokens-per-sec", "100")
	local := start(t, "decode-local", "decode", "--model", dir)
	deadline := time.Now().Add(60 * time.Second)
	for strings.Count(both.logs(), "remote prefill calibrated") < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("endpoints not calibrated:\n%s", tail(both.logs(), 3000))
		}
		time.Sleep(50 * time.Millisecond)
	}

	first := user("prefix probe conversation: " + words(4242, 200))
	r1 := chatStream(t, pin.listen, first, 8, nil)
	if out := pin.outcomeSoon("ok"); r1.Status != 200 || !r1.Done || out != "ok" {
		t.Fatalf("first turn on the warm host: %+v, outcome %q", r1, out)
	}
	second := append(first, msg{Role: "assistant", Content: r1.Text}, msg{Role: "user", Content: "and then? " + words(77, 20)})

	sent := `exo_kv_transfer_bytes_total{role="prefill"}`
	bc, bw := cold.metric(t, sent), warm.metric(t, sent)
	before := len(logDecisionEndpoint.FindAllString(both.logs(), -1))
	got := chatStream(t, both.listen, second, 8, nil)
	want := chatStream(t, local.listen, second, 8, nil)
	expectSame(t, "second turn via the warm host vs local", got, want)

	var m []string
	for end := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if all := logDecisionEndpoint.FindAllStringSubmatch(both.logs(), -1); len(all) > before {
			m = all[before]
			break
		}
		if time.Now().After(end) {
			t.Fatalf("no route decision with prefix hits logged:\n%s", tail(both.logs(), 4000))
		}
	}
	t.Logf("decision: route=%s endpoint=%s prefix_hits=[%s] (prompt %d tokens)", m[1], m[2], m[3], got.Prompt)
	if m[1] != "remote" || m[2] != warm.listen {
		t.Fatalf("routed %s to %s, want remote to the warm host %s (cold %s):\n%s", m[1], m[2], warm.listen, cold.listen, tail(both.logs(), 4000))
	}
	if !strings.Contains(m[3], warm.listen+":") || !strings.Contains(m[3], cold.listen+":0") {
		t.Fatalf("prefix hits %q: want both hosts, the cold one at 0", m[3])
	}
	if dc, dw := cold.metric(t, sent)-bc, warm.metric(t, sent)-bw; dc != 0 || dw == 0 {
		t.Fatalf("KV sent for the second turn: cold %v bytes, warm %v: want it all from the warm host", dc, dw)
	}
}
