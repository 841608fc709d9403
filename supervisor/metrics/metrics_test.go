package metrics

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"
)

var update = flag.Bool("update", false, "rewrite golden files")

func TestMergedExposition(t *testing.T) {
	decode := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, `# HELP exo_requests_total Requests by model and code.
# TYPE exo_requests_total counter
exo_requests_total{code="200",model="m"} 7
# HELP exo_time_to_first_token_seconds Time to first token.
# TYPE exo_time_to_first_token_seconds histogram
exo_time_to_first_token_seconds_bucket{model="m",le="0.1"} 3
exo_time_to_first_token_seconds_bucket{model="m",le="+Inf"} 7
exo_time_to_first_token_seconds_sum{model="m"} 1.5
exo_time_to_first_token_seconds_count{model="m"} 7
# HELP exo_requests_waiting Requests waiting.
# TYPE exo_requests_waiting gauge
exo_requests_waiting 2
`)
	}))
	defer decode.Close()
	prefill := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "# HELP exo_requests_waiting Requests waiting.\n# TYPE exo_requests_waiting gauge\nexo_requests_waiting 0\n")
	}))
	defer prefill.Close()
	m := New(func() []Runner {
		return []Runner{
			{Name: "m-decode", Role: "decode", Model: "m", Up: true, Restarts: 2, MetricsURL: decode.URL + "/metrics"},
			{Name: "m-prefill", Role: "prefill", Model: "m", Up: false, Restarts: 0, LoadProgress: 0.25, MetricsURL: prefill.URL + "/metrics"},
			{Name: "x-decode", Role: "decode", Model: "x", Up: false, CrashLoop: true, Restarts: 9, LivenessKills: 3, MetricsURL: "http://127.0.0.1:1/metrics"},
		}
	})
	m.SetReload(true, time.Unix(1700000000, 500e6))
	m.SetReload(false, time.Unix(1700000100, 0))

	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	// Durations vary from run to run.
	body = regexp.MustCompile(`(?m)^exo_scrape_collector_duration_seconds\{.*\n`).ReplaceAll(body, nil)
	path := filepath.Join("testdata", "merged.prom")
	if *update {
		os.WriteFile(path, body, 0o644)
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(body, want) {
		t.Errorf("exposition differs from %s:\n%s", path, body)
	}
}
