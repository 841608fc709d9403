package stage

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"syscall"
	"time"

	"github.com/exo-pd/exo-pd/runners/decode"
	"github.com/exo-pd/exo-pd/runners/engine"
)

// RunnerConfig is a decode runner's pipeline stage as its flags give it
// (--layers, --stage, --stage-listen, --stage-next): Setup makes stage 0's
// Ring or a later stage's Node from it, with its stage links, its MLX
// group where every stage runs MLX, and its metrics.
type RunnerConfig struct {
	Name          string // served model name
	Stage, Stages int
	Layers        engine.LayerRange
	Listen, Next  string // --stage-listen, --stage-next
	Secret        []byte
	Model         *engine.Model // loaded with Layers (a tensor rank's share of them)
	// Ranks, when set, is the stage's tensor group on its rank 0
	// (runners/tensor's Model over Model): the ring drives it instead of
	// Model, so each step and cache operation runs on every rank; Health
	// then says whether the group is whole (the stage links up only
	// while it is, and go down when it breaks).
	Ranks   Layers
	Health  func() error
	Metrics *Metrics
	Logger  *slog.Logger
	// Picks are the last stage's Pickers' Options (the decode runner's
	// decode.Setup Options).
	Picks *decode.Options
	// Remote and RemoteFor: a later stage's remote prefill (NodeConfig).
	Remote    decode.Remote
	RemoteFor func(endpoint string) decode.Remote
	// Running, when set, is how many requests stage 0 has in hand: when
	// the MLX group is lost they get up to 5 s to be answered with their
	// errors before the process exits.
	Running func() int
	// Exit ends the process with ExitGroupLost when its MLX group is lost
	// (default syscall.Exit: an evaluation may be stuck in MLX for good, so an
	// orderly stop, which closes the model on MLX's thread, would never
	// return; the supervisor restarts every stage).
	Exit func(code int)
}

// Link checks the stage's layers against the model and returns its end of
// the stage links.
func (c *RunnerConfig) Link() (LinkConfig, error) {
	return NewLinkConfig(c.Stage, c.Stages, c.Layers, c.Model, c.Secret)
}

// LinkModel is what a stage's end of the stage links needs of its model:
// the whole model's layer count and hidden size, and its fingerprint.
type LinkModel interface {
	Info() engine.ModelInfo
	Fingerprint() engine.Fingerprint
}

// NewLinkConfig is the end of the stage links of stage (of stages) holding
// layers of m, which the stages' Hellos compare (secret: the links'). It
// refuses layers past the model's end, and a last stage that does not end
// at the model's last layer, naming --stage and --layers: a decode stage
// (RunnerConfig.Link) and a prefill pipeline stage
// (runners/prefill/pipeline) both start from it.
func NewLinkConfig(stage, stages int, layers engine.LayerRange, m LinkModel, secret []byte) (LinkConfig, error) {
	info := m.Info()
	if layers.End > info.Layers || (stage == stages-1 && layers.End != info.Layers) {
		return LinkConfig{}, fmt.Errorf("stage: --stage %d/%d --layers %d:%d of a %d-layer model: the last stage ends at layer %d and no stage past it",
			stage, stages, layers.Start, layers.End, info.Layers, info.Layers)
	}
	return LinkConfig{Stage: stage, Stages: stages, First: layers.Start, End: layers.End, Layers: info.Layers,
		Hidden: info.Hidden, Fingerprint: m.Fingerprint(), Secret: secret}, nil
}

// group plans the stage's MLX group (nil, logged: the stage link carries
// the hidden states, for the reason the Transport gives).
func (c *RunnerConfig) group(log *slog.Logger) (*Group, Transport) {
	if c.Ranks != nil {
		// A process joins one MLX group per backend for its life: a
		// tensor stage's is its ranks' all_sum.
		t := TensorStage()
		log.Info("pipeline stage: hidden states go on the stage link (TCP)", "reason", t.Reason, "detail", t.Detail)
		return nil, t
	}
	g, t := MLXGroup(c.Model.Backend(), MLXPlan{Stage: c.Stage, Stages: c.Stages, Listen: c.Listen, Next: c.Next})
	if g == nil {
		log.Info("pipeline stage: hidden states go on the stage link (TCP)", "reason", t.Reason, "detail", t.Detail)
		return nil, t
	}
	exit := c.Exit
	if exit == nil {
		exit = syscall.Exit
	}
	g.OnLost = func(err error) {
		log.Error("pipeline stage: the stages' MLX group is lost: exiting so that every stage restarts", "err", err)
		if c.Running != nil {
			for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline) && c.Running() > 0; {
				time.Sleep(50 * time.Millisecond)
			}
		}
		exit(ExitGroupLost)
	}
	log.Info("pipeline stage: offering MLX's ring for the hidden states (joined once every stage offers it)")
	return g, t
}

// StartRing makes stage 0's Ring (listening on Listen for the last
// stage's link) and keeps it up until ctx ends.
func StartRing(ctx context.Context, c *RunnerConfig) (*Ring, error) {
	log := c.logger()
	lc, err := c.Link()
	if err != nil {
		return nil, err
	}
	l, err := net.Listen("tcp", c.Listen)
	if err != nil {
		return nil, fmt.Errorf("stage: listen %s (--stage-listen): %w", c.Listen, err)
	}
	g, why := c.group(log)
	ring, err := NewRing(RingConfig{Name: c.Name, Link: lc, Model: c.layers(), Listen: l, Next: c.Next,
		Metrics: c.Metrics, Logger: log, Group: g, Fallback: why, Health: c.Health})
	if err != nil {
		l.Close()
		return nil, err
	}
	go func() {
		if err := ring.Run(ctx); err != nil && ctx.Err() == nil {
			log.Error("pipeline stage 0 ended", "err", err)
		}
	}()
	log.Info("pipeline stage 0", "stages", c.Stages, "layers", fmt.Sprintf("%d:%d", c.Layers.Start, c.Layers.End), "stage_listen", c.Listen, "stage_next", c.Next)
	return ring, nil
}

// NewStage makes a later stage's Node (listening on Listen for the
// previous stage's link); its Run serves it.
func NewStage(c *RunnerConfig) (*Node, error) {
	log := c.logger()
	lc, err := c.Link()
	if err != nil {
		return nil, err
	}
	var picks *decode.Options
	if c.Stage == c.Stages-1 {
		picks = c.Picks
	}
	l, err := net.Listen("tcp", c.Listen)
	if err != nil {
		return nil, fmt.Errorf("stage: listen %s (--stage-listen): %w", c.Listen, err)
	}
	g, why := c.group(log)
	n, err := NewNode(NodeConfig{Name: c.Name, Link: lc, Model: c.layers(), Listen: l, Next: c.Next, Picks: picks,
		Remote: c.Remote, RemoteFor: c.RemoteFor, Metrics: c.Metrics, Logger: log, Group: g, Fallback: why, Health: c.Health})
	if err != nil {
		l.Close()
		return nil, err
	}
	return n, nil
}

// layers is what the stage's Ring or Node drives.
func (c *RunnerConfig) layers() Layers {
	if c.Ranks != nil {
		return c.Ranks
	}
	return c.Model
}

func (c *RunnerConfig) logger() *slog.Logger {
	if c.Logger == nil {
		return slog.Default()
	}
	return c.Logger
}

// Health is a stage runner's /health condition: its stage links up (stage
// 0: the whole ring) and, for a stage of tensor ranks, its group whole
// (own; nil: none).
func Health(up func() bool, own func() error) func() error {
	return func() error {
		if own != nil {
			if err := own(); err != nil {
				return fmt.Errorf("this stage's tensor group is not whole: %w", err)
			}
		}
		if !up() {
			return errors.New("stage link down: the pipeline's ring is not whole")
		}
		return nil
	}
}
