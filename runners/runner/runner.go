// Package runner runs one runner process (exo runner decode|prefill) from
// its checked configuration: it owns the process's lifetime after flag
// parsing — the load gate (/health with download and load progress while
// the model loads, 503 for everything else until the role is ready), the
// HTTP server (header bound, read-header timeout, drain on shutdown),
// model resolution and loading, and the wiring of each role from the
// packages that implement it: a decode runner (runners/decode), a pipeline
// stage (runners/stage), a rank of a tensor-parallel group
// (runners/tensor), a prefill runner and a prefill pipeline stage
// (runners/prefill, runners/kvwire).
//
// It must not parse flags, print usage or read the cluster file (cmd/exo
// does, and calls Run once per process), nor hold protocol or model logic
// of its own: that lives in the packages it wires. Like all of runners/ it
// never imports supervisor/ (internal/imports enforces it), and nothing
// outside cmd/ imports cmd/.
package runner

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/engine/backend"
	"github.com/exo-pd/exo-pd/runners/gen"
	"github.com/exo-pd/exo-pd/runners/hf"
	"github.com/exo-pd/exo-pd/runners/openai"
	"github.com/exo-pd/exo-pd/runners/tensor"
)

// Config is one runner process's settings, as exo runner's flags give
// them (Check says which go together; docs/OPERATIONS.md and
// `exo runner --help` say what each means).
type Config struct {
	Role                                                        string // "decode" or "prefill"
	Model, Name, Listen, SecretFile, Backend, Device, ModelsDir string
	LibPath                                                     string
	MaxQueue, MaxBatch, Threads, Chunk                          int
	Offline                                                     bool
	ReadHeaderTimeout                                           time.Duration
	// StopGrace is the time between SIGTERM and SIGKILL (--stop-grace,
	// from the supervisor's --grace; 0: unknown): the drain takes all of it
	// but a margin (openai.DrainGraceFor).
	StopGrace time.Duration
	// decode
	Prefill        string // comma-separated KV-wire addresses (ADDR@A:B: a prefill stage)
	PrefillHealth  string // comma-separated, in Prefill's order
	MinRemote      int
	Route          string // cost | floor ("": cost where it applies, else floor)
	ConnectTimeout time.Duration
	IdleFloor      time.Duration
	KVWireDType    string // native | fp8
	KVStreams      int
	Speculative    string // decode: off | prompt-lookup | draft
	Draft          string // decode: the draft model's source (--speculative draft)
	SpecTokens     int
	Tensor         string // I/N, this runner's tensor-parallel rank
	TensorPeers    string // the ranks' tensor link addresses
	TensorRDMA     string // JACCL's RDMA device matrix (JSON)
	// prefill
	MetricsAddr string
	CacheMiB    int
	// decode: sampling defaults over the model's
	Defaults gen.Defaults
	Instance string
	// decode: a pipeline stage (contract C1); Stages == 0: not a pipeline
	Layers                 hf.LayerRange
	Stage, Stages          int
	StageListen, StageNext string
	// TestPrefillRate (both roles) caps this runner's prefill at so many
	// tokens/s: TEST ONLY, to simulate a slower host on one machine.
	TestPrefillRate float64
}

// CheckTensor is why the tensor settings (Tensor, TensorPeers,
// TensorRDMA, Backend) do not go together (runners/tensor decides).
func (c *Config) CheckTensor() error { return tensorConfig(c, nil, nil).Check() }

// Run serves the runner cfg describes until ctx ends (then drains) or the
// role fails; log is the process's logger.
func Run(ctx context.Context, cfg Config, log *slog.Logger) error {
	c := &cfg
	if err := c.Check(); err != nil {
		return fmt.Errorf("runner: %w", err)
	}
	var secret []byte
	if c.SecretFile != "" {
		b, err := os.ReadFile(c.SecretFile)
		if err != nil {
			return fmt.Errorf("runner: secret: %w", err)
		}
		secret = []byte(strings.TrimSpace(string(b)))
		if len(secret) == 0 {
			return fmt.Errorf("runner: secret file %s is empty", c.SecretFile)
		}
	}
	httpAddr := c.Listen
	if c.Role == "prefill" {
		httpAddr = c.MetricsAddr
	}
	hl, err := net.Listen("tcp", httpAddr)
	if err != nil {
		return listenError(httpAddr, err)
	}
	gate := &loadGate{role: c.Role, name: c.Name, instance: c.Instance, drain: openai.NewDrain()}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	httpDone := make(chan error, 1)
	go func() {
		httpDone <- serveHTTP(ctx, hl, gate, gate.drain, openai.DrainGraceFor(c.StopGrace), c.ReadHeaderTimeout, log)
	}()
	log.Info("runner starting", "http", hl.Addr().String(), "source", c.Model)

	tr, err := tensor.StartRunner(tensorConfig(c, secret, log))
	if err != nil {
		cancel()
		<-httpDone
		return fmt.Errorf("runner: %w", err)
	}
	if tr != nil {
		gate.tensor = func() any { return tr.Sums() }
	}
	m, path, err := loadModel(ctx, c, gate, log, tr.Join())
	if err != nil {
		tr.Close()
		cancel()
		<-httpDone
		return err
	}
	defer m.Close()

	var runErr error
	if tr.Follower() && c.Role == "decode" {
		runErr = runTensorFollower(ctx, c, m, tr, secret, gate, log)
	} else if c.Role == "decode" {
		runErr = runDecode(ctx, c, m, path, secret, gate, log, tr)
	} else {
		runErr = runPrefill(ctx, c, m, secret, gate, log, tr)
	}
	cancel()
	if err := <-httpDone; err != nil && runErr == nil {
		runErr = err
	}
	log.Info("runner stopped")
	return runErr
}

// loadModel resolves the source (downloading if needed) and loads it,
// reporting progress through the gate: the download is the first half.
// join, when set, makes the tensor-parallel collective the model loads
// with (on the opened backend).
func loadModel(ctx context.Context, c *Config, gate *loadGate, log *slog.Logger, join func(engine.Backend) (engine.Collective, error)) (*engine.Model, string, error) {
	t0 := time.Now()
	downloaded := false
	path, err := hf.Resolve(ctx, c.Model, hf.Options{StoreDir: c.ModelsDir, Offline: c.Offline, Logger: log, Layers: c.Layers,
		Progress: func(done, total int64) {
			downloaded = true
			if total > 0 {
				gate.setProgress(0.5 * float64(done) / float64(total))
				gate.setBytes("download", done, total)
			}
		}})
	if err != nil {
		return nil, "", fmt.Errorf("runner: model %s: %w", c.Model, err)
	}
	base := 0.0
	if downloaded {
		base = 0.5
	}
	b, err := backend.Open(c.Backend, backend.Options{LibPath: c.LibPath, Device: c.Device, Threads: c.Threads, Logger: log})
	if err != nil {
		return nil, "", fmt.Errorf("runner: %w", err)
	}
	var coll engine.Collective
	if join != nil {
		if coll, err = join(b); err != nil {
			return nil, "", fmt.Errorf("runner: %w", err)
		}
	}
	lastLog := time.Now()
	m, err := engine.Load(ctx, path, b, engine.LoadOptions{Tensor: coll, Layers: engine.LayerRange(c.Layers), Progress: func(done, total int64) {
		if total <= 0 {
			return
		}
		gate.setProgress(base + (1-base)*float64(done)/float64(total))
		gate.setBytes("load", done, total)
		if time.Since(lastLog) > 2*time.Second {
			lastLog = time.Now()
			log.Info("loading weights", "done_bytes", done, "total_bytes", total)
		}
	}})
	if err != nil {
		return nil, "", fmt.Errorf("runner: %w", err)
	}
	info := m.Info()
	log.Info("model loaded", "path", path, "backend", b.Name(), "arch", info.Arch, "layers", info.Layers,
		"kv_heads", info.KVHeads, "head_dim", info.HeadDim, "cache_dtype", info.CacheDType.String(),
		"fingerprint", fingerprintShort(m.Fingerprint()), "took", time.Since(t0).Round(time.Millisecond))
	return m, path, nil
}

// listenError explains a runner's failed listen; a taken port points at
// the settings that choose it.
func listenError(addr string, err error) error {
	if errors.Is(err, syscall.EADDRINUSE) {
		return fmt.Errorf("runner: %s is taken (another exo supervise or runner running?): the cluster file chooses it "+
			"([cluster] runner_port_base, or the model's decode/prefill port / metrics_port): %w", addr, err)
	}
	return fmt.Errorf("runner: listen %s: %w", addr, err)
}

func fingerprintShort(fp engine.Fingerprint) string { return fmt.Sprintf("%x", fp[:8]) }

// SplitList splits a comma-separated list (a flag's value), dropping empty items.
func SplitList(s string) []string {
	var out []string
	for _, a := range strings.Split(s, ",") {
		if a = strings.TrimSpace(a); a != "" {
			out = append(out, a)
		}
	}
	return out
}
