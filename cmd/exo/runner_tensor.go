package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"syscall"
	"time"

	"github.com/exo-pd/exo-pd/runners/decode"
	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/metrics"
	"github.com/exo-pd/exo-pd/runners/tensor"
)

// checkTensorFlags validates --tensor and --tensor-peers (decode only;
// both or neither).
func checkTensorFlags(f *runnerFlags) error {
	if f.tensor == "" && f.tensorPeers == "" {
		if f.tensorRDMA != "" {
			return exitError{code: 2, msg: "runner: --tensor-rdma needs --tensor and --tensor-peers"}
		}
		return nil
	}
	if f.tensor == "" || f.tensorPeers == "" {
		return exitError{code: 2, msg: "runner: --tensor and --tensor-peers go together"}
	}
	rank, size, err := tensor.ParseRank(f.tensor)
	if err != nil {
		return exitError{code: 2, msg: "runner: " + err.Error()}
	}
	if err := (tensor.RankConfig{Rank: rank, Size: size, Peers: splitList(f.tensorPeers)}).Check(); err != nil {
		return exitError{code: 2, msg: "runner: " + err.Error()}
	}
	if f.tensorRDMA != "" {
		if _, err := tensor.ParseRDMA(f.tensorRDMA, size); err != nil {
			return exitError{code: 2, msg: "runner: " + err.Error()}
		}
		if f.backend != "mlx" && f.backend != "auto" {
			return exitError{code: 2, msg: "runner: --tensor-rdma is MLX's JACCL backend: it needs --backend mlx (or auto), not " + f.backend}
		}
	}
	switch {
	case f.testPrefillRate > 0:
		return exitError{code: 2, msg: "runner: --test-slow-prefill-tokens-per-sec is not supported with --tensor"}
	}
	return nil
}

// tensorRank is a runner's rank in a tensor-parallel group (nil: the
// runner holds the whole model).
type tensorRank struct {
	r   *tensor.Rank
	cfg tensor.RankConfig
}

// listenTensor makes this runner's rank (rank 0 listens for the tensor
// links at once, before its model loads).
func listenTensor(f *runnerFlags, secret []byte, log *slog.Logger) (*tensorRank, error) {
	if f.tensor == "" {
		return nil, nil
	}
	rank, size, err := tensor.ParseRank(f.tensor)
	if err != nil {
		return nil, fmt.Errorf("runner: %w", err)
	}
	cfg := tensor.RankConfig{Rank: rank, Size: size, Peers: splitList(f.tensorPeers), Secret: secret, Model: f.name,
		Metrics: tensor.NewMetrics(nil), Logger: log.With("tensor_rank", rank)}
	if f.tensorRDMA != "" {
		if cfg.RDMA, err = tensor.ParseRDMA(f.tensorRDMA, size); err != nil {
			return nil, fmt.Errorf("runner: %w", err)
		}
	}
	r, err := tensor.Listen(cfg)
	if err != nil {
		return nil, fmt.Errorf("runner: %w", err)
	}
	log.Info("tensor-parallel rank", "rank", rank, "ranks", size, "peers", f.tensorPeers)
	return &tensorRank{r: r, cfg: cfg}, nil
}

func (t *tensorRank) join(f *runnerFlags) func(engine.Backend) (engine.Collective, error) {
	if t == nil {
		return nil
	}
	return func(b engine.Backend) (engine.Collective, error) { return t.r.Collective(t.cfg, b) }
}

func (t *tensorRank) follower() bool { return t != nil && t.r.Follower != nil }

func (t *tensorRank) close() {
	if t != nil {
		t.r.Close()
	}
}

// lead makes rank 0's model adapter, registers the all_sum metrics and
// serves the followers' links; /health fails while the group is not
// whole. The channel carries the group's end (MLX: a lost rank).
func (t *tensorRank) lead(ctx context.Context, m *engine.Model, met *metrics.Runner, gate *loadGate, log *slog.Logger) (decode.Model, <-chan error) {
	t.cfg.Metrics.Register(met.Registry)
	gate.health = t.r.Health
	done := make(chan error, 1)
	go func() {
		err := t.r.Serve(ctx, nil)
		if err != nil && t.r.MLX {
			exitMLXGroup(err, gate, log)
		}
		done <- err
	}()
	return t.r.Leader.Model(m), done
}

// exitMLXGroup ends a rank whose MLX group lost a rank: the group cannot
// be joined again, and a step may be stuck in MLX's ring all_sum for good
// (MLX does not fail a collective whose peer died), so an orderly stop
// (which closes the model on that thread) would never return. Rank 0's
// requests in hand have been failed by the group (their error events
// written); the process leaves once they are gone, within 5 s, and the
// supervisor restarts every rank.
func exitMLXGroup(err error, gate *loadGate, log *slog.Logger) {
	log.Error("tensor group on MLX lost a rank: exiting so that every rank restarts", "err", err)
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if gate == nil || gate.load == nil {
			break
		}
		if _, running := gate.load(); running == 0 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	syscall.Exit(1)
}

// runTensorFollower serves rank 0's calls on this rank's share, and only
// /health and /metrics on --listen.
func runTensorFollower(ctx context.Context, f *runnerFlags, m *engine.Model, t *tensorRank, secret []byte, gate *loadGate, log *slog.Logger) error {
	met := metrics.New("decode")
	t.cfg.Metrics.Register(met.Registry)
	mux := http.NewServeMux()
	mux.Handle("/metrics", met.Handler())
	var h http.Handler = mux
	gate.load = func() (int, int) { return 0, 0 }
	gate.health = t.r.Health
	gate.ready.Store(&h)
	if f.prefill != "" {
		w := newRemote(ctx, f, m, secret, met, log, true, m)
		t.r.Follower.SetFill(w.Remote)
		gate.endpoints = w.Breaker.Status
	}
	log.Info("tensor rank ready", "rank", t.cfg.Rank, "rank0", t.cfg.Peers[0])
	if err := t.r.Serve(ctx, m); err != nil && !errors.Is(err, context.Canceled) {
		if t.r.MLX {
			exitMLXGroup(err, nil, log)
		}
		return fmt.Errorf("runner: %w", err)
	}
	return nil
}

// newRemote wires remote prefill (--prefill). A tensor-parallel rank
// fetches its own KV heads into its own share (rank's model m, whose
// KVHeadRange the request names) and routes by the floor: the cost model
// calibrates on a whole model's local prefill, which a rank cannot run
// alone.
func newRemote(ctx context.Context, f *runnerFlags, dm decode.Model, secret []byte, met *metrics.Runner, log *slog.Logger, tensorRank bool, m *engine.Model) *decode.RemoteWiring {
	cost := f.route == "cost"
	if tensorRank {
		dm = m
		if cost {
			log.Info("tensor-parallel rank: remote prefill routes by --remote-prefill-min-tokens (the cost model needs a whole model)")
		}
		cost = false
	}
	return decode.NewRemote(ctx, decode.RemoteConfig{Name: f.name, Model: dm, Endpoints: splitList(f.prefill), Health: splitList(f.prefillHealth),
		Secret: secret, ConnectTimeout: f.connectTimeout, IdleFloor: f.idleFloor, FP8: f.kvWireDType == "fp8", Streams: f.kvStreams,
		Cost: cost, Chunk: f.chunk, Metrics: met, Logger: log})
}
