// Package bench owns exo bench's measurements: streaming chat requests
// whose prompts have an exact token count (built with the endpoint's POST
// /tokenize), TTFT and tokens/s medians, the remote-vs-local comparison
// and the sustained load mode. It talks HTTP to any OpenAI-compatible
// endpoint (reading the stream with internal/sse) and must not import
// supervisor/ or the runners' internals (runners/openai's wire types only).
package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/exo-pd/exo-pd/internal/sse"
	"github.com/exo-pd/exo-pd/runners/openai"
)

// benchRun is one measured request.
type benchRun struct {
	Mode             string  `json:"mode"` // "remote" (default path) or "local"
	PromptTokens     int     `json:"prompt_tokens"`
	CachedTokens     int     `json:"cached_tokens"`
	CompletionTokens int     `json:"completion_tokens"`
	TTFT             float64 `json:"ttft_s"`
	Total            float64 `json:"total_s"`
	PromptTPS        float64 `json:"prompt_tokens_per_s"`
	GenTPS           float64 `json:"generation_tokens_per_s"`
}

// benchRow summarizes the runs of one (pp, mode).
type benchRow struct {
	PP        int     `json:"pp"`
	TG        int     `json:"tg"`
	Mode      string  `json:"mode"`
	TTFT      float64 `json:"ttft_s"`
	PromptTPS float64 `json:"prompt_tokens_per_s"`
	GenTPS    float64 `json:"generation_tokens_per_s"`
	Speedup   float64 `json:"ttft_speedup_vs_local,omitempty"`
	// Concurrency requests per run; AggregateTPS is the median over runs
	// of all their completion tokens over the run's wall time.
	Concurrency  int        `json:"concurrency"`
	AggregateTPS float64    `json:"aggregate_generation_tokens_per_s"`
	Runs         []benchRun `json:"runs"`
}

// Config is one bench invocation (exo bench's flags).
type Config struct {
	URL          string // base URL of a gateway or decode runner
	Model        string // "" : the only one /v1/models lists
	PP           []int  // prompt lengths in tokens
	TG           int    // tokens to generate per request
	Repeat       int    // runs per prompt length and mode
	CompareLocal bool
	JSON         bool
	Concurrency  int
	// Duration > 0 is load mode: Concurrency requests in flight this long
	// per prompt length.
	Duration time.Duration
}

// ErrPickModel: the endpoint serves several models and none was named.
var ErrPickModel = errors.New("pick one with --model")

// Run measures as c says, writing the results to stdout (a table, or
// JSON) and progress to stderr.
func Run(ctx context.Context, c Config, stdout, stderr io.Writer) error {
	b := &bencher{base: strings.TrimRight(c.URL, "/"), model: c.Model, client: &http.Client{}, stderr: stderr}
	if b.model == "" {
		m, err := b.onlyModel(ctx)
		if err != nil {
			return err
		}
		b.model = m
	}
	modes := []string{"remote"}
	if c.CompareLocal {
		modes = append(modes, "local")
	}
	if c.Duration > 0 {
		var loads []loadResult
		var errs []error
		for _, pp := range c.PP {
			for _, mode := range modes {
				r, err := b.runLoad(ctx, pp, c.TG, mode, c.Concurrency, c.Duration)
				if err != nil {
					return fmt.Errorf("bench: pp=%d %s load: %w", pp, mode, err)
				}
				loads = append(loads, r)
				if !c.JSON {
					errs = append(errs, printLoad(stdout, r))
				} else {
					errs = append(errs, loadErr(r))
				}
			}
		}
		if c.JSON {
			enc := json.NewEncoder(stdout)
			enc.SetIndent("", "  ")
			if err := enc.Encode(map[string]any{"url": b.base, "model": b.model, "load": loads}); err != nil {
				return err
			}
		}
		return errors.Join(errs...)
	}
	var rows []benchRow
	for _, pp := range c.PP {
		var local *benchRow
		var group []benchRow
		for _, mode := range modes {
			row := benchRow{PP: pp, TG: c.TG, Mode: mode, Concurrency: c.Concurrency}
			var aggs []float64
			for i := range c.Repeat {
				rs, agg, err := b.runGroup(ctx, pp, c.TG, mode, c.Concurrency)
				if err != nil {
					return fmt.Errorf("bench: pp=%d %s run %d: %w", pp, mode, i+1, err)
				}
				row.Runs = append(row.Runs, rs...)
				aggs = append(aggs, agg)
				if !c.JSON {
					for _, r := range rs {
						fmt.Fprintf(stderr, "pp=%d %s run %d: ttft %.3fs, %d prompt tokens, %.1f gen tok/s\n",
							pp, mode, i+1, r.TTFT, r.PromptTokens, r.GenTPS)
					}
					if c.Concurrency > 1 {
						fmt.Fprintf(stderr, "pp=%d %s run %d: %d streams, %.1f gen tok/s together\n", pp, mode, i+1, c.Concurrency, agg)
					}
				}
			}
			row.AggregateTPS = medianOf(aggs)
			row.TTFT = median(row.Runs, func(r benchRun) float64 { return r.TTFT })
			row.PromptTPS = median(row.Runs, func(r benchRun) float64 { return r.PromptTPS })
			row.GenTPS = median(row.Runs, func(r benchRun) float64 { return r.GenTPS })
			group = append(group, row)
			if mode == "local" {
				local = &group[len(group)-1]
			}
		}
		if local != nil && group[0].TTFT > 0 {
			group[0].Speedup = local.TTFT / group[0].TTFT
		}
		rows = append(rows, group...)
	}
	if c.JSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(map[string]any{"url": b.base, "model": b.model, "repeat": c.Repeat, "results": rows})
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "pp\ttg\tprefill\tstreams\tTTFT s\tprompt tok/s\tgen tok/s\ttotal gen tok/s\tspeedup\t\n")
	for _, r := range rows {
		sp := ""
		if r.Speedup > 0 {
			sp = fmt.Sprintf("%.2fx", r.Speedup)
		}
		fmt.Fprintf(tw, "%d\t%d\t%s\t%d\t%.3f\t%.1f\t%.1f\t%.1f\t%s\t\n", r.PP, r.TG, r.Mode, r.Concurrency, r.TTFT,
			r.PromptTPS, r.GenTPS, r.AggregateTPS, sp)
	}
	return tw.Flush()
}

func median(runs []benchRun, f func(benchRun) float64) float64 {
	v := make([]float64, len(runs))
	for i, r := range runs {
		v[i] = f(r)
	}
	return medianOf(v)
}

func medianOf(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	v = slices.Clone(v)
	slices.Sort(v)
	if len(v)%2 == 1 {
		return v[len(v)/2]
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2
}

// runGroup sends n requests at once (each its own prompt) and returns them
// with the group's aggregate generation rate: all completion tokens over
// the wall time from the first request sent to the last one finished.
func (b *bencher) runGroup(ctx context.Context, pp, tg int, mode string, n int) ([]benchRun, float64, error) {
	// The prompts first: building one asks /tokenize, which must not run
	// beside the measured requests.
	prompts := make([]string, n)
	for i := range prompts {
		var err error
		if prompts[i], _, err = b.prompt(ctx, pp); err != nil {
			return nil, 0, err
		}
	}
	rs := make([]benchRun, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	t0 := time.Now()
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rs[i], errs[i] = b.send(ctx, prompts[i], tg, mode)
		}()
	}
	wg.Wait()
	wall := time.Since(t0).Seconds()
	if err := errors.Join(errs...); err != nil {
		return nil, 0, err
	}
	tokens := 0
	for _, r := range rs {
		tokens += r.CompletionTokens
	}
	return rs, float64(tokens) / wall, nil
}

type bencher struct {
	base, model string
	client      *http.Client
	stderr      io.Writer
	noTokenize  atomic.Bool
}

// countByUsage counts a prompt's tokens from the usage of a one-token
// completion (for endpoints without /tokenize).
func (b *bencher) countByUsage(ctx context.Context, content string) (int, error) {
	resp, err := b.do(ctx, "POST", "/v1/chat/completions", map[string]any{"model": b.model, "max_tokens": 1,
		"temperature": 0, "messages": []map[string]string{{"role": "user", "content": content}}})
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var cr struct {
		Usage struct {
			PromptTokens int `json:"prompt_tokens"`
		} `json:"usage"`
	}
	err = json.NewDecoder(resp.Body).Decode(&cr)
	// Read to the end, so that the connection is reused instead of being
	// closed under a response the server is still finishing.
	_, _ = io.Copy(io.Discard, resp.Body)
	if err != nil || cr.Usage.PromptTokens == 0 {
		return 0, fmt.Errorf("counting tokens by usage: %v", err)
	}
	return cr.Usage.PromptTokens, nil
}

func (b *bencher) do(ctx context.Context, method, path string, body any) (*http.Response, error) {
	var rd io.Reader
	if body != nil {
		bs, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		rd = bytes.NewReader(bs)
	}
	req, err := http.NewRequestWithContext(ctx, method, b.base+path, rd)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := b.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	if resp.StatusCode == http.StatusNotFound && path == "/tokenize" {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		resp.Body.Close()
		if !bytes.Contains(msg, []byte("model_not_found")) {
			return nil, errNoTokenize
		}
		return nil, fmt.Errorf("%s %s: HTTP 404: %s", method, path, strings.TrimSpace(string(msg)))
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return nil, fmt.Errorf("%s %s: %w", method, path, &httpStatusError{resp.StatusCode, strings.TrimSpace(string(msg))})
	}
	return resp, nil
}

func (b *bencher) onlyModel(ctx context.Context) (string, error) {
	resp, err := b.do(ctx, "GET", "/v1/models", nil)
	if err != nil {
		return "", fmt.Errorf("bench: %w", err)
	}
	defer resp.Body.Close()
	var ml struct {
		Data []struct{ ID string } `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&ml); err != nil {
		return "", fmt.Errorf("bench: /v1/models: %w", err)
	}
	if len(ml.Data) != 1 {
		return "", fmt.Errorf("bench: %d models served: %w", len(ml.Data), ErrPickModel)
	}
	return ml.Data[0].ID, nil
}

// errNoTokenize: the endpoint has no /tokenize (a gateway that does not
// forward it, or another server).
var errNoTokenize = errors.New("no /tokenize")

func (b *bencher) count(ctx context.Context, content string) (int, error) {
	if b.noTokenize.Load() {
		return b.countByUsage(ctx, content)
	}
	resp, err := b.do(ctx, "POST", "/tokenize", map[string]any{"model": b.model,
		"messages": []map[string]string{{"role": "user", "content": content}}, "add_generation_prompt": true})
	if errors.Is(err, errNoTokenize) {
		fmt.Fprintln(b.stderr, "bench: the endpoint has no /tokenize; counting prompt tokens with 1-token requests instead (slower; each probe prefills)")
		b.noTokenize.Store(true)
		return b.countByUsage(ctx, content)
	}
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var tr struct {
		Count int `json:"count"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&tr); err != nil {
		return 0, fmt.Errorf("/tokenize: %w", err)
	}
	return tr.Count, nil
}

var benchWords = strings.Fields("the quick brown fox jumps over a lazy dog while seven bright stars watch the quiet river under an old stone bridge and distant bells ring across the green valley")

// prompt builds user content whose chat-templated prompt has exactly pp
// tokens (or as close as the tokenizer allows), starting with a nonce.
func (b *bencher) prompt(ctx context.Context, pp int) (string, int, error) {
	nonce := fmt.Sprintf("Run %08x.", rand.Uint32())
	text := func(w int) string {
		var sb strings.Builder
		sb.WriteString(nonce)
		for i := range w {
			sb.WriteByte(' ')
			sb.WriteString(benchWords[i%len(benchWords)])
		}
		return sb.String()
	}
	// Largest word count whose prompt fits in pp tokens.
	lo, hi := 0, 1
	for {
		n, err := b.count(ctx, text(hi))
		if err != nil {
			return "", 0, err
		}
		if n > pp {
			break
		}
		lo, hi = hi, hi*2
	}
	for hi-lo > 1 {
		mid := (lo + hi) / 2
		n, err := b.count(ctx, text(mid))
		if err != nil {
			return "", 0, err
		}
		if n <= pp {
			lo = mid
		} else {
			hi = mid
		}
	}
	content := text(lo)
	n, err := b.count(ctx, content)
	if err != nil {
		return "", 0, err
	}
	// Top up with single letters, which are one token each in byte-level BPEs.
	for i := 0; n < pp && i < 16; i++ {
		c2 := content + " a"
		n2, err := b.count(ctx, c2)
		if err != nil {
			return "", 0, err
		}
		if n2 > pp {
			break
		}
		content, n = c2, n2
	}
	return content, n, nil
}

// send streams one chat request and measures it.
func (b *bencher) send(ctx context.Context, content string, tg int, mode string) (benchRun, error) {
	body := map[string]any{"model": b.model, "stream": true, "temperature": 0, "max_tokens": tg, "ignore_eos": true,
		"messages": []map[string]string{{"role": "user", "content": content}}}
	if mode == "local" {
		body["x_exo_disable_remote_prefill"] = true
	}
	t0 := time.Now()
	resp, err := b.do(ctx, "POST", "/v1/chat/completions", body)
	if err != nil {
		return benchRun{}, err
	}
	defer resp.Body.Close()
	var first, last time.Time
	r := benchRun{Mode: mode}
	rd := sse.NewReader(resp.Body)
	done := false
	for !done {
		e, err := rd.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return r, fmt.Errorf("reading stream: %w", err)
		}
		if e.Data == "[DONE]" {
			done = true
			break
		}
		var ev struct {
			openai.ChatChunk
			Error *openai.ErrorDetail `json:"error"`
		}
		if err := json.Unmarshal([]byte(e.Data), &ev); err != nil {
			return r, fmt.Errorf("bad event %q: %w", e.Data, err)
		}
		if ev.Error != nil {
			return r, fmt.Errorf("server error mid-stream: %s", ev.Error.Message)
		}
		for _, c := range ev.Choices {
			if c.Delta != nil && c.Delta.Content != nil && *c.Delta.Content != "" {
				now := time.Now()
				if first.IsZero() {
					first = now
				}
				last = now
			}
		}
		if u := ev.Usage; u != nil {
			r.PromptTokens, r.CompletionTokens = u.PromptTokens, u.CompletionTokens
			if u.PromptTokensDetails != nil {
				r.CachedTokens = u.PromptTokensDetails.CachedTokens
			}
		}
	}
	if !done || first.IsZero() {
		return r, errors.New("stream ended without [DONE] or without any text")
	}
	r.Total = time.Since(t0).Seconds()
	r.TTFT = first.Sub(t0).Seconds()
	r.PromptTPS = float64(r.PromptTokens-r.CachedTokens) / r.TTFT
	if r.CompletionTokens > 1 && last.After(first) {
		r.GenTPS = float64(r.CompletionTokens-1) / last.Sub(first).Seconds()
	}
	return r, nil
}
