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
// decode runner (cost route, --prefill-health); under 8 concurrent long
// prompts both serve prefills and every reply completes, and the median
// time to first token is lower than with one prefill runner (a second
// decode runner on prefill-1 alone, same run, same kind of prompts).
//
// Both prefill runners share this machine's cores, where two CPU-bound
// prefill processes cannot beat one; each is therefore capped at 1000
// tok/s by the test-only --test-slow-prefill-tokens-per-sec, far below
// what the tiny model computes, so each is a separate simulated host of
// its own rate, as a second Spark is. The local prefill is capped at 100
// tok/s so remote wins. By construction one host serves 8 prompts of ~600
// tokens one after another (p50 ≈ 2.7 s) and two serve them four each
// (≈ 1.5 s): the assertion has a ~1.8× margin.
func TestCostRouteSpreadsOverTwoPrefillHosts(t *testing.T) {
	dir := tinyModel(t, "main")
	p1 := start(t, "prefill-1", "prefill", "--model", dir, "--prefix-cache-mib", "0", "--test-slow-prefill-tokens-per-sec", "1000")
	p2 := start(t, "prefill-2", "prefill", "--model", dir, "--prefix-cache-mib", "0", "--test-slow-prefill-tokens-per-sec", "1000")
	decode := func(name string, pre ...*proc) *proc {
		var kv, health []string
		for _, p := range pre {
			kv, health = append(kv, p.listen), append(health, p.http)
		}
		return start(t, name, "decode", "--model", dir, "--prefill", strings.Join(kv, ","), "--prefill-health", strings.Join(health, ","),
			"--remote-prefill-route", "cost", "--remote-prefill-min-tokens", "64", "--max-batch", "8",
			"--test-slow-prefill-tokens-per-sec", "100")
	}
	two, one := decode("decode-two", p1, p2), decode("decode-one", p1)
	two.waitRecords(t, "remote prefill calibrated", 2, 60*time.Second)
	one.waitRecords(t, "remote prefill calibrated", 1, 60*time.Second)
	sent := `exo_kv_transfer_bytes_total{role="prefill"}`
	b1, b2 := p1.metric(t, sent), p2.metric(t, sent)
	res, p50two := burst(t, two.listen, "two")
	d1, d2 := p1.metric(t, sent)-b1, p2.metric(t, sent)-b2
	remote := two.metric(t, outcome("ok"))
	for i, r := range res {
		if r.Status != 200 || !r.Done {
			t.Fatalf("request %d: %+v", i, r)
		}
	}
	t.Logf("prefill-1 sent %v bytes, prefill-2 %v; remote fills %v of 8", d1, d2, remote)
	if remote != 8 {
		t.Fatalf("remote fills %v of 8, want all: local prefill is capped at 100 tok/s:\n%s", remote, tail(two.logs(), 6000))
	}
	if d1 == 0 || d2 == 0 {
		t.Fatalf("one prefill host did all the remote work (%v, %v bytes):\n%s", d1, d2, tail(two.logs(), 12000))
	}
	res, p50one := burst(t, one.listen, "one")
	for i, r := range res {
		if r.Status != 200 || !r.Done {
			t.Fatalf("request %d (one host): %+v", i, r)
		}
	}
	t.Logf("TTFT p50, 8 concurrent ~%d-token prompts: two prefill hosts %v, one %v (%.2fx)",
		res[0].Prompt, p50two, p50one, p50one.Seconds()/p50two.Seconds())
	if p50two >= p50one {
		t.Fatalf("TTFT p50 with two prefill hosts %v, with one %v: not lower", p50two, p50one)
	}
}

// burst sends 8 concurrent long prompts (max_tokens 1) and returns the
// results and the median time to first token.
func burst(t *testing.T, addr, tag string) ([]chatResult, time.Duration) {
	var wg sync.WaitGroup
	res := make([]chatResult, 8)
	lat := make([]time.Duration, 8)
	for i := range res {
		wg.Add(1)
		go func() {
			defer wg.Done()
			text := fmt.Sprintf("%s request %d: %s", tag, i, words(1000+i, 250))
			t0 := time.Now()
			res[i] = goChat(addr, []msg{{Role: "user", Content: text}}, 1, nil)
			lat[i] = time.Since(t0)
		}()
	}
	wg.Wait()
	slices.Sort(lat)
	return res, (lat[3] + lat[4]) / 2
}
