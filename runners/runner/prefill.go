package runner

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"syscall"
	"time"

	"github.com/exo-pd/exo-pd/internal/paced"
	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/kvwire"
	"github.com/exo-pd/exo-pd/runners/metrics"
	"github.com/exo-pd/exo-pd/runners/openai"
	"github.com/exo-pd/exo-pd/runners/prefill"
	"github.com/exo-pd/exo-pd/runners/prefill/pipeline"
	"github.com/exo-pd/exo-pd/runners/stage"
	"github.com/exo-pd/exo-pd/runners/tensor"
)

func runPrefill(ctx context.Context, c *Config, m *engine.Model, secret []byte, gate *loadGate, log *slog.Logger, tr *tensor.Runner) error {
	met := metrics.New("prefill")
	cacheBytes := int64(c.CacheMiB) << 20
	if c.CacheMiB <= 0 {
		cacheBytes = -1
	}
	var pm prefill.Model = m
	if c.TestPrefillRate > 0 {
		pm = paced.Model{Model: m, Rate: c.TestPrefillRate}
		log.Warn("TEST ONLY: prefill capped (--test-slow-prefill-tokens-per-sec)", "tokens_per_s", c.TestPrefillRate)
	}
	var stageRange engine.LayerRange
	if c.Stages > 0 {
		stageRange = engine.LayerRange(c.Layers)
	}
	prod := prefill.New(prefill.Options{Name: c.Name, Model: pm, Chunk: c.Chunk, CacheBytes: cacheBytes, Metrics: met, Logger: log, Stage: stageRange})
	defer prod.Close()
	if err := startTensorPrefill(ctx, tr, prod, m, met, gate, log); err != nil {
		return err
	}
	if c.Stages > 0 {
		g, why := prefillGroup(c, m, tr, log)
		pp, err := pipeline.NewPipe(prod, m, pipeline.PipeConfig{Stage: c.Stage, Stages: c.Stages, Listen: c.StageListen, Next: c.StageNext, Secret: secret, Logger: log,
			Group: g, Fallback: why, Metrics: stage.NewMetrics(met.Registry), Name: c.Name})
		if err != nil {
			return fmt.Errorf("runner: %w", err)
		}
		pl, err := net.Listen("tcp", c.StageListen)
		if err != nil {
			return listenError(c.StageListen, err)
		}
		pp.SetListener(pl)
		go func() {
			if err := pp.Run(ctx); err != nil {
				log.Error("prefill stage link", "err", err)
			}
		}()
		gate.transport = func() any { return pp.Transport() }
		gate.health = func() error {
			if !pp.Up() {
				return errors.New("prefill stage link down: a link to the previous or next prefill stage is not up")
			}
			return nil
		}
		log.Info("prefill pipeline stage", "stage", c.Stage, "stages", c.Stages, "layers", c.Layers.String(), "stage_listen", c.StageListen, "stage_next", c.StageNext)
	}
	// On SIGTERM the transfers in hand finish within the stop grace (a
	// stage or tensor rank stops with its links: its transfers end with them).
	var drain time.Duration
	if c.Stages == 0 && tr == nil {
		drain = openai.DrainGraceFor(c.StopGrace)
	}
	ks, err := kvwire.NewServer(kvwire.ServerConfig{Producer: prod, Secret: secret, MaxQueue: c.MaxQueue, Logger: log, DrainGrace: drain})
	if err != nil {
		return fmt.Errorf("runner: %w", err)
	}
	kl, err := net.Listen("tcp", c.Listen)
	if err != nil {
		return listenError(c.Listen, err)
	}
	load := func() (int, int) { l := ks.Load(); return l.Waiting, l.Running }
	mux := http.NewServeMux()
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, r *http.Request) {
		w2, r2 := load()
		met.Waiting.Set(float64(w2))
		met.Running.Set(float64(r2))
		met.Handler().ServeHTTP(w, r)
	})
	var h http.Handler = mux
	gate.load = load
	gate.ready.Store(&h)
	go trimWhenIdle(ctx, load, 5*time.Second, log)
	log.Info("prefill runner ready", "kv_listen", kl.Addr().String(), "metrics", c.MetricsAddr)
	if err := ks.Serve(ctx, kl); err != nil && !errors.Is(err, context.Canceled) && ctx.Err() == nil {
		return fmt.Errorf("runner: kv wire: %w", err)
	}
	return nil
}

// prefillGroup plans a prefill pipeline stage's MLX group for its hidden
// states (nil, logged: they go on the prefill stage link, for the reason
// the Transport gives): MLX's ring on the stage link's port + 1
// (runner_port_base + 10i + 7), as a decode pipeline's stages carry
// theirs. A lost group ends the process and the supervisor restarts
// every stage.
func prefillGroup(c *Config, m *engine.Model, tr *tensor.Runner, log *slog.Logger) (*stage.Group, stage.Transport) {
	if tr != nil {
		t := stage.TensorStage()
		log.Info("prefill pipeline stage: hidden states go on the stage link (TCP)", "reason", t.Reason, "detail", t.Detail)
		return nil, t
	}
	g, t := stage.MLXGroup(m.Backend(), stage.MLXPlan{Stage: c.Stage, Stages: c.Stages, Listen: c.StageListen, Next: c.StageNext})
	if g == nil {
		log.Info("prefill pipeline stage: hidden states go on the stage link (TCP)", "reason", t.Reason, "detail", t.Detail)
		return nil, t
	}
	g.OnLost = func(err error) {
		// The group cannot be joined again and a transfer may be stuck in
		// MLX's ring for good: leave, and the supervisor restarts every
		// stage (the requests in hand fail with the lost links).
		log.Error("prefill pipeline stage: the stages' MLX group is lost: exiting so that every stage restarts", "err", err)
		syscall.Exit(stage.ExitGroupLost)
	}
	log.Info("prefill pipeline stage: offering MLX's ring for the hidden states (joined once every stage offers it)")
	return g, t
}
