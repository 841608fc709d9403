package decode

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/gen"
	"github.com/exo-pd/exo-pd/runners/metrics"
	"github.com/exo-pd/exo-pd/runners/tokenizer"
)

var errTestBusy = errors.New("test remote: busy")

// busyRemote counts calls and answers busy (the runner then prefills
// locally), so the test sees whether the router sent the request remote.
type busyRemote struct{ calls atomic.Int32 }

func (r *busyRemote) Prefill(context.Context, string, []int32, int, engine.KVCache, []string) (RemoteStats, error) {
	r.calls.Add(1)
	return RemoteStats{}, errTestBusy
}
func (r *busyRemote) Classify(error) string { return metrics.OutcomeFallbackBusy }

// TestFillFollowsRouter: with the router's measured rates saying local is
// faster, a long prompt stays local (no remote call, skipped_cost); with
// them saying remote is faster it goes remote; each decision is counted by
// route and reason, and a local fill feeds the local rate back.
func TestFillFollowsRouter(t *testing.T) {
	tok, err := tokenizer.Load("../tokenizer/testdata/tiny_qwen2")
	if err != nil {
		t.Fatal(err)
	}
	prompt := strings.Repeat(" a", 600)
	for _, c := range []struct {
		name        string
		localRate   float64
		remoteCalls int32
		route       string
		outcome     string
	}{
		{"local faster", 1e6, 0, RouteLocal, metrics.OutcomeSkippedCost},
		{"remote faster", 10, 1, RouteRemote, metrics.OutcomeFallbackBusy},
	} {
		t.Run(c.name, func(t *testing.T) {
			rates := NewRates()
			rates.ObservePrefill("local", 512, secs(512/c.localRate))
			rates.ObservePrefill("spark", 512, secs(512/5600.0))
			rates.ObserveTransfer("spark", 1<<30, time.Second)
			router := &Router{Rates: rates, KVBytesPerToken: 1024, Endpoints: func() []string { return []string{"spark"} }}
			rem := &busyRemote{}
			met := metrics.New("decode")
			m := &scriptModel{eos: tok.EOS()[0], vocab: tok.VocabSize()}
			s := New(Options{Name: "m", Model: m, Text: NewText(tok, nil), NewSampler: NewSampler,
				NewStopMatcher: NewStopMatcher, MaxBatch: 1, Remote: rem, RemoteMinTokens: 16, Router: router,
				Metrics: met, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
			defer s.Close()
			var em textEmitter
			if _, err := s.Generate(context.Background(), &gen.Request{Model: "m", Prompt: prompt, MaxTokens: 1}, &em); err != nil {
				t.Fatal(err)
			}
			if got := rem.calls.Load(); got != c.remoteCalls {
				t.Errorf("remote called %d times, want %d", got, c.remoteCalls)
			}
			if got := counterValue(t, met.RouteDecisions.WithLabelValues(c.route, ReasonFaster)); got != 1 {
				t.Errorf("decisions{%s,%s} = %v, want 1", c.route, ReasonFaster, got)
			}
			if got := counterValue(t, met.RemotePrefill.WithLabelValues(c.outcome)); got != 1 {
				t.Errorf("remote prefill outcome %s = %v, want 1", c.outcome, got)
			}
			if c.route == RouteLocal && histCount(t, met.RouteError) != 1 {
				t.Error("no prediction error observed for the local fill")
			}
			if got := rates.PrefillRate("local", 600); got == c.localRate {
				t.Errorf("local rate still %v: the local fill did not feed it back", got)
			}
		})
	}
}

func counterValue(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

func histCount(t *testing.T, h prometheus.Histogram) uint64 {
	t.Helper()
	var m dto.Metric
	if err := h.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetHistogram().GetSampleCount()
}
