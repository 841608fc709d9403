package tensor

import (
	"strconv"

	"github.com/exo-pd/exo-pd/runners/internal/statusgauge"
	"github.com/prometheus/client_golang/prometheus"
)

// Sums is how a tensor rank's all_sums run: over the tensor link (the cpu
// backend) or over one of MLX's group backends, and why not the one the
// flags asked for when MLX fell back to its ring. A rank runner's /health
// says it ("tensor_group") and exo_tensor_group counts it, so operators and
// tests read the choice instead of the log.
type Sums struct {
	// Group is "link" (the cpu backend: the tensor link's own all_sum) or
	// MLX's group backend: "ring", "jaccl", "nccl".
	Group string `json:"group"`
	// Reason is a stable code when MLX fell back to its ring
	// (ReasonNoJACCL, ReasonNoNCCL); Detail says it in words.
	Reason string `json:"reason,omitempty"`
	Detail string `json:"detail,omitempty"`
}

// Reasons a rank's MLX group is its ring instead of the backend asked for.
const (
	// ReasonNoJACCL: --tensor-rdma asked for JACCL and this libmlx has
	// none usable.
	ReasonNoJACCL = "jaccl_unavailable"
	// ReasonNoNCCL: a CUDA rank and this libmlx has no NCCL.
	ReasonNoNCCL = "nccl_unavailable"
)

// mlxSums is the Sums of a rank on MLX's group backend bk, chosen by
// chooseMLXBackend (why: why not the one asked for; cuda: NCCL was).
func mlxSums(bk, why string, cuda bool) Sums {
	s := Sums{Group: bk}
	switch {
	case why != "" && cuda:
		s.Reason, s.Detail = ReasonNoNCCL, why
	case why != "":
		s.Reason, s.Detail = ReasonNoJACCL, why
	}
	return s
}

// sumsReport holds a rank's Sums once its collective is chosen, and its
// exo_tensor_group series (one, = 1).
type sumsReport struct{ v statusgauge.Value[Sums] }

func (r *sumsReport) set(s Sums, m *Metrics, model string, rank int) {
	if m == nil {
		r.v.Set(s, nil)
		return
	}
	r.v.Set(s, m.Group, model, strconv.Itoa(rank), s.Group, s.Reason)
}

func (r *sumsReport) get() Sums { return r.v.Get() }

// newGroupGauge is exo_tensor_group.
func newGroupGauge() *prometheus.GaugeVec {
	return prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "exo_tensor_group",
		Help: "1 for how this tensor-parallel rank's all_sums run: group link (the cpu backend's tensor link), ring, jaccl or nccl (MLX's group); reason: why MLX fell back to its ring (jaccl_unavailable, nccl_unavailable)."},
		[]string{"model", "rank", "group", "reason"})
}
