package tensor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"syscall"
	"time"

	"github.com/exo-pd/exo-pd/runners/decode"
	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/prefill"
	"github.com/exo-pd/exo-pd/runners/stage"
	"github.com/prometheus/client_golang/prometheus"
)

// RunnerConfig is a runner process's place in a tensor-parallel group as
// its command line says it (contract: `exo runner decode|prefill --tensor
// I/N --tensor-peers ADDR0,… [--tensor-rdma MATRIX]`). cmd/exo only parses
// the flags into it; everything else of a rank's start-up is here.
type RunnerConfig struct {
	// Tensor is --tensor ("I/N"; "" when the runner holds the whole
	// model), Peers --tensor-peers (comma-separated, rank order), RDMA
	// --tensor-rdma (JACCL's device matrix, JSON).
	Tensor, Peers, RDMA string
	// Backend is the runner's --backend (JACCL needs mlx or auto).
	Backend string
	// Model is the served model name (metrics label).
	Model  string
	Secret []byte
	Logger *slog.Logger
}

// Given reports whether any of the tensor flags is set.
func (c RunnerConfig) Given() bool { return c.Tensor != "" || c.Peers != "" || c.RDMA != "" }

// Check validates the flags without side effects: --tensor and
// --tensor-peers go together, name a rank inside the group and one
// address per rank; --tensor-rdma needs them and MLX.
func (c RunnerConfig) Check() error {
	if c.Tensor == "" && c.Peers == "" {
		if c.RDMA != "" {
			return errors.New("--tensor-rdma needs --tensor and --tensor-peers")
		}
		return nil
	}
	if c.Tensor == "" || c.Peers == "" {
		return errors.New("--tensor and --tensor-peers go together")
	}
	rc, err := c.rank()
	if err != nil {
		return err
	}
	if err := rc.Check(); err != nil {
		return err
	}
	if c.RDMA != "" && c.Backend != "mlx" && c.Backend != "auto" {
		return fmt.Errorf("--tensor-rdma is MLX's JACCL backend: it needs --backend mlx (or auto), not %s", c.Backend)
	}
	return nil
}

// rank is c's RankConfig.
func (c RunnerConfig) rank() (RankConfig, error) {
	rank, size, err := ParseRank(c.Tensor)
	if err != nil {
		return RankConfig{}, err
	}
	rc := RankConfig{Rank: rank, Size: size, Peers: splitPeers(c.Peers), Secret: c.Secret, Model: c.Model, Logger: c.Logger}
	if c.RDMA != "" {
		if rc.RDMA, err = ParseRDMA(c.RDMA, size); err != nil {
			return RankConfig{}, err
		}
	}
	return rc, nil
}

func splitPeers(s string) []string {
	var out []string
	for _, a := range strings.Split(s, ",") {
		if a = strings.TrimSpace(a); a != "" {
			out = append(out, a)
		}
	}
	return out
}

// Runner is a runner process's rank: made before the model loads (rank 0
// listens for the tensor links at once), joined by the model's load
// (Join), then led (rank 0: Lead) or served (a follower: ServeFollower).
// A nil *Runner is a runner holding the whole model: its methods are
// no-ops.
type Runner struct {
	r   *Rank
	cfg RankConfig
	log *slog.Logger
}

// StartRunner makes the rank c names (nil, nil when c names none).
func StartRunner(c RunnerConfig) (*Runner, error) {
	if c.Tensor == "" {
		return nil, nil
	}
	if err := c.Check(); err != nil {
		return nil, err
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	rc, err := c.rank()
	if err != nil {
		return nil, err
	}
	rc.Metrics = NewMetrics(nil)
	rc.Logger = c.Logger.With("tensor_rank", rc.Rank)
	r, err := Listen(rc)
	if err != nil {
		return nil, err
	}
	c.Logger.Info("tensor-parallel rank", "rank", rc.Rank, "ranks", rc.Size, "peers", c.Peers)
	return &Runner{r: r, cfg: rc, log: c.Logger}, nil
}

// Join is what the model loads with: the rank's collective on the
// opened backend (nil for a whole model).
func (t *Runner) Join() func(engine.Backend) (engine.Collective, error) {
	if t == nil {
		return nil
	}
	return func(b engine.Backend) (engine.Collective, error) { return t.r.Collective(t.cfg, b) }
}

// Follower reports whether this is a rank > 0.
func (t *Runner) Follower() bool { return t != nil && t.r.Follower != nil }

// RankOf is the rank and the group's size (0, 1 for a whole model).
func (t *Runner) RankOf() (rank, size int) {
	if t == nil {
		return 0, 1
	}
	return t.cfg.Rank, t.cfg.Size
}

// Leader is rank 0's group (nil on a follower or a whole model).
func (t *Runner) Leader() *Leader {
	if t == nil {
		return nil
	}
	return t.r.Leader
}

// Sums is how this rank's all_sums run (its /health "tensor_group"):
// zero before the model loaded, and for a whole model.
func (t *Runner) Sums() Sums {
	if t == nil {
		return Sums{}
	}
	return t.r.Sums()
}

// Health is nil while the group is whole (rank 0) or linked (a
// follower).
func (t *Runner) Health() error {
	if t == nil {
		return nil
	}
	return t.r.Health()
}

// Close releases rank 0's listener when the runner stops before serving.
func (t *Runner) Close() {
	if t != nil {
		t.r.Close()
	}
}

// Lead registers rank 0's all_sum metrics on reg and serves the
// followers' links until ctx ends. The channel carries the group's end:
// on MLX a lost rank ends the process (ExitMLXGroup, once running says
// no request is in hand), as the group cannot be joined again.
func (t *Runner) Lead(ctx context.Context, reg prometheus.Registerer, running func() int) <-chan error {
	t.cfg.Metrics.Register(reg)
	done := make(chan error, 1)
	go func() {
		err := t.r.Serve(ctx, nil)
		if err != nil && t.r.MLX {
			ExitMLXGroup(err, running, t.log)
		}
		done <- err
	}()
	return done
}

// ServeFollower serves rank 0's calls on m (this rank's share) until ctx
// ends, with this rank's all_sum metrics on reg; fill, when set, fetches
// the rank's KV heads when rank 0 asks for a remote fill (a decode rank).
func (t *Runner) ServeFollower(ctx context.Context, m *engine.Model, reg prometheus.Registerer, fill decode.Remote) error {
	t.cfg.Metrics.Register(reg)
	if fill != nil {
		t.r.Follower.SetFill(fill)
	}
	t.log.Info("tensor rank ready", "rank", t.cfg.Rank, "rank0", t.cfg.Peers[0])
	if err := t.r.Serve(ctx, m); err != nil && !errors.Is(err, context.Canceled) {
		if t.r.MLX {
			ExitMLXGroup(err, nil, t.log)
		}
		return err
	}
	return nil
}

// ExitMLXGroup ends a rank whose MLX group lost a rank: the group cannot
// be joined again, and a step may be stuck in MLX's ring all_sum for good
// (MLX does not fail a collective whose peer died), so an orderly stop
// (which closes the model on that thread) would never return. Rank 0's
// requests in hand have been failed by the group (their error events
// written); the process leaves once running (nil: none) says they are
// gone, within 5 s, and the supervisor restarts every rank. It exits with
// stage.ExitGroupLost (3), as a pipeline stage whose group was lost does,
// so that supervisors and operators tell a lost group from a failure.
func ExitMLXGroup(err error, running func() int, log *slog.Logger) {
	log.Error("tensor group on MLX lost a rank: exiting so that every rank restarts", "err", err)
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if running == nil || running() == 0 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	syscall.Exit(stage.ExitGroupLost)
}

// RemoteConfig is decode.RemoteConfig for a rank: a tensor-parallel rank
// fetches its own KV heads into its own share (m, whose KVHeadRange the
// request names) and routes by the floor, since the cost model
// calibrates on a whole model's local prefill, which a rank cannot run
// alone. A whole model's c is returned as it is.
func (t *Runner) RemoteConfig(c decode.RemoteConfig, m *engine.Model) decode.RemoteConfig {
	if t == nil {
		return c
	}
	c.Model = m
	if c.Cost {
		t.log.Info("tensor-parallel rank: remote prefill routes by --remote-prefill-min-tokens (the cost model needs a whole model)")
	}
	c.Cost = false
	return c
}

// Remote is rank 0's remote fill over the group (every rank fetches its
// KV heads, all commit or none); inner is rank 0's own. A whole model's
// inner is returned as it is.
func (t *Runner) Remote(inner decode.Remote) decode.Remote {
	if t == nil || t.r.Leader == nil {
		return inner
	}
	return t.r.Leader.Remote(inner)
}

// ServePrefill makes this rank's share a rank of a tensor-parallel
// prefill group over p (a Producer over m, before it serves): rank 0
// drives every computation (Leader.PrefillLead), a follower computes what
// rank 0 drives and serves its own requests (Follower.PrefillFollow).
// Rank 0 serves the followers' links, a follower rank 0's calls, until ctx
// ends; the all_sum metrics go on reg. The channel carries the group's end
// (nil: ctx ended), as Lead's.
func (t *Runner) ServePrefill(ctx context.Context, p *prefill.Producer, m *engine.Model, reg prometheus.Registerer, running func() int) (<-chan error, error) {
	if t.r.Leader != nil {
		if err := t.r.Leader.PrefillLead(ctx, p, m, t.log); err != nil {
			return nil, err
		}
		return t.Lead(ctx, reg, running), nil
	}
	if err := t.r.Follower.PrefillFollow(p, m); err != nil {
		return nil, err
	}
	done := make(chan error, 1)
	go func() { done <- t.ServeFollower(ctx, m, reg, nil) }()
	return done, nil
}

// Model is rank 0's adapter of its share m that the decode server drives.
func (t *Runner) Model(m *engine.Model) *Model { return t.r.Leader.Model(m) }
