package e2e

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/exo-pd/exo-pd/internal/testutil"
)

// TestCostRouteAvoidsBusyPrefillHost: two prefill runners of equal
// (test-capped) rate; another decode runner keeps the first busy with
// three long prompts. A decode runner given the prefill runners' /health
// (--prefill-health) sees that load (exo_prefill_endpoint_load), predicts
// the busy host slower and fetches from the idle one. A decode runner
// without it, in the same run, is logged for contrast (its choice then
// rests on calibration noise and the list order; not asserted).
func TestCostRouteAvoidsBusyPrefillHost(t *testing.T) {
	dir := tinyModel(t, "main")
	p1 := start(t, "prefill-1", "prefill", "--model", dir, "--prefix-cache-mib", "0", "--test-slow-prefill-tokens-per-sec", "1000")
	p2 := start(t, "prefill-2", "prefill", "--model", dir, "--prefix-cache-mib", "0", "--test-slow-prefill-tokens-per-sec", "1000")
	common := []string{"--model", dir, "--prefill", p1.listen + "," + p2.listen, "--remote-prefill-route", "cost",
		"--remote-prefill-min-tokens", "64", "--test-slow-prefill-tokens-per-sec", "100"}
	aware := start(t, "decode-health", "decode", append(common, "--prefill-health", p1.http+","+p2.http)...)
	blind := start(t, "decode-blind", "decode", common...)
	other := start(t, "decode-other", "decode", "--model", dir, "--prefill", p1.listen, "--remote-prefill-route", "floor",
		"--remote-prefill-min-tokens", "64")
	for _, d := range []*proc{aware, blind} {
		d.waitRecords(t, "remote prefill calibrated", 2, 30*time.Second)
	}
	// Keep prefill-1 busy: three ~800-token prompts at 1000 tok/s, one at
	// a time there.
	var wg sync.WaitGroup
	for i := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if r := goChat(other.listen, user(fmt.Sprintf("busy %d: %s", i, words(7+i, 320))), 1, nil); r.Status != 200 {
				t.Errorf("busy request %d: %+v", i, r)
			}
		}()
	}
	defer wg.Wait()
	load := `exo_prefill_endpoint_load{endpoint="` + p1.listen + `"}`
	if !testutil.Until(30*time.Second, func() bool { return aware.metric(t, load) >= 2 }) {
		t.Fatalf("prefill-1's load never reached the decode runner (%s = %v):\n%s", load, aware.metric(t, load), tail(aware.logs(), 3000))
	}
	sent := `exo_kv_transfer_bytes_total{role="prefill"}`
	b2 := p2.metric(t, sent)
	var blindEndpoint string
	var blindTTFT time.Duration
	var blindRes chatResult
	done := make(chan struct{})
	go func() { // the blind runner at the same moment, for contrast
		defer close(done)
		t0 := time.Now()
		blindRes = goChat(blind.listen, user("blind: "+words(11, 320)), 1, nil)
		blindTTFT = time.Since(t0)
	}()
	ttft, r := timeToFirst(t, aware.listen, "aware: "+words(12, 320), nil)
	<-done
	if blindRes.Status != 200 || !blindRes.Done || blindRes.ErrorBody != "" {
		t.Fatalf("blind request: %+v", blindRes)
	}
	// The endpoint each fetched from: its last successful remote fill.
	lastFill := func(p *proc) string {
		recs := p.records("remote prefill")
		for i := len(recs) - 1; i >= 0; i-- {
			if recs[i]["outcome"] == "ok" {
				return recs[i]["endpoint"]
			}
		}
		return ""
	}
	var endpoint string
	testutil.Until(5*time.Second, func() bool {
		endpoint, blindEndpoint = lastFill(aware), lastFill(blind)
		return endpoint != "" && blindEndpoint != ""
	})
	name := map[string]string{p1.listen: "prefill-1 (busy)", p2.listen: "prefill-2 (idle)"}
	t.Logf("with /health load: %d prompt tokens fetched from %s, TTFT %v; without: from %s, TTFT %v",
		r.Prompt, name[endpoint], ttft, name[blindEndpoint], blindTTFT)
	if endpoint != p2.listen {
		t.Fatalf("fetched from %q, want the idle prefill-2 (%s):\n%s", endpoint, p2.listen, tail(aware.logs(), 4000))
	}
	if p2.metric(t, sent) <= b2 {
		t.Fatal("prefill-2 sent no KV")
	}
}
