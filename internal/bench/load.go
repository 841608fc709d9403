package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"
)

// httpStatusError is a non-200 answer from the server.
type httpStatusError struct {
	Code int
	Msg  string
}

func (e *httpStatusError) Error() string { return fmt.Sprintf("HTTP %d: %s", e.Code, e.Msg) }

// percentile is the nearest-rank p-th percentile (0 < p ≤ 100) of v; 0 for
// an empty v.
func percentile(v []float64, p float64) float64 {
	if len(v) == 0 {
		return 0
	}
	v = slices.Clone(v)
	slices.Sort(v)
	k := int(math.Ceil(p/100*float64(len(v)))) - 1
	return v[max(0, min(k, len(v)-1))]
}

// loadResult is a sustained run: Streams workers each sending one request
// after another for Duration.
type loadResult struct {
	PP       int     `json:"pp"`
	TG       int     `json:"tg"`
	Mode     string  `json:"mode"`
	Streams  int     `json:"streams"`
	Duration float64 `json:"duration_s"`
	OK       int     `json:"ok"`
	// Status counts the non-200 answers by HTTP status; Failed the
	// requests that failed otherwise (transport, mid-stream error).
	Status map[int]int `json:"status,omitempty"`
	Failed int         `json:"failed"`
	// MinInFlightAt429 is, over the 429s, the fewest of this client's
	// requests in flight (the refused one included) at the most crowded
	// moment between sending the refused request and reading its answer:
	// with no other client, a runner whose queue of Q was full held Q
	// waiting requests then, so a number ≤ Q would be a refusal before the
	// queue was full.
	MinInFlightAt429 int     `json:"min_in_flight_at_429,omitempty"`
	TTFTP50          float64 `json:"ttft_p50_s"`
	TTFTP99          float64 `json:"ttft_p99_s"`
	LatencyP50       float64 `json:"latency_p50_s"`
	LatencyP99       float64 `json:"latency_p99_s"`
	AggregateTPS     float64 `json:"aggregate_generation_tokens_per_s"`
	FirstError       string  `json:"first_error,omitempty"`
}

// flights tracks the requests in flight and, for each, the most that were
// in flight at once during its life.
type flights struct {
	mu     sync.Mutex
	active map[*int]struct{}
}

func (f *flights) begin() *int {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.active == nil {
		f.active = map[*int]struct{}{}
	}
	n := len(f.active) + 1
	for p := range f.active {
		*p = max(*p, n)
	}
	peak := n
	f.active[&peak] = struct{}{}
	return &peak
}

// end removes a request and returns its peak.
func (f *flights) end(p *int) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.active, p)
	return *p
}

// runLoad keeps n requests in flight for d: each worker builds one prompt
// of pp tokens before the clock starts and then, request after request,
// swaps in a fresh nonce (same length) so no prefix cache serves it.
func (b *bencher) runLoad(ctx context.Context, pp, tg int, mode string, n int, d time.Duration) (loadResult, error) {
	base := make([]string, n)
	for i := range base {
		var err error
		if base[i], _, err = b.prompt(ctx, pp); err != nil {
			return loadResult{}, err
		}
	}
	res := loadResult{PP: pp, TG: tg, Mode: mode, Streams: n, Status: map[int]int{}}
	var (
		mu   sync.Mutex
		runs []benchRun
		fl   flights
		wg   sync.WaitGroup
	)
	t0 := time.Now()
	end := t0.Add(d)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(end) && ctx.Err() == nil {
				content := fmt.Sprintf("Run %08x.", rand.Uint32()) + strings.TrimPrefix(base[i], base[i][:len("Run 00000000.")])
				peak := fl.begin()
				r, err := b.send(ctx, content, tg, mode)
				mu.Lock()
				now := fl.end(peak)
				var he *httpStatusError
				switch {
				case err == nil:
					res.OK++
					runs = append(runs, r)
				case errors.As(err, &he):
					res.Status[he.Code]++
					if he.Code == http.StatusTooManyRequests && (res.MinInFlightAt429 == 0 || now < res.MinInFlightAt429) {
						res.MinInFlightAt429 = now
					}
				default:
					res.Failed++
				}
				if err != nil && res.FirstError == "" {
					res.FirstError = err.Error()
				}
				mu.Unlock()
				if err != nil && ctx.Err() == nil {
					// A refused request is retried after a pause, as a
					// client honouring Retry-After would.
					select {
					case <-time.After(100 * time.Millisecond):
					case <-ctx.Done():
					}
				}
			}
		}()
	}
	wg.Wait()
	wall := time.Since(t0).Seconds()
	res.Duration = wall
	var ttft, lat []float64
	tokens := 0
	for _, r := range runs {
		ttft = append(ttft, r.TTFT)
		lat = append(lat, r.Total)
		tokens += r.CompletionTokens
	}
	res.TTFTP50, res.TTFTP99 = percentile(ttft, 50), percentile(ttft, 99)
	res.LatencyP50, res.LatencyP99 = percentile(lat, 50), percentile(lat, 99)
	res.AggregateTPS = float64(tokens) / wall
	return res, ctx.Err()
}

// printLoad writes a load result as text; it returns an error when any
// request failed other than with 429 (the queue-full refusal).
func printLoad(w io.Writer, r loadResult) error {
	fmt.Fprintf(w, "pp=%d tg=%d %s: %d streams for %.1fs: %d ok", r.PP, r.TG, r.Mode, r.Streams, r.Duration, r.OK)
	codes := make([]int, 0, len(r.Status))
	for c := range r.Status {
		codes = append(codes, c)
	}
	slices.Sort(codes)
	for _, c := range codes {
		fmt.Fprintf(w, ", %d × HTTP %d", r.Status[c], c)
	}
	fmt.Fprintf(w, ", %d failed otherwise\n", r.Failed)
	if r.MinInFlightAt429 > 0 {
		fmt.Fprintf(w, "  429s came with at least %d requests in flight\n", r.MinInFlightAt429)
	}
	fmt.Fprintf(w, "  TTFT p50 %.3fs p99 %.3fs; latency p50 %.3fs p99 %.3fs; %.1f gen tok/s together\n",
		r.TTFTP50, r.TTFTP99, r.LatencyP50, r.LatencyP99, r.AggregateTPS)
	return loadErr(r)
}

func loadErr(r loadResult) error {
	bad := r.Failed
	for c, k := range r.Status {
		if c != http.StatusTooManyRequests {
			bad += k
		}
	}
	if bad > 0 {
		return fmt.Errorf("bench: %d requests failed other than with 429 (first: %s)", bad, r.FirstError)
	}
	return nil
}
