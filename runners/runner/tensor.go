package runner

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"

	"github.com/exo-pd/exo-pd/runners/decode"
	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/metrics"
	"github.com/exo-pd/exo-pd/runners/prefill"
	"github.com/exo-pd/exo-pd/runners/stage"
	"github.com/exo-pd/exo-pd/runners/tensor"
)

// tensorConfig is the runner's --tensor flags for runners/tensor.
func tensorConfig(c *Config, secret []byte, log *slog.Logger) tensor.RunnerConfig {
	return tensor.RunnerConfig{Tensor: c.Tensor, Peers: c.TensorPeers, RDMA: c.TensorRDMA, Backend: c.Backend,
		Model: c.Name, Secret: secret, Logger: log}
}

// leadTensor makes rank 0's model adapter and serves the group; /health
// fails while the group is not whole. The channel carries the group's end.
func leadTensor(ctx context.Context, tr *tensor.Runner, m *engine.Model, met *metrics.Runner, gate *loadGate) (*tensor.Model, <-chan error) {
	gate.health = tr.Health
	done := tr.Lead(ctx, met.Registry, func() int {
		if gate.load == nil {
			return 0
		}
		_, running := gate.load()
		return running
	})
	return tr.Model(m), done
}

// runTensorFollower serves rank 0's calls on this rank's share, and only
// /health and /metrics on --listen.
func runTensorFollower(ctx context.Context, c *Config, m *engine.Model, tr *tensor.Runner, secret []byte, gate *loadGate, log *slog.Logger) error {
	met := metrics.New(c.Role)
	mux := http.NewServeMux()
	mux.Handle("/metrics", met.Handler())
	var h http.Handler = mux
	gate.load = func() (int, int) { return 0, 0 }
	gate.health = tr.Health
	gate.ready.Store(&h)
	var fill decode.Remote
	if c.Prefill != "" {
		w := newRemote(ctx, c, c.Prefill, c.PrefillHealth, m, secret, met, log, tr, m)
		fill, gate.endpoints = w.Remote, w.Breaker.Status
	} else if c.Stage > 0 {
		// A later stage's rank with no --prefill of its own fetches its KV
		// heads of the stage's layers from the prefill runner stage 0
		// chose (its rank 0's fill names it). Stage 0's ranks fetch at
		// once, before that choice: each needs --prefill.
		fill = stage.ByEndpoint(func(endpoint string) decode.Remote {
			return newRemote(ctx, c, endpoint, "", m, secret, met, log, tr, m).Remote
		})
	}
	if err := tr.ServeFollower(ctx, m, met.Registry, fill); err != nil {
		return fmt.Errorf("runner: %w", err)
	}
	return nil
}

// newRemote wires remote prefill from endpoints (health: their /health
// addresses, in order; both comma-separated) for every kind of decode
// runner: dm is the model the cost route calibrates on (a whole runner's)
// and whose KV geometry the fetches fill; a pipeline stage passes its
// layers' model, and a tensor rank fetches its own KV heads into its
// share m (tensor.Runner.RemoteConfig). The route is the runner's
// (Config.costRoute: a stage, a rank and prefill stages or ranks route by
// the floor, and Check refuses --remote-prefill-route cost there).
func newRemote(ctx context.Context, c *Config, endpoints, health string, dm decode.Model, secret []byte, met *metrics.Runner, log *slog.Logger, tr *tensor.Runner, m *engine.Model) *decode.RemoteWiring {
	route := RouteFloor
	if c.costRoute() {
		route = RouteCost
	}
	attrs := []any{"endpoints", endpoints, "min_tokens", c.MinRemote, "route", route, "kv_wire_dtype", c.KVWireDType, "kv_streams", c.KVStreams,
		"connect_timeout", c.ConnectTimeout, "idle_floor", c.IdleFloor}
	if c.Stages > 0 {
		attrs = append(attrs, "stage_layers", c.Layers.String()) // a pipeline stage asks for its layers only
	}
	log.Info("remote prefill enabled", attrs...)
	rc := decode.RemoteConfig{Name: c.Name, Model: dm, Endpoints: SplitList(endpoints), Health: SplitList(health),
		Secret: secret, ConnectTimeout: c.ConnectTimeout, IdleFloor: c.IdleFloor, FP8: c.KVWireDType == "fp8", Streams: c.KVStreams,
		Cost: route == RouteCost, Chunk: c.Chunk, Metrics: met, Logger: log}
	return decode.NewRemote(ctx, tr.RemoteConfig(rc, m))
}

// startTensorPrefill makes a prefill runner's Producer a rank of its
// tensor-parallel group (nothing for a whole model); /health fails while
// the group is not whole (rank 0) or this rank is not linked.
func startTensorPrefill(ctx context.Context, tr *tensor.Runner, prod *prefill.Producer, m *engine.Model, met *metrics.Runner, gate *loadGate, log *slog.Logger) error {
	if tr == nil {
		return nil
	}
	done, err := tr.ServePrefill(ctx, prod, m, met.Registry, func() int {
		if gate.load == nil {
			return 0
		}
		_, running := gate.load()
		return running
	})
	if err != nil {
		return fmt.Errorf("runner: %w", err)
	}
	gate.health = tr.Health
	go func() {
		if err := <-done; err != nil {
			log.Error("tensor prefill group ended", "err", err)
		}
	}()
	return nil
}
