package e2e

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestCostRouteSpreadsOverTwoPrefillHosts: two prefill runners behind one
// decode runner with --remote-prefill-route cost; under 8 concurrent long
// prompts both serve prefills (the ranking counts fetches in flight), and
// every reply completes. Local prefill is slowed (--test-local-prefill-delay)
// so that remote wins on this one machine.
func TestCostRouteSpreadsOverTwoPrefillHosts(t *testing.T) {
	dir := tinyModel(t, "main")
	p1 := start(t, "prefill-1", "prefill", "--model", dir)
	p2 := start(t, "prefill-2", "prefill", "--model", dir)
	dec := start(t, "decode", "decode", "--model", dir, "--prefill", p1.listen+","+p2.listen,
		"--remote-prefill-route", "cost", "--remote-prefill-min-tokens", "64", "--max-batch", "8",
		"--test-slow-prefill-tokens-per-sec", "300") // local ≈ 4 s for these prompts: remote wins
	deadline := time.Now().Add(60 * time.Second)
	for strings.Count(dec.logs(), "remote prefill calibrated") < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("both endpoints not calibrated:\n%s", tail(dec.logs(), 3000))
		}
		time.Sleep(50 * time.Millisecond)
	}
	sent := `exo_kv_transfer_bytes_total{role="prefill"}`
	b1, b2 := p1.metric(t, sent), p2.metric(t, sent)
	res, p50two := burst(t, dec.listen, "two")
	for i, r := range res {
		if r.Status != 200 || !r.Done {
			t.Fatalf("request %d: %+v", i, r)
		}
	}
	d1, d2 := p1.metric(t, sent)-b1, p2.metric(t, sent)-b2
	remote := dec.metric(t, outcome("ok"))
	t.Logf("prefill-1 sent %v bytes, prefill-2 %v; remote fills %v of 8", d1, d2, remote)
	if remote != 8 {
		t.Fatalf("remote fills %v of 8, want all: local prefill is slowed 3 s per 1000 tokens:\n%s", remote, tail(dec.logs(), 6000))
	}
	if d1 == 0 || d2 == 0 {
		t.Fatalf("one prefill host did all the remote work (%v, %v bytes):\n%s", d1, d2, tail(dec.logs(), 12000))
	}
	// The same burst (new prompts: the prefill caches hold the first) on a
	// decode runner with prefill-1 alone; latency logged, not asserted.
	one := start(t, "decode-one", "decode", "--model", dir, "--prefill", p1.listen,
		"--remote-prefill-route", "cost", "--remote-prefill-min-tokens", "64", "--max-batch", "8",
		"--test-slow-prefill-tokens-per-sec", "300")
	for !strings.Contains(one.logs(), "remote prefill calibrated") {
		if time.Now().After(deadline) {
			t.Fatalf("not calibrated:\n%s", tail(one.logs(), 3000))
		}
		time.Sleep(50 * time.Millisecond)
	}
	_, p50one := burst(t, one.listen, "one")
	t.Logf("request latency p50 (prefill + 2 tokens), 8 concurrent: two hosts %v, one host %v", p50two, p50one)
}

// burst sends 8 concurrent long prompts and returns the results and the
// median request latency.
func burst(t *testing.T, addr, tag string) ([]chatResult, time.Duration) {
	var wg sync.WaitGroup
	res := make([]chatResult, 8)
	lat := make([]time.Duration, 8)
	for i := range res {
		wg.Add(1)
		go func() {
			defer wg.Done()
			text := fmt.Sprintf("%s request %d: ", tag, i) + strings.Repeat("the quick brown fox jumps over the lazy dog ", 60)
			t0 := time.Now()
			res[i] = chatStream(t, addr, []msg{{Role: "user", Content: text}}, 2, nil)
			lat[i] = time.Since(t0)
		}()
	}
	wg.Wait()
	slices.Sort(lat)
	return res, (lat[3] + lat[4]) / 2
}
