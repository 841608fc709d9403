package decode

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"
)

// PrefillLoad is what a prefill runner's /health says of its queue.
type PrefillLoad struct {
	Waiting int `json:"waiting"` // admitted requests waiting for the model
	Running int `json:"running"` // requests producing now
}

// FetchPrefillLoad reads the load of the prefill runner whose HTTP address
// (--metrics) is healthAddr from its /health.
func FetchPrefillLoad(ctx context.Context, c *http.Client, healthAddr string) (PrefillLoad, error) {
	var l PrefillLoad
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+healthAddr+"/health", nil)
	if err != nil {
		return l, fmt.Errorf("prefill health %s: %w", healthAddr, err)
	}
	resp, err := c.Do(req)
	if err != nil {
		return l, fmt.Errorf("prefill health %s: %w", healthAddr, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return l, fmt.Errorf("prefill health %s: HTTP %d", healthAddr, resp.StatusCode)
	}
	var body struct {
		PrefillLoad
		Role string `json:"role"`
	}
	if err := json.NewDecoder(http.MaxBytesReader(nil, resp.Body, 1<<20)).Decode(&body); err != nil {
		return l, fmt.Errorf("prefill health %s: %w", healthAddr, err)
	}
	if body.Role != "prefill" {
		return l, fmt.Errorf("prefill health %s: role %q, not a prefill runner", healthAddr, body.Role)
	}
	if body.Waiting < 0 || body.Running < 0 {
		return l, fmt.Errorf("prefill health %s: negative load %+v", healthAddr, body.PrefillLoad)
	}
	return body.PrefillLoad, nil
}

// WatchLoad polls each prefill runner's /health every `every` (default
// 250 ms) and hands its whole load (waiting + running, which counts this
// decode runner's own fetches there too) to report, keyed by its KV-wire
// address (health maps KV-wire address → HTTP address). A failed poll
// reports 0: nothing is known, and a host that does not answer is the
// breaker's business. It returns when ctx ends.
func WatchLoad(ctx context.Context, health map[string]string, every time.Duration, report func(addr string, load int, err error)) {
	if every <= 0 {
		every = 250 * time.Millisecond
	}
	c := &http.Client{Timeout: max(every, time.Second)}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		for addr, h := range health {
			l, err := FetchPrefillLoad(ctx, c, h)
			if ctx.Err() != nil {
				return
			}
			report(addr, l.Waiting+l.Running, err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
