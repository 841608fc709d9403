package metrics

import (
	"io"
	"net/http/httptest"
	"runtime"
	"strconv"
	"strings"
	"testing"
)

// TestExposition checks that the DESIGN.md §7 names a runner owns are
// exposed (the outcome and role series from the start) and that two
// runners in one process do not share state.
func TestExposition(t *testing.T) {
	d := New("decode")
	p := New("prefill")
	d.TTFT.WithLabelValues("m").Observe(0.1)
	d.InterToken.WithLabelValues("m").Observe(0.01)
	d.Duration.WithLabelValues("m").Observe(1)
	d.PromptTokens.WithLabelValues("m").Add(10)
	d.GenTokens.WithLabelValues("m").Add(5)
	d.Requests.WithLabelValues("m", "200").Inc()
	d.RemotePrefill.WithLabelValues(OutcomeOK).Inc()
	d.KVWait.Observe(0.2)
	d.KVDuration.WithLabelValues("decode").Observe(0.3)
	p.PrefixHit.WithLabelValues("prefill").Add(64)

	dt, pt := scrape(d), scrape(p)
	for _, want := range []string{
		"exo_time_to_first_token_seconds_bucket", "exo_inter_token_latency_seconds_count", "exo_request_duration_seconds_sum",
		`exo_prompt_tokens_total{model="m"} 10`, `exo_generation_tokens_total{model="m"} 5`,
		`exo_requests_total{code="200",model="m"} 1`, `exo_requests_waiting{role="decode"} 0`,
		`exo_remote_prefill_total{outcome="ok"} 1`, `exo_remote_prefill_total{outcome="fallback_corrupt"} 0`,
		`exo_remote_prefill_total{outcome="skipped_short"} 0`, `exo_kv_transfer_bytes_total{role="decode"} 0`,
		"exo_kv_transfer_duration_seconds_count", "exo_kv_wait_seconds_count 1",
		`exo_prefix_cache_hit_tokens_total{role="decode"} 0`, "go_goroutines", "process_cpu_seconds_total",
		"exo_decode_batch_sequences_max 0",
		`exo_speculative_tokens_total{outcome="accepted"} 0`, `exo_speculative_tokens_total{outcome="rejected"} 0`,
		"exo_speculative_shared_steps_total 0", "exo_speculative_batch_positions_count 0",
	} {
		if !strings.Contains(dt, want) {
			t.Errorf("decode exposition lacks %q", want)
		}
	}
	if !strings.Contains(pt, `exo_prefix_cache_hit_tokens_total{role="prefill"} 64`) || strings.Contains(pt, "exo_remote_prefill_total{") ||
		strings.Contains(pt, "exo_speculative_tokens_total") || strings.Contains(pt, "exo_speculative_shared_steps_total") {
		t.Errorf("prefill exposition wrong:\n%s", pt)
	}
	if strings.Contains(pt, `exo_prompt_tokens_total{model="m"}`) {
		t.Error("registries share state")
	}
}

// TestGoroutinesBeforeGather: exo_goroutines is the count when the scrape
// began, so the registry's collector goroutines, which go_goroutines
// counts, are not in it: scraped from this goroutine (nothing else starts
// one here), it is never above the count read just before the scrape
// (goroutines left from the last scrape may exit in between), and in some
// scrape go_goroutines is above it.
func TestGoroutinesBeforeGather(t *testing.T) {
	m := New("decode")
	value := func(text, series string) float64 {
		for line := range strings.Lines(text) {
			if rest, ok := strings.CutPrefix(line, series+" "); ok {
				v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
				if err != nil {
					t.Fatalf("%s: %v", line, err)
				}
				return v
			}
		}
		t.Fatalf("no %s in the exposition", series)
		return 0
	}
	above := false
	for range 100 {
		before := runtime.NumGoroutine()
		rec := httptest.NewRecorder()
		m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
		text := rec.Body.String()
		ours, gos := value(text, "exo_goroutines"), value(text, "go_goroutines")
		if ours <= 0 || ours > float64(before) {
			t.Fatalf("exo_goroutines %v; %d goroutines just before the scrape", ours, before)
		}
		above = above || gos > ours
	}
	if !above {
		t.Error("go_goroutines never counted more than exo_goroutines: the gather's goroutines are not where this test thinks")
	}
}

// TestExposedBeforeFirstRequest: a decode runner's DESIGN.md §7 series
// exist at zero for its model from the start, so a scrape of a fresh
// cluster (an alert rule, a dashboard, a check of the names) finds them
// before the first request; the KV transfer histogram of either role too.
func TestExposedBeforeFirstRequest(t *testing.T) {
	d, p := New("decode"), New("prefill")
	d.Expose("m")
	dt, pt := scrape(d), scrape(p)
	for _, want := range []string{
		`exo_time_to_first_token_seconds_count{model="m"} 0`, `exo_inter_token_latency_seconds_count{model="m"} 0`,
		`exo_request_duration_seconds_count{model="m"} 0`, `exo_prompt_tokens_total{model="m"} 0`,
		`exo_generation_tokens_total{model="m"} 0`, `exo_requests_total{code="200",model="m"} 0`,
		`exo_kv_transfer_duration_seconds_count{role="decode"} 0`,
	} {
		if !strings.Contains(dt, want) {
			t.Errorf("decode exposition lacks %q", want)
		}
	}
	if !strings.Contains(pt, `exo_kv_transfer_duration_seconds_count{role="prefill"} 0`) {
		t.Errorf("prefill exposition lacks its KV transfer histogram:\n%s", pt)
	}
}

// scrape is m's /metrics page.
func scrape(m *Runner) string {
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	b, _ := io.ReadAll(rec.Body)
	return string(b)
}
