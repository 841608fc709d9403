package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"testing"
)

// TestLoadQueueFull: exo bench's load mode (--duration) keeps more streams
// in flight than a decode runner admits (--max-batch 2 running +
// --max-queue 4 waiting): requests past the queue get 429, every other one
// succeeds (no 5xx, no broken stream), and every 429 came while more than
// the queue's 4 of the bench's requests were in flight (it is the only
// client; the log shows the fewest, which is batch+queue+1 when the running
// slots were full too). By hand, EXO_E2E_LOAD="64 60s 4 16" runs the 64 streams
// for 60 s (streams, duration, max batch, max queue); RSS and goroutines
// before and after are logged.
func TestLoadQueueFull(t *testing.T) {
	streams, dur, batch, queue := 12, "3s", 2, 4
	if v := os.Getenv("EXO_E2E_LOAD"); v != "" {
		var d string
		if _, err := fmt.Sscan(v, &streams, &d, &batch, &queue); err != nil {
			t.Fatalf("EXO_E2E_LOAD=%q: want \"STREAMS DURATION BATCH QUEUE\": %v", v, err)
		}
		dur = d
	}
	dir := tinyModel(t, "main")
	pre := start(t, "prefill", "prefill", "--model", dir)
	dec := start(t, "decode", "decode", "--model", dir, "--prefill", pre.listen,
		"--max-batch", strconv.Itoa(batch), "--max-queue", strconv.Itoa(queue))
	snap := func(p *proc) (g, rss float64) {
		return p.metric(t, "exo_goroutines"), p.metric(t, "process_resident_memory_bytes") / (1 << 20)
	}
	g0, rss0 := snap(dec)
	pg0, prss0 := snap(pre)
	out, err := exec.Command(exoBin, "bench", "--url", "http://"+dec.listen, "--pp", "300", "--tg", "32",
		"--concurrency", strconv.Itoa(streams), "--duration", dur, "--json").Output()
	if err != nil {
		t.Fatalf("exo bench --duration: %v\n%s", err, tail(string(out), 2000))
	}
	var res struct {
		Load []struct {
			OK               int         `json:"ok"`
			Status           map[int]int `json:"status"`
			Failed           int         `json:"failed"`
			MinInFlightAt429 int         `json:"min_in_flight_at_429"`
			TTFTP50          float64     `json:"ttft_p50_s"`
			TTFTP99          float64     `json:"ttft_p99_s"`
			LatencyP50       float64     `json:"latency_p50_s"`
			LatencyP99       float64     `json:"latency_p99_s"`
			AggregateTPS     float64     `json:"aggregate_generation_tokens_per_s"`
			Duration         float64     `json:"duration_s"`
		} `json:"load"`
	}
	if err := json.Unmarshal(out, &res); err != nil || len(res.Load) != 1 {
		t.Fatalf("bench output: %v\n%s", err, tail(string(out), 2000))
	}
	r := res.Load[0]
	g1, rss1 := snap(dec)
	pg1, prss1 := snap(pre)
	t.Logf("%d streams for %.1fs, max batch %d, max queue %d: %d ok, status %v, %d failed; 429s with ≥ %d in flight; "+
		"TTFT p50 %.3fs p99 %.3fs, latency p50 %.3fs p99 %.3fs, %.1f gen tok/s; decode RSS %.1f → %.1f MiB, goroutines %v → %v; "+
		"prefill RSS %.1f → %.1f MiB, goroutines %v → %v",
		streams, r.Duration, batch, queue, r.OK, r.Status, r.Failed, r.MinInFlightAt429,
		r.TTFTP50, r.TTFTP99, r.LatencyP50, r.LatencyP99, r.AggregateTPS, rss0, rss1, g0, g1, prss0, prss1, pg0, pg1)
	for code, n := range r.Status {
		if code != 429 {
			t.Errorf("%d × HTTP %d", n, code)
		}
	}
	if r.Failed != 0 || r.OK == 0 {
		t.Errorf("%d ok, %d failed otherwise", r.OK, r.Failed)
	}
	if streams > batch+queue && r.Status[429] == 0 {
		t.Errorf("%d streams against %d running + %d waiting and no 429", streams, batch, queue)
	}
	// A 429 means queue requests were waiting; with the bench the only
	// client, all were its own, in flight beside the refused one.
	if r.Status[429] > 0 && r.MinInFlightAt429 <= queue {
		t.Errorf("a 429 came with at most %d requests in flight; the runner queues %d", r.MinInFlightAt429, queue)
	}
}
