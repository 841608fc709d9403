package e2e

import (
	"strings"
	"testing"
	"time"
)

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
	both.waitRecords(t, "remote prefill calibrated", 2, 60*time.Second)

	first := user("prefix probe conversation: " + words(4242, 200))
	r1 := chatStream(t, pin.listen, first, 8, nil)
	if out := pin.outcomeSoon("ok"); r1.Status != 200 || !r1.Done || out != "ok" {
		t.Fatalf("first turn on the warm host: %+v, outcome %q", r1, out)
	}
	second := append(first, msg{Role: "assistant", Content: r1.Text}, msg{Role: "user", Content: "and then? " + words(77, 20)})

	sent := `exo_kv_transfer_bytes_total{role="prefill"}`
	bc, bw := cold.metric(t, sent), warm.metric(t, sent)
	before := len(both.records("route decision"))
	got := chatStream(t, both.listen, second, 8, nil)
	want := chatStream(t, local.listen, second, 8, nil)
	expectSame(t, "second turn via the warm host vs local", got, want)

	m := both.waitRecords(t, "route decision", before+1, 5*time.Second)[before]
	hits, ok := m["prefix_hits"]
	if !ok {
		t.Fatalf("route decision %v has no prefix hits", m)
	}
	t.Logf("decision: route=%s endpoint=%s prefix_hits=%s (prompt %d tokens)", m["route"], m["endpoint"], hits, got.Prompt)
	if m["route"] != "remote" || m["endpoint"] != warm.listen {
		t.Fatalf("routed %s to %s, want remote to the warm host %s (cold %s):\n%s", m["route"], m["endpoint"], warm.listen, cold.listen, tail(both.logs(), 4000))
	}
	if !strings.Contains(hits, warm.listen+":") || !strings.Contains(hits, cold.listen+":0") {
		t.Fatalf("prefix hits %q: want both hosts, the cold one at 0", hits)
	}
	if dc, dw := cold.metric(t, sent)-bc, warm.metric(t, sent)-bw; dc != 0 || dw == 0 {
		t.Fatalf("KV sent for the second turn: cold %v bytes, warm %v: want it all from the warm host", dc, dw)
	}
}
