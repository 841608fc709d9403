package e2e

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"testing"
)

// TestBenchCompareLocal runs `exo bench --compare-local --json` against a
// prefill+decode pair on the tiny model and checks that the prompts are
// token-exact and that both modes ran the way they claim.
func TestBenchCompareLocal(t *testing.T) {
	dir := tinyModel(t, "main")
	pre := start(t, "prefill", "prefill", "--model", dir)
	dec := start(t, "decode", "decode", "--model", dir, "--prefill", pre.listen)
	okBefore := dec.metric(t, outcome("ok"))
	out, err := exec.Command(exoBin, "bench", "--url", "http://"+dec.listen, "--pp", "64,300", "--tg", "8",
		"--repeat", "2", "--compare-local", "--json").Output()
	if err != nil {
		t.Fatalf("exo bench: %v\n%s", err, out)
	}
	var res struct {
		Model   string
		Results []struct {
			PP      int     `json:"pp"`
			Mode    string  `json:"mode"`
			TTFT    float64 `json:"ttft_s"`
			GenTPS  float64 `json:"generation_tokens_per_s"`
			Speedup float64 `json:"ttft_speedup_vs_local"`
			Runs    []struct {
				PromptTokens     int `json:"prompt_tokens"`
				CompletionTokens int `json:"completion_tokens"`
				CachedTokens     int `json:"cached_tokens"`
			} `json:"runs"`
		} `json:"results"`
	}
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("bench JSON: %v\n%s", err, out)
	}
	if res.Model != "m" || len(res.Results) != 4 {
		t.Fatalf("results: %s", out)
	}
	for _, r := range res.Results {
		if r.TTFT <= 0 || r.GenTPS <= 0 || len(r.Runs) != 2 {
			t.Fatalf("row %+v", r)
		}
		for _, run := range r.Runs {
			if run.PromptTokens != r.PP || run.CompletionTokens != 8 {
				t.Fatalf("pp=%d %s: prompt %d tokens, completion %d (want exact)", r.PP, r.Mode, run.PromptTokens, run.CompletionTokens)
			}
		}
		if r.Mode == "remote" && r.Speedup <= 0 {
			t.Fatalf("no speedup reported: %+v", r)
		}
	}
	// pp=300 remote runs went over the wire (2 of them); pp=64 is short.
	if got := dec.metric(t, outcome("ok")) - okBefore; got != 2 {
		t.Fatalf("remote prefills %v, want 2", got)
	}
	if got := dec.metric(t, outcome("skipped_disabled")); got != 4 {
		t.Fatalf("local (disabled) runs %v, want 4", got)
	}
}

// TestBenchWithoutTokenize runs exo bench through a proxy that has no
// /tokenize (as a plain OpenAI gateway): it falls back to counting with
// one-token requests and still builds exact prompts.
func TestBenchWithoutTokenize(t *testing.T) {
	dec := start(t, "decode", "decode", "--model", tinyModel(t, "main"))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/tokenize" {
			http.NotFound(w, r)
			return
		}
		forward(t, w, r, "http://"+dec.listen)
	}))
	defer srv.Close()
	cmd := exec.Command(exoBin, "bench", "--url", srv.URL, "--model", "m", "--pp", "40", "--tg", "4", "--repeat", "1", "--json")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("exo bench: %v\n%s\n%s", err, out, stderr.String())
	}
	if !strings.Contains(stderr.String(), "no /tokenize") {
		t.Fatalf("no fallback notice: %s", stderr.String())
	}
	var res struct {
		Results []struct {
			Runs []struct {
				PromptTokens int `json:"prompt_tokens"`
			} `json:"runs"`
		} `json:"results"`
	}
	if err := json.Unmarshal(out, &res); err != nil || len(res.Results) != 1 || res.Results[0].Runs[0].PromptTokens != 40 {
		t.Fatalf("%v %s", err, out)
	}
}

// TestBenchConcurrency runs `exo bench --concurrency 4` against a batching
// decode runner: every run sends four requests at once, each token-exact,
// the JSON reports the aggregate rate, and the runner batched their steps.
func TestBenchConcurrency(t *testing.T) {
	dec := start(t, "decode-bench-conc", "decode", "--model", tinyModel(t, "main"), "--max-batch", "4")
	out, err := exec.Command(exoBin, "bench", "--url", "http://"+dec.listen, "--pp", "40", "--tg", "24",
		"--repeat", "2", "--concurrency", "4", "--json").Output()
	if err != nil {
		t.Fatalf("exo bench: %v\n%s", err, out)
	}
	var res struct {
		Results []struct {
			Concurrency  int     `json:"concurrency"`
			AggregateTPS float64 `json:"aggregate_generation_tokens_per_s"`
			GenTPS       float64 `json:"generation_tokens_per_s"`
			Runs         []struct {
				PromptTokens     int `json:"prompt_tokens"`
				CompletionTokens int `json:"completion_tokens"`
			} `json:"runs"`
		} `json:"results"`
	}
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("bench JSON: %v\n%s", err, out)
	}
	if len(res.Results) != 1 {
		t.Fatalf("results: %s", out)
	}
	r := res.Results[0]
	if r.Concurrency != 4 || len(r.Runs) != 8 || r.AggregateTPS <= 0 || r.GenTPS <= 0 {
		t.Fatalf("row %+v", r)
	}
	for _, run := range r.Runs {
		if run.PromptTokens != 40 || run.CompletionTokens != 24 {
			t.Fatalf("run %+v, want 40 prompt and 24 completion tokens", run)
		}
	}
	steps := dec.metric(t, "exo_decode_batch_sequences_count")
	if single := dec.metric(t, `exo_decode_batch_sequences_bucket{le="1"}`); single >= steps {
		t.Fatalf("no batched decode step (%v of %v steps held one sequence)", single, steps)
	}
}

// forward relays r to base and streams the answer back, flushing as it
// goes (a minimal proxy, as a plain OpenAI gateway would be).
func forward(t *testing.T, w http.ResponseWriter, r *http.Request, base string) {
	out, err := http.NewRequestWithContext(r.Context(), r.Method, base+r.URL.RequestURI(), r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	out.Header = r.Header.Clone()
	resp, err := http.DefaultTransport.RoundTrip(out)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	for k, v := range resp.Header {
		w.Header()[k] = v
	}
	w.WriteHeader(resp.StatusCode)
	buf := make([]byte, 32<<10)
	for {
		n, err := resp.Body.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return
			}
			w.(http.Flusher).Flush()
		}
		if err != nil {
			if err != io.EOF {
				t.Logf("proxy: reading the runner's answer: %v", err)
			}
			return
		}
	}
}
