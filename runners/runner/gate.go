package runner

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"os"
	"sync/atomic"
	"time"

	"github.com/exo-pd/exo-pd/runners/decode"
	"github.com/exo-pd/exo-pd/runners/openai"
)

// loadGate answers /health while the model loads and hands every other
// request to the real handler once it is set.
type loadGate struct {
	role, name string
	instance   string        // echoed by /health (the supervisor's token)
	progress   atomic.Uint64 // float64 bits, 0..1
	// phase ("download" or "load") and its bytes, for /health while loading.
	phase         atomic.Pointer[string]
	doneB, totalB atomic.Int64
	ready         atomic.Pointer[http.Handler]
	load          func() (waiting, running int)
	// health, when set, is a condition of a loaded runner's /health (a
	// tensor-parallel group is whole).
	health func() error
	// transport, when set, is a pipeline stage's stage.Transport (where
	// its hidden states go, and why not over MLX's ring): /health's
	// "stage_transport" once loaded, healthy or degraded.
	transport func() any
	// tensor, when set, is a tensor rank's tensor.Sums (how its all_sums
	// run, and why MLX fell back to its ring): /health's "tensor_group".
	tensor func() any
	// endpoints, when set, reports the prefill endpoints' breaker states.
	endpoints func() []decode.EndpointHealth
	drain     *openai.Drain // the runner's shutdown state: /health fails once it stops
}

func (g *loadGate) setProgress(p float64) { g.progress.Store(math.Float64bits(min(max(p, 0), 1))) }

// setBytes records the bytes done of the current phase.
func (g *loadGate) setBytes(phase string, done, total int64) {
	if cur := g.phase.Load(); cur == nil || *cur != phase {
		g.phase.Store(&phase)
	}
	g.doneB.Store(done)
	g.totalB.Store(total)
}

func (g *loadGate) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := g.ready.Load()
	if r.URL.Path == "/health" {
		w.Header().Set("Content-Type", "application/json")
		if g.drain.Stopping() { // out of rotation at once: what it is sent now it would refuse
			w.WriteHeader(http.StatusServiceUnavailable)
			_ = json.NewEncoder(w).Encode(map[string]any{"status": "stopping", "role": g.role, "model": g.name,
				"instance": g.instance, "pid": os.Getpid()})
			return
		}
		if h == nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			body := map[string]any{"status": "loading", "role": g.role, "model": g.name,
				"progress": math.Float64frombits(g.progress.Load()), "instance": g.instance, "pid": os.Getpid()}
			if ph := g.phase.Load(); ph != nil {
				body["phase"], body["done_bytes"], body["total_bytes"] = *ph, g.doneB.Load(), g.totalB.Load()
			}
			_ = json.NewEncoder(w).Encode(body)
			return
		}
		if g.health != nil {
			if err := g.health(); err != nil {
				w.WriteHeader(http.StatusServiceUnavailable)
				body := map[string]any{"status": "degraded", "role": g.role, "model": g.name,
					"error": err.Error(), "instance": g.instance, "pid": os.Getpid()}
				g.describe(body)
				_ = json.NewEncoder(w).Encode(body)
				return
			}
		}
		waiting, running := g.load()
		body := map[string]any{"status": "ok", "role": g.role, "model": g.name,
			"waiting": waiting, "running": running, "instance": g.instance, "pid": os.Getpid()}
		if g.endpoints != nil {
			body["prefill_endpoints"] = g.endpoints()
		}
		g.describe(body)
		_ = json.NewEncoder(w).Encode(body)
		return
	}
	if h == nil {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Retry-After", "5")
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = io.WriteString(w, `{"error":{"message":"the model is still loading","type":"server_error","param":null,"code":"loading"}}`+"\n")
		return
	}
	(*h).ServeHTTP(w, r)
}

// describe adds a loaded runner's group fields to its /health body: a
// pipeline stage's stage_transport, a tensor rank's tensor_group.
func (g *loadGate) describe(body map[string]any) {
	if g.transport != nil {
		body["stage_transport"] = g.transport()
	}
	if g.tensor != nil {
		body["tensor_group"] = g.tensor()
	}
}

// serveHTTP serves h on l until ctx ends, then drains (d.Stop: new
// requests are refused with 503, those in hand finish or are cut with a
// 503) and shuts down. Requests run under d's context, not ctx, so a
// SIGTERM does not cut them. When it returns, l is closed.
func serveHTTP(ctx context.Context, l net.Listener, h http.Handler, d *openai.Drain, drain, readHeader time.Duration, log *slog.Logger) error {
	srv := &http.Server{Handler: d.Handler(h), ReadHeaderTimeout: readHeader, MaxHeaderBytes: openai.MaxHeaderBytes,
		BaseContext: func(net.Listener) context.Context { return d.Context() }}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(l) }()
	select {
	case err := <-errc:
		return fmt.Errorf("http: %w", err)
	case <-ctx.Done():
	}
	d.Stop(drain)
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		log.Warn("http shutdown", "err", err)
		_ = srv.Close()
	}
	// Serve returns at once now that the server is shut (one that had not
	// started yet refuses to and closes l): once it has, l is closed.
	<-errc
	return nil
}
