package stage

import (
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are a stage's metrics (contract C1), registered in the runner's
// registry.
type Metrics struct {
	StepSeconds *prometheus.HistogramVec // model, stage: a stage's compute per step
	LinkBytes   *prometheus.CounterVec   // model, stage, direction (sent, received), transport (tcp, mlx)
	LinkSeconds *prometheus.CounterVec   // model, stage: time spent writing frames to the links
	InFlight    *prometheus.GaugeVec     // model, stage: steps sent down the ring and not answered (stage 0), or being computed
	Bubble      *prometheus.GaugeVec     // model, stage: the stage's idle share of the time the ring had work
	Transport   *prometheus.GaugeVec     // model, stage, transport, reason: 1 for where the stage's hidden states go (Transport)
}

// NewMetrics registers the stage metrics in reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		StepSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "exo_stage_step_seconds",
			Help:    "Time a pipeline stage spends computing one step (its layers; on the last stage the logits and the picks).",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16)}, []string{"model", "stage"}),
		LinkBytes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "exo_stage_link_bytes_total",
			Help: "Bytes a stage sent to or received from its neighbours: transport tcp, the stage link's frames with headers; mlx, the hidden states carried over MLX's ring (payload)."}, []string{"model", "stage", "direction", "transport"}),
		LinkSeconds: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "exo_stage_link_seconds_total",
			Help: "Time a stage spent writing frames to its downstream stage link."}, []string{"model", "stage"}),
		InFlight: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "exo_stage_microbatches_in_flight",
			Help: "Micro-batches stage 0 has sent down the ring and not had answered; on a later stage, the steps it is computing."}, []string{"model", "stage"}),
		Bubble: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "exo_stage_bubble_ratio",
			Help: "A stage's idle share of the time the pipeline had work: the gaps under a second between its steps over those gaps plus its compute."}, []string{"model", "stage"}),
		Transport: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "exo_stage_transport",
			Help: "1 for where a stage's hidden states go: transport mlx (MLX's ring, joined), tcp (the stage link; reason: why not a group, e.g. cpu_backend, peer_not_offering), pending (offered, links not both up yet)."}, []string{"model", "stage", "transport", "reason"}),
	}
	reg.MustRegister(m.StepSeconds, m.LinkBytes, m.LinkSeconds, m.InFlight, m.Bubble, m.Transport)
	return m
}

// stageMetrics is one stage's bound series and its bubble accounting.
type stageMetrics struct {
	step             prometheus.Observer
	sent, recv, link prometheus.Counter
	model, stage     string
	bytes            *prometheus.CounterVec
	inFlight, bubble prometheus.Gauge
	transport        *prometheus.GaugeVec

	mu         sync.Mutex
	lastEnd    time.Time
	busy, idle time.Duration
}

// idleGap is the longest gap between steps counted as a bubble; longer
// ones are the pipeline having no work.
const idleGap = time.Second

func (m *Metrics) bind(model string, stage int) *stageMetrics {
	if m == nil {
		m = NewMetrics(prometheus.NewRegistry())
	}
	s := strconv.Itoa(stage)
	return &stageMetrics{step: m.StepSeconds.WithLabelValues(model, s), model: model, stage: s, bytes: m.LinkBytes,
		sent: m.LinkBytes.WithLabelValues(model, s, "sent", "tcp"), recv: m.LinkBytes.WithLabelValues(model, s, "received", "tcp"),
		link: m.LinkSeconds.WithLabelValues(model, s), inFlight: m.InFlight.WithLabelValues(model, s), bubble: m.Bubble.WithLabelValues(model, s),
		transport: m.Transport}
}

// report starts the stage's Transport report at t.
func (s *stageMetrics) report(t Transport) *TransportReport {
	r := &TransportReport{gauge: s.transport, model: s.model, stage: s.stage}
	r.Set(t)
	return r
}

// count is a LinkConfig.Count.
func (s *stageMetrics) count(sent bool, n int) {
	if sent {
		s.sent.Add(float64(n))
	} else {
		s.recv.Add(float64(n))
	}
}

// carried returns the counters of the hidden-state bytes a group
// transport (its label) carries: sent and received.
func (s *stageMetrics) carried(transport string) (sent, recv prometheus.Counter) {
	return s.bytes.WithLabelValues(s.model, s.stage, "sent", transport), s.bytes.WithLabelValues(s.model, s.stage, "received", transport)
}

// stepped records a step computed over [t0, t1].
func (s *stageMetrics) stepped(t0, t1 time.Time) {
	s.step.Observe(t1.Sub(t0).Seconds())
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.lastEnd.IsZero() {
		if gap := t0.Sub(s.lastEnd); gap > 0 && gap < idleGap {
			s.idle += gap
		}
	}
	s.busy += t1.Sub(t0)
	s.lastEnd = t1
	if tot := s.busy + s.idle; tot > 0 {
		s.bubble.Set(s.idle.Seconds() / tot.Seconds())
	}
}
