package decode

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/kvwire"
	"github.com/exo-pd/exo-pd/runners/metrics"
)

// TestNewRemote: the wiring measures its endpoint at start, and when the
// breaker opens and a probe closes it again, the callback (on the probe's
// goroutine) forgets the link and measures it again: it reads the remote
// and the router it was wired with (under -race too), and the endpoint's
// state and trips reach the metrics.
func TestNewRemote(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// One model each side: a backend is not shared between goroutines.
	m, pm := loadReference(t, "qwen3_next", engine.LoadOptions{}), loadReference(t, "qwen3_next", engine.LoadOptions{})
	addr := servePrefill(t, pm, 16, nil)
	met := metrics.New("decode")
	w := NewRemote(ctx, RemoteConfig{Name: "m", Model: m, Endpoints: []string{addr}, Cost: true, Chunk: 16,
		ConnectTimeout: 5 * time.Second, Streams: 1, Probe: 5 * time.Millisecond, Metrics: met})
	if w.Router == nil || w.Remote.Breaker != w.Breaker || w.Remote.Selector == nil {
		t.Fatalf("wiring: %+v", w)
	}
	if r := w.Router.Rates.PrefillRate("local", 256); r <= 0 {
		t.Errorf("local prefill not calibrated: rate %v", r)
	}
	eventually(t, "the endpoint measured at start", func() bool { return w.Router.Rates.Goodput(addr) > 0 })

	w.Breaker.Report(addr, kvwire.Stats{}, fmt.Errorf("fetch: %w", kvwire.ErrClosed))
	eventually(t, "the probe closes the circuit and the link is measured again", func() bool {
		st := w.Breaker.Status()
		return st[0].State == Closed && st[0].Trips == 1 && w.Router.Rates.Goodput(addr) > 0 &&
			counterValue(t, met.PrefillEndpointTrips.WithLabelValues(addr)) == 1 &&
			gaugeValue(t, met.PrefillEndpointState.WithLabelValues(addr)) == 0
	})
	if got := w.Router.Endpoints(); len(got) != 1 || got[0] != addr {
		t.Errorf("router endpoints %v", got)
	}
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func gaugeValue(t *testing.T, g prometheus.Gauge) float64 {
	t.Helper()
	var m dto.Metric
	if err := g.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetGauge().GetValue()
}

func TestProbeTokens(t *testing.T) {
	for _, c := range []struct {
		d    time.Duration
		want int
	}{
		{0, 128}, {100 * time.Microsecond, 128}, {2 * time.Millisecond, 125}, {50 * time.Millisecond, 5},
		{250 * time.Millisecond, 1}, {2 * time.Second, 1},
	} {
		if got := probeTokens(c.d); got != c.want {
			t.Errorf("probeTokens(%v) = %d, want %d", c.d, got, c.want)
		}
	}
}
