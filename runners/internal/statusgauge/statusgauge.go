// Package statusgauge owns reporting a runner's current choice — where a
// pipeline stage's hidden states go (runners/stage's TransportReport,
// exo_stage_transport), how a tensor rank's all_sums run (runners/tensor,
// exo_tensor_group) — as one series of a gauge, = 1, labelled by the
// choice: a new choice replaces the old series, so that a scrape never
// shows two, and the choice itself is read back for /health.
//
// It must not register or name metrics: its callers own their gauges.
package statusgauge

import (
	"slices"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// Value is the current choice, and the series that reports it. The zero
// Value holds T's zero value and reports nothing.
type Value[T any] struct {
	mu     sync.Mutex
	cur    T
	gauge  *prometheus.GaugeVec // of the series set last (nil: none)
	labels []string
}

// Set makes v the choice and, with a gauge, the series of labels its one
// series (= 1) in place of the one set before (which it deletes when its
// labels differ); gauge nil: no series (the one set before is deleted).
func (s *Value[T]) Set(v T, gauge *prometheus.GaugeVec, labels ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.gauge != nil && (s.gauge != gauge || !slices.Equal(s.labels, labels)) {
		s.gauge.DeleteLabelValues(s.labels...)
	}
	if gauge != nil {
		gauge.WithLabelValues(labels...).Set(1)
	}
	s.cur, s.gauge, s.labels = v, gauge, slices.Clone(labels)
}

// Get is the choice now.
func (s *Value[T]) Get() T {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cur
}
