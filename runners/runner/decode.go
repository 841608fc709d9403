package runner

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"syscall"
	"time"

	"github.com/exo-pd/exo-pd/internal/paced"
	"github.com/exo-pd/exo-pd/runners/decode"
	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/hf"
	"github.com/exo-pd/exo-pd/runners/httpapi"
	"github.com/exo-pd/exo-pd/runners/metrics"
	"github.com/exo-pd/exo-pd/runners/openai"
	"github.com/exo-pd/exo-pd/runners/stage"
	"github.com/exo-pd/exo-pd/runners/tensor"
)

func runDecode(ctx context.Context, c *Config, m *engine.Model, path string, secret []byte, gate *loadGate, log *slog.Logger, tr *tensor.Runner) error {
	st, err := decode.NewSetup(c.Name, m, path, c.Defaults)
	if err != nil {
		return fmt.Errorf("runner: %w", err)
	}
	if st.NoTemplate != nil {
		log.Warn("no usable chat template: /v1/chat/completions will refuse requests", "err", st.NoTemplate)
	}
	if st.BadDefaults != nil {
		log.Warn("the model's sampling defaults are invalid and not used", "err", st.BadDefaults)
	}
	log.Info("sampling defaults (under request fields)", "defaults", decode.DescribeDefaults(st.Options.Defaults))
	met := metrics.New("decode")
	go func() {
		if err := st.Grammars.Warm(); err != nil {
			log.Warn("constrained decoding unavailable: the vocabulary trie failed", "err", err)
		}
	}()
	var dm decode.Model = m
	var tensorDone <-chan error // rank 0: the group's end (nil: not tensor-parallel)
	var rc *stage.RunnerConfig
	if c.Stages > 0 {
		rc = stageRunner(c, m, secret, met, log)
	}
	if tr != nil {
		var tm *tensor.Model
		tm, tensorDone = leadTensor(ctx, tr, m, met, gate)
		dm = tm
		if rc != nil { // a stage of tensor ranks: the ring drives the group
			rc.Ranks, rc.Health = tm, tr.Health
		}
	}
	if c.Stages > 0 && c.Stage > 0 {
		return runStage(ctx, c, m, st, rc, tr, tensorDone, gate, met, log)
	}
	if c.Stages > 0 {
		rc.Running = func() int {
			if gate.ready.Load() == nil { // gate.load is set before ready
				return 0
			}
			_, running := gate.load()
			return running
		}
		ring, err := stage.StartRing(ctx, rc)
		if err != nil {
			return stageListenError(c, err)
		}
		dm, gate.health = ring, stage.Health(ring.Healthy, rc.Health)
		gate.transport = func() any { return ring.Transport() }
	}
	if c.TestPrefillRate > 0 {
		dm = paced.Model{Model: m, Rate: c.TestPrefillRate}
		log.Warn("TEST ONLY: local prefill capped (--test-slow-prefill-tokens-per-sec)", "tokens_per_s", c.TestPrefillRate)
	}
	o := st.Options
	o.Model, o.RemoteMinTokens, o.MaxQueue, o.MaxBatch, o.PrefillChunk, o.Metrics, o.Logger = dm, c.MinRemote, c.MaxQueue, c.MaxBatch, c.Chunk, met, log
	o.Speculative, o.SpecTokens = c.Speculative, c.SpecTokens
	if c.Draft != "" {
		dpath, err := hf.Resolve(ctx, c.Draft, hf.Options{StoreDir: c.ModelsDir, Offline: c.Offline, Logger: log})
		if err != nil {
			return fmt.Errorf("runner: draft model %s: %w", c.Draft, err)
		}
		draft, err := decode.LoadDraft(ctx, dpath, m, o.Text)
		if err != nil {
			return fmt.Errorf("runner: --draft %s: %w", c.Draft, err)
		}
		defer draft.Close()
		o.Draft = draft
		log.Info("draft model loaded", "source", c.Draft, "path", dpath, "arch", draft.Info().Arch, "layers", draft.Info().Layers)
	}
	if ring, ok := dm.(*stage.Ring); ok && c.Prefill != "" {
		w := newRemote(ctx, c, c.Prefill, c.PrefillHealth, m, secret, met, log, tr, m)
		// A stage of tensor ranks: each rank fetches its KV heads of the
		// stage's layers (one request names both ranges).
		o.Remote, gate.endpoints = &stage.Remote{Ring: ring, Local: tr.Remote(w.Remote)}, w.Breaker.Status
	} else if c.Prefill != "" {
		w := newRemote(ctx, c, c.Prefill, c.PrefillHealth, dm, secret, met, log, tr, m)
		o.Remote, o.Router, gate.endpoints = w.Remote, w.Router, w.Breaker.Status
		o.Remote = tr.Remote(o.Remote) // a tensor group: every rank fetches its KV heads
	}
	o.Stopping = gate.drain.Begun() // queued requests are answered 503 as soon as it stops
	srv := decode.New(o)
	defer srv.Close()
	mux := http.NewServeMux()
	met.Expose(o.Name) // its series exist before the first request
	httpapi.Mount(mux, httpapi.Options{Gen: srv, Name: o.Name, Defaults: o.Defaults, AcceptTools: o.AcceptTools, Metrics: met, Logger: log})
	srv.Register(mux)
	var h http.Handler = mux
	gate.load = srv.Load
	gate.ready.Store(&h)
	go trimWhenIdle(ctx, srv.Load, 5*time.Second, log)
	log.Info("decode runner ready", "listen", c.Listen)
	var err2 error
	select {
	case <-ctx.Done():
	case err2 = <-tensorDone:
	}
	gate.drain.Stop(openai.DrainGraceFor(c.StopGrace)) // the requests in hand end before the server closes under them
	return err2
}

// stageRunner is what the flags say about this runner's pipeline stage
// (runners/stage assembles it).
func stageRunner(c *Config, m *engine.Model, secret []byte, met *metrics.Runner, log *slog.Logger) *stage.RunnerConfig {
	return &stage.RunnerConfig{Name: c.Name, Stage: c.Stage, Stages: c.Stages, Layers: engine.LayerRange(c.Layers),
		Listen: c.StageListen, Next: c.StageNext, Secret: secret, Model: m, Metrics: stage.NewMetrics(met.Registry), Logger: log}
}

// stageListenError points a taken --stage-listen at the cluster file.
func stageListenError(c *Config, err error) error {
	if errors.Is(err, syscall.EADDRINUSE) {
		return listenError(c.StageListen, err)
	}
	return fmt.Errorf("runner: %w", err)
}

// runStage serves a pipeline stage after the first: its layers on the
// stage link, and /health and /metrics on --listen.
// rc is the stage's (with its tensor group on a tensor stage's rank 0:
// tr, whose end tensorDone carries).
func runStage(ctx context.Context, c *Config, m *engine.Model, st *decode.Setup, rc *stage.RunnerConfig, tr *tensor.Runner, tensorDone <-chan error, gate *loadGate, met *metrics.Runner, log *slog.Logger) error {
	secret := rc.Secret
	if c.Speculative != "" && c.Speculative != decode.SpecOff {
		// The supervisor gives every stage the model's flags; stage 0's
		// decode runner logs why a pipeline does not speculate.
		log.Info("pipeline stage: --speculative is stage 0's concern; this stage ignores it", "speculative", c.Speculative)
	}
	rc.Picks = &st.Options // the last stage samples: the decode runner's tokenizer, sampler and grammars
	if c.Prefill != "" {
		rc.Remote = tr.Remote(newRemote(ctx, c, c.Prefill, c.PrefillHealth, m, secret, met, log, tr, m).Remote)
	} else {
		// Without --prefill of its own, the stage fetches its layers from
		// the prefill runner stage 0's remote fill names.
		rc.RemoteFor = func(endpoint string) decode.Remote {
			return tr.Remote(newRemote(ctx, c, endpoint, "", m, secret, met, log, tr, m).Remote)
		}
	}
	node, err := stage.NewStage(rc)
	if err != nil {
		return stageListenError(c, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", met.Handler())
	var h http.Handler = mux
	gate.load = func() (int, int) { return 0, 0 }
	gate.health = stage.Health(node.Healthy, rc.Health)
	gate.transport = func() any { return node.Transport() }
	gate.ready.Store(&h)
	log.Info("pipeline stage ready", "stage", c.Stage, "stages", c.Stages, "layers", c.Layers.String(), "stage_listen", c.StageListen, "stage_next", c.StageNext)
	if tensorDone == nil {
		return node.Run(ctx)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ran := make(chan error, 1)
	go func() { ran <- node.Run(ctx) }()
	select {
	case err := <-ran:
		return err
	case err := <-tensorDone: // the stage's tensor group ended (a lost MLX group exits before this)
		cancel()
		<-ran
		return err
	}
}
