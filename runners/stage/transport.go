package stage

import (
	"strconv"

	"github.com/exo-pd/exo-pd/runners/internal/statusgauge"
	"github.com/prometheus/client_golang/prometheus"
)

// Transport is where a stage's hidden states go, and why not over its
// backend's group when they stay on the stage link: a stage runner's
// /health "stage_transport" and exo_stage_transport, so that operators
// and tests read the decision instead of the log.
type Transport struct {
	// Transport: the group's transport once joined ("mlx"), "tcp" once
	// settled on the stage link, "pending" while this stage offers a
	// group and has not decided (its links are not both up yet).
	Transport string `json:"transport"`
	// Reason is a stable code (the Reason* constants) when Transport is
	// "tcp"; Detail says it in words.
	Reason string `json:"reason,omitempty"`
	Detail string `json:"detail,omitempty"`
}

// Transport values besides a group's own (Group.Transport).
const (
	TransportTCP     = "tcp"
	TransportPending = "pending"
)

// Reasons a stage's hidden states stay on the stage link (Transport.Reason).
const (
	// ReasonCPUBackend: the stage runs the cpu backend, which has no
	// distributed engine.
	ReasonCPUBackend = "cpu_backend"
	// ReasonNoRing: this libmlx has no ring backend (or cannot say).
	ReasonNoRing = "no_ring_backend"
	// ReasonRingPlan: no ring plan for this stage: MLX_HOSTFILE / MLX_RANK
	// missing (3 or more stages), wrong or unreadable, or no ring address
	// from --stage-listen / --stage-next.
	ReasonRingPlan = "no_ring_plan"
	// ReasonTensorStage: the stage is a tensor group, whose process's MLX
	// group is its ranks' (a process joins one).
	ReasonTensorStage = "tensor_stage"
	// ReasonPeer: a neighbouring stage did not offer the group (its Hello
	// had no GROUP flag: a cpu stage, or one with no ring plan).
	ReasonPeer = "peer_not_offering"
	// ReasonLongPipeline: more than 3 stages and this stage's ring plan
	// is not the supervisor's for every stage (MLX_HOSTFILE).
	ReasonLongPipeline = "pipeline_not_whole"
	// ReasonNoGroup: the stage was given no group and no reason (an
	// in-process pipeline).
	ReasonNoGroup = "no_group"
)

// onLink is Transport "tcp" for reason (code) and detail.
func onLink(code, detail string) Transport {
	return Transport{Transport: TransportTCP, Reason: code, Detail: detail}
}

// TransportReport holds a stage's Transport and keeps its
// exo_stage_transport series (one, = 1) in step with it. A decode stage
// (Ring, Node) and a prefill pipeline stage (runners/prefill/pipeline)
// each keep one.
type TransportReport struct {
	v     statusgauge.Value[Transport]
	gauge *prometheus.GaugeVec // nil: not reported
	model string
	stage string
}

// NewTransportReport starts the report of stage of model at t (m nil: no
// metric).
func NewTransportReport(m *Metrics, model string, stage int, t Transport) *TransportReport {
	r := &TransportReport{model: model, stage: strconv.Itoa(stage)}
	if m != nil {
		r.gauge = m.Transport
	}
	r.Set(t)
	return r
}

// Set records the stage's new Transport.
func (r *TransportReport) Set(t Transport) {
	if r.gauge == nil {
		r.v.Set(t, nil)
		return
	}
	r.v.Set(t, r.gauge, r.model, r.stage, t.Transport, t.Reason)
}

// Get is the stage's Transport now.
func (r *TransportReport) Get() Transport { return r.v.Get() }

// Offered is the Transport of a stage that offers its group and has not
// decided yet.
func Offered() Transport { return Transport{Transport: TransportPending} }

// PeerDeclined is the Transport of a stage whose neighbour peer did not
// offer the group.
func PeerDeclined(peer int) Transport {
	return onLink(ReasonPeer, "neighbouring stage "+strconv.Itoa(peer)+" does not offer the group (its backend is cpu, or it has no MLX ring plan)")
}

// LongPipeline is the Transport of a stage of a pipeline of more than 3
// stages whose group is not Whole.
func LongPipeline(stages int) Transport {
	return onLink(ReasonLongPipeline, strconv.Itoa(stages)+" stages agree on a group through their neighbours' Hellos, which reach every stage only up to 3 stages, and this stage's ring plan is not the supervisor's for every stage (MLX_HOSTFILE)")
}

// TensorStage is the Transport of a stage that is a tensor group.
func TensorStage() Transport {
	return onLink(ReasonTensorStage, "this stage is a tensor group: the process's MLX group (if any) is its ranks' all_sum, and a process joins one")
}

// NoGroup is the Transport of a stage given neither a Group nor a reason.
func NoGroup() Transport {
	return onLink(ReasonNoGroup, "the stage was started without a group for its hidden states")
}
