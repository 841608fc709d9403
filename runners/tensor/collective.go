package tensor

import (
	"fmt"
	"slices"
	"time"

	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/prometheus/client_golang/prometheus"
)

// The cpu backend has no distributed engine: its ranks sum over the
// tensor link (a star through rank 0). Each follower writes its operand
// (a Partial frame), rank 0 reads them in rank order, sums them with its
// own (engine.SumRanks: float32, rank order, the bytes LocalGroup would
// give) and writes the sum to every follower (a Sum frame), so every rank
// gets the same bytes. The engine calls AllSum only inside a call, while
// rank 0 holds the group for it.

// leaderSum is rank 0's side of the star all_sum.
type leaderSum struct{ g *Leader }

func (s leaderSum) Rank() int { return 0 }
func (s leaderSum) Size() int { return s.g.size }

func (s leaderSum) AllSum(b engine.Backend, x engine.Array) engine.Array {
	raw, err := b.Bytes(x)
	if err != nil {
		panic(fmt.Errorf("all_sum: %w", err))
	}
	peers := s.g.cur
	if len(peers) != s.g.size-1 {
		panic(fmt.Errorf("%w: all_sum outside a call", ErrGroup))
	}
	parts := s.g.parts[:0]
	parts = append(parts, raw)
	for _, p := range peers {
		payload, err := s.g.next(p, framePartial)
		if err != nil {
			panic(fmt.Errorf("all_sum: %w", err))
		}
		parts = append(parts, payload)
	}
	s.g.parts = parts[:0]
	sum, err := engine.SumRanks(parts, x.DType())
	if err != nil {
		panic(fmt.Errorf("all_sum: %w", err))
	}
	for _, p := range peers {
		if err := p.l.write(frameSum, sum); err != nil {
			panic(fmt.Errorf("all_sum: %w", err))
		}
	}
	return b.FromBytes(sum, slices.Clone(x.Shape()), x.DType())
}

// followerSum is a follower's side: the link is the one its current
// call came on.
type followerSum struct{ f *Follower }

func (s followerSum) Rank() int { return s.f.rank }
func (s followerSum) Size() int { return s.f.size }

func (s followerSum) AllSum(b engine.Backend, x engine.Array) engine.Array {
	raw, err := b.Bytes(x)
	if err != nil {
		panic(fmt.Errorf("all_sum: %w", err))
	}
	l := s.f.cur
	if l == nil {
		panic(fmt.Errorf("%w: all_sum outside a call", ErrGroup))
	}
	if err := l.write(framePartial, raw); err != nil {
		panic(fmt.Errorf("all_sum: %w", err))
	}
	// Rank 0 answers once every rank's operand is in: a silent rank 0
	// (stopped, or its host gone without a reset) ends the wait.
	_ = l.conn.SetReadDeadline(time.Now().Add(s.f.cfg.Timeout))
	typ, sum, err := l.read(s.f.sumBuf)
	_ = l.conn.SetReadDeadline(time.Time{})
	if err != nil {
		panic(fmt.Errorf("all_sum: %w", err))
	}
	s.f.sumBuf = sum[:0]
	if typ != frameSum || len(sum) != len(raw) {
		panic(fmt.Errorf("%w: all_sum: rank 0 sent frame type %d of %d bytes, want a sum of %d", ErrLink, typ, len(sum), len(raw)))
	}
	return b.FromBytes(sum, slices.Clone(x.Shape()), x.DType())
}

// Metrics are a rank's all_sum counters (labels model, rank), registered
// on the runner's registry.
type Metrics struct {
	Calls   *prometheus.CounterVec
	Bytes   *prometheus.CounterVec
	Seconds *prometheus.CounterVec
	Group   *prometheus.GaugeVec // exo_tensor_group (Sums)
}

// NewMetrics makes and registers exo_tensor_allsum_total,
// exo_tensor_allsum_bytes_total and exo_tensor_allsum_seconds_total on
// reg (nil: unregistered).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Calls: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "exo_tensor_allsum_total",
			Help: "All_sums this tensor-parallel rank has run (two per layer and step)."}, []string{"model", "rank"}),
		Bytes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "exo_tensor_allsum_bytes_total",
			Help: "Bytes of this rank's all_sum operands."}, []string{"model", "rank"}),
		Seconds: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "exo_tensor_allsum_seconds_total",
			Help: "Time this rank spent in all_sums (on mlx: queuing the lazy op; its wait is in the step's eval)."}, []string{"model", "rank"}),
		Group: newGroupGauge(),
	}
	if reg != nil {
		m.Register(reg)
	}
	return m
}

// Register registers m's counters on reg (a runner makes its Metrics
// before its registry: the collective exists before the model loads).
func (m *Metrics) Register(reg prometheus.Registerer) {
	reg.MustRegister(m.Calls, m.Bytes, m.Seconds, m.Group)
}

// metered counts a Collective's all_sums.
type metered struct {
	engine.Collective
	calls, bytes, secs prometheus.Counter
}

// Meter wraps c so that its all_sums are counted in m under model and
// c's rank (m nil: c itself).
func Meter(c engine.Collective, m *Metrics, model string) engine.Collective {
	if m == nil {
		return c
	}
	r := fmt.Sprint(c.Rank())
	return &metered{Collective: c, calls: m.Calls.WithLabelValues(model, r),
		bytes: m.Bytes.WithLabelValues(model, r), secs: m.Seconds.WithLabelValues(model, r)}
}

func (m *metered) AllSum(b engine.Backend, x engine.Array) engine.Array {
	t0 := time.Now()
	out := m.Collective.AllSum(b, x)
	m.secs.Add(time.Since(t0).Seconds())
	m.calls.Inc()
	n := x.DType().Size()
	for _, d := range x.Shape() {
		n *= d
	}
	m.bytes.Add(float64(n))
	return out
}
