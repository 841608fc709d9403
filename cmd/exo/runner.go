package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/exo-pd/exo-pd/internal/paced"
	"github.com/exo-pd/exo-pd/runners/decode"
	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/engine/backend"
	"github.com/exo-pd/exo-pd/runners/gen"
	"github.com/exo-pd/exo-pd/runners/hf"
	"github.com/exo-pd/exo-pd/runners/httpapi"
	"github.com/exo-pd/exo-pd/runners/kvwire"
	"github.com/exo-pd/exo-pd/runners/metrics"
	"github.com/exo-pd/exo-pd/runners/openai"
	"github.com/exo-pd/exo-pd/runners/prefill"
	"github.com/exo-pd/exo-pd/runners/prefill/pipeline"
	"github.com/exo-pd/exo-pd/runners/stage"
	"github.com/exo-pd/exo-pd/runners/tensor"
)

const runnerUsage = `usage:
  exo runner decode  --model SRC --served-name NAME --listen HOST:PORT
                     [--prefill HOST:PORT[@A:B][,HOST:PORT[@A:B]…]] [--prefill-health HOST:PORT[,HOST:PORT…]]
                     [--remote-prefill-min-tokens N] [--remote-prefill-route cost|floor]
                     [--prefill-connect-timeout D] [--prefill-idle-floor D] [--kv-wire-dtype native|fp8]
                     [--kv-streams N] [--speculative off|prompt-lookup|draft] [--draft SRC]
                     [--speculative-tokens K] [--tensor I/N --tensor-peers ADDR0,ADDR1,…]
                     [--secret-file F] [--backend cpu|mlx|auto] [--device gpu|cpu]
                     [--max-queue N] [--max-batch N] [--models-dir D] [--read-header-timeout D]
                     [--default-temperature X] [--default-top-p X] [--default-top-k N]
                     [--default-min-p X] [--default-repetition-penalty X]
                     [--layers A:B --stage I/N --stage-listen HOST:PORT --stage-next HOST:PORT]
  exo runner prefill --model SRC --served-name NAME --listen HOST:PORT --metrics HOST:PORT
                     [--secret-file F] [--backend cpu|mlx|auto] [--device gpu|cpu]
                     [--max-queue N] [--models-dir D] [--tensor I/N --tensor-peers ADDR0,ADDR1,…]
                     [--layers A:B --stage I/N --stage-listen HOST:PORT --stage-next HOST:PORT]

The decode runner serves the OpenAI API (POST /v1/chat/completions,
/v1/completions, /tokenize; GET /v1/models, /health, /metrics) on --listen.
The prefill runner serves the KV wire on --listen and /health, /metrics on
--metrics. SRC is a model directory, a .gguf file, builtin:smollm2 or a
Hugging Face id.

Sampling defaults of the decode runner: the model's own (generation_config.json,
GGUF general.sampling.*), overridden by --default-* (the cluster file's
[models.defaults]), overridden by each request's fields.

--tensor I/N --tensor-peers ADDR0,…,ADDRN-1 (decode) makes this runner rank I of
a tensor-parallel group of N runners, one per rank, each holding 1/N of every
layer: rank 0 serves the API on --listen and listens for the other ranks' tensor
links on ADDR0; ranks I > 0 serve only /health and /metrics on --listen and dial
ADDR0 (docs/PROTOCOL.md "Tensor link"). On --backend mlx the ranks sum over MLX's
ring, rank i on ADDRi's port + 1 (unless MLX_HOSTFILE and MLX_RANK are set).
--tensor-rdma MATRIX (with --tensor, --backend mlx; the supervisor emits it for a
tensor group of metal hosts with [hosts.X] rdma) joins MLX's JACCL backend (RDMA
over Thunderbolt 5) instead: MATRIX is the JSON N×N matrix of RDMA device names
(row i: rank i's device toward each rank, null on the diagonal; a full mesh),
written to MLX_IBV_DEVICES; rank 0's port + 1 is MLX_JACCL_COORDINATOR. Where
this libmlx has no JACCL the ranks use the ring and log why.

A tensor-parallel prefill model (--tensor on exo runner prefill) runs the same
way, one prefill runner per rank: rank 0 drives every computation over the
tensor link and every rank's KV port (--listen) serves the KV heads it
computed (rank I of N: heads [I·H/N, (I+1)·H/N) of H). A decode runner names
the ranks as --prefill ADDR#H0:H1 entries and asks each rank holding some of
its cache's heads for those (a tensor decode rank for its own heads only).
On --backend mlx with a CUDA GPU the ranks sum over NCCL (unverified: no GPU
here), elsewhere over MLX's ring as decode ranks do.

A pipelined decode model runs one decode runner per stage: --layers A:B is
the stage's layers [A, B) of the model, --stage I/N its index of N (N ≥ 2);
the stages form a ring over the stage link (docs/PROTOCOL.md "Stage link"):
each listens on --stage-listen for the previous stage (stage 0 for the last,
which sends back the tokens it samples) and dials --stage-next. Stage 0 serves
the API on --listen; later stages serve only /health and /metrics there.
Stage 0's /health is 200 only while the whole ring is up. Where every stage
runs --backend mlx the hidden states go over MLX's ring: MLX_HOSTFILE with
MLX_RANK = I (the supervisor writes both; any number of stages), else for 2
stages a hostfile of --stage-listen/--stage-next port + 1.
A stage may be a tensor group: give each of its ranks --layers, --stage and
--tensor J/M --tensor-peers (the stage's own ranks); rank 0 alone takes
--stage-listen and --stage-next and forwards each step to its ranks.

A pipelined prefill model (contract C4) runs one prefill runner per stage with
the same four flags: its KV port (--listen) serves KV-wire requests for layer
ranges within its own --layers; stage 0 computes prompts from their tokens and
passes each chunk's hidden states to the next stage, which computes its layers
from them (docs/PROTOCOL.md "Prefill stage link"). A decode side asks every
prefill stage holding some of its layers for those layers. Each stage's /health
is 200 only while both its stage links are up. A decode runner's --prefill
entry ADDR@A:B names such a stage and its layers: the runner (or decode stage)
sends one range request to every prefill stage holding some of its layers, at
once, and commits their KV together (replicas of a stage: several entries with
the same A:B). On a decode pipeline give every decode stage that list.

--instance TOKEN (both roles; the supervisor passes a fresh one per start)
is echoed by /health as "instance", so a prober can tell this process from
another one answering on the same port.`

// runnerFlags are the flags both roles share.
type runnerFlags struct {
	role, model, name, listen, secretFile, backend, device, modelsDir string
	libPath                                                           string
	maxQueue, maxBatch, threads, chunk                                int
	offline                                                           bool
	readHeaderTimeout                                                 time.Duration
	// decode
	prefill        string
	prefillHealth  string
	minRemote      int
	route          string
	connectTimeout time.Duration
	idleFloor      time.Duration
	kvWireDType    string
	kvStreams      int
	speculative    string // decode: off | prompt-lookup | draft
	draft          string // decode: the draft model's source (--speculative draft)
	specTokens     int
	tensor         string // I/N, this runner's tensor-parallel rank
	tensorPeers    string // the ranks' tensor link addresses
	tensorRDMA     string // JACCL's RDMA device matrix (JSON)
	// prefill
	metricsAddr string
	cacheMiB    int
	// decode: sampling defaults over the model's
	defaults gen.Defaults
	instance string
	// decode: a pipeline stage (contract C1); stages == 0: not a pipeline
	layers                 hf.LayerRange
	stage, stages          int
	stageListen, stageNext string
	// testPrefillRate (both roles) caps this runner's prefill at so many
	// tokens/s: TEST ONLY, to simulate a slower host on one machine.
	testPrefillRate float64
}

// optFloat is a float flag that records whether it was given.
type optFloat struct{ p **float64 }

func (o optFloat) String() string {
	if o.p == nil || *o.p == nil {
		return ""
	}
	return strconv.FormatFloat(**o.p, 'g', -1, 64)
}

func (o optFloat) Set(s string) error {
	v, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return err
	}
	*o.p = &v
	return nil
}

// optInt is an int flag that records whether it was given.
type optInt struct{ p **int }

func (o optInt) String() string {
	if o.p == nil || *o.p == nil {
		return ""
	}
	return strconv.Itoa(**o.p)
}

func (o optInt) Set(s string) error {
	v, err := strconv.Atoi(s)
	if err != nil {
		return err
	}
	*o.p = &v
	return nil
}

func parseRunnerFlags(args []string) (*runnerFlags, error) {
	if len(args) > 0 && isHelp(args[0]) {
		fmt.Println(runnerUsage)
		return nil, helpShown
	}
	if len(args) == 0 || (args[0] != "decode" && args[0] != "prefill") {
		fmt.Fprintln(os.Stderr, runnerUsage)
		return nil, exitError{code: 2, msg: "runner: first argument must be decode or prefill"}
	}
	f := &runnerFlags{role: args[0]}
	fs := flag.NewFlagSet("exo runner "+f.role, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&f.model, "model", "", "model source")
	fs.StringVar(&f.name, "served-name", "", "model name clients send")
	fs.StringVar(&f.listen, "listen", "", "address to serve on")
	fs.StringVar(&f.secretFile, "secret-file", "", "file holding the KV-wire secret")
	fs.StringVar(&f.backend, "backend", "auto", "engine backend: cpu, mlx or auto")
	fs.StringVar(&f.device, "device", "", "mlx device: gpu or cpu")
	fs.StringVar(&f.libPath, "mlx-lib", "", "path of libmlxc (default: search)")
	fs.StringVar(&f.modelsDir, "models-dir", "", "model store directory")
	fs.BoolVar(&f.offline, "offline", false, "do not download models")
	fs.IntVar(&f.maxQueue, "max-queue", 0, "requests that may wait (decode default 64, prefill default 8)")
	fs.IntVar(&f.maxBatch, "max-batch", 0, "decode: generations run at once, their steps batched (default 4; 1: one at a time)")
	fs.IntVar(&f.threads, "threads", 0, "cpu backend threads (0: all cores)")
	fs.IntVar(&f.chunk, "prefill-chunk", 256, "prefill chunk in tokens")
	fs.DurationVar(&f.readHeaderTimeout, "read-header-timeout", 10*time.Second, "HTTP connections that have not sent their headers within this are closed")
	fs.StringVar(&f.instance, "instance", "", "identity token /health reports (the supervisor's per-start token)")
	// Not in the usage text: tests only (routing and scheduling tests make
	// one machine look like several of different speeds).
	fs.Float64Var(&f.testPrefillRate, "test-slow-prefill-tokens-per-sec", 0, "TEST ONLY: cap this runner's prefill at N tokens/s (0: off)")
	if f.role == "decode" {
		fs.Var(optFloat{&f.defaults.Temperature}, "default-temperature", "default temperature (over the model's)")
		fs.Var(optFloat{&f.defaults.TopP}, "default-top-p", "default top_p (over the model's)")
		fs.Var(optInt{&f.defaults.TopK}, "default-top-k", "default top_k (over the model's)")
		fs.Var(optFloat{&f.defaults.MinP}, "default-min-p", "default min_p (over the model's)")
		fs.Var(optFloat{&f.defaults.RepetitionPenalty}, "default-repetition-penalty", "default repetition_penalty (over the model's)")
		fs.StringVar(&f.prefill, "prefill", "", "prefill runners' KV-wire addresses, comma-separated; ADDR@A:B names a prefill pipeline stage holding layers [A, B) (every entry then names its layers)")
		fs.StringVar(&f.prefillHealth, "prefill-health", "", "the prefill runners' HTTP (--metrics) addresses, comma-separated, in --prefill's order: their /health load ranks busy hosts later")
		fs.IntVar(&f.minRemote, "remote-prefill-min-tokens", 256, "uncached prompt tokens needed to prefill remotely")
		fs.StringVar(&f.route, "remote-prefill-route", "cost", "how a long prompt picks local or remote prefill: cost (predicted time from measured rates, queues and links; the min tokens a floor) or floor (the min tokens alone)")
		fs.DurationVar(&f.connectTimeout, "prefill-connect-timeout", time.Second, "connect + hello deadline of a prefill endpoint; past it the endpoint is skipped until it answers a probe")
		fs.StringVar(&f.kvWireDType, "kv-wire-dtype", "native", "KV dtype asked of prefill runners: native (this cache's dtype) or fp8 (E4M3, per-head scales; half of bf16's bytes)")
		fs.IntVar(&f.kvStreams, "kv-streams", 1, "TCP connections each KV transfer from a prefill runner is striped over (1 to 16; the prefill runner must speak kvwire version 4)")
		fs.StringVar(&f.speculative, "speculative", decode.SpecOff, "speculative decoding: off, prompt-lookup (drafts from n-grams of the prompt and output) or draft (drafts by --draft's model); drafts are verified in one forward")
		fs.StringVar(&f.draft, "draft", "", "the draft model (a model directory, .gguf file or Hugging Face id of the same tokenizer) of --speculative draft, loaded on this runner's backend")
		fs.IntVar(&f.specTokens, "speculative-tokens", 0, fmt.Sprintf("the most tokens drafted per step (1 to 64; 0: %d)", decode.DefaultSpecTokens))
		fs.DurationVar(&f.idleFloor, "prefill-idle-floor", 3*time.Second, "shortest wait for the next KV frame (the deadline grows with the endpoint's measured chunk time)")
	} else {
		fs.StringVar(&f.metricsAddr, "metrics", "", "HTTP address for /health and /metrics")
		fs.IntVar(&f.cacheMiB, "prefix-cache-mib", 1024, "prefix cache size in MiB (0: off)")
	}
	fs.Func("layers", "pipeline stage: this stage's layers A:B ([A, B) of the model)", func(v string) (err error) {
		f.layers, err = hf.ParseLayers(v)
		return err
	})
	fs.Func("stage", "pipeline stage: I/N, this stage's index of N stages (N ≥ 2)", func(v string) error {
		is, ns, ok := strings.Cut(v, "/")
		i, err1 := strconv.Atoi(is)
		n, err2 := strconv.Atoi(ns)
		if !ok || err1 != nil || err2 != nil || n < 2 || i < 0 || i >= n {
			return fmt.Errorf("want I/N with N ≥ 2 and 0 ≤ I < N, not %q", v)
		}
		f.stage, f.stages = i, n
		return nil
	})
	fs.StringVar(&f.tensor, "tensor", "", "tensor-parallel rank I/N of this runner (with --tensor-peers)")
	fs.StringVar(&f.tensorPeers, "tensor-peers", "", "the tensor-parallel ranks' link addresses, comma-separated, in rank order (rank 0 listens on the first)")
	fs.StringVar(&f.tensorRDMA, "tensor-rdma", "", "with --tensor on --backend mlx: MLX JACCL's RDMA device matrix, JSON N×N (row i: rank i's device toward each rank, null on the diagonal); falls back to the ring where JACCL is unavailable")
	fs.StringVar(&f.stageListen, "stage-listen", "", "pipeline stage: the address the previous stage's link (stage 0: the last stage's) connects to")
	fs.StringVar(&f.stageNext, "stage-next", "", "pipeline stage: the next stage's --stage-listen (the last stage: stage 0's)")
	if err := parseFlags(fs, runnerUsage, args[1:]); err != nil {
		return nil, err
	}
	switch {
	case fs.NArg() != 0:
		return nil, exitError{code: 2, msg: fmt.Sprintf("runner: unexpected arguments %q", fs.Args())}
	case f.model == "":
		return nil, exitError{code: 2, msg: "runner: --model is required"}
	case f.name == "":
		return nil, exitError{code: 2, msg: "runner: --served-name is required"}
	case f.listen == "":
		return nil, exitError{code: 2, msg: "runner: --listen is required"}
	case f.role == "prefill" && f.metricsAddr == "":
		return nil, exitError{code: 2, msg: "runner: prefill needs --metrics HOST:PORT"}
	case f.readHeaderTimeout <= 0:
		return nil, exitError{code: 2, msg: "runner: --read-header-timeout must be positive"}
	case f.testPrefillRate < 0 || math.IsNaN(f.testPrefillRate) || math.IsInf(f.testPrefillRate, 0):
		return nil, exitError{code: 2, msg: "runner: --test-slow-prefill-tokens-per-sec must be a finite number ≥ 0"}
	case f.role == "decode" && f.route != "cost" && f.route != "floor":
		return nil, exitError{code: 2, msg: fmt.Sprintf("runner: --remote-prefill-route %q: want cost or floor", f.route)}
	case f.role == "decode" && decode.CheckSpeculative(f.speculative, f.specTokens) != nil:
		return nil, exitError{code: 2, msg: fmt.Sprintf("runner: --speculative %q --speculative-tokens %d: %v", f.speculative, f.specTokens, decode.CheckSpeculative(f.speculative, f.specTokens))}
	case f.role == "decode" && (f.speculative == decode.SpecDraft) != (f.draft != ""):
		return nil, exitError{code: 2, msg: fmt.Sprintf("runner: --speculative %q with --draft %q: --draft is the draft model of --speculative draft, and that mode needs it", f.speculative, f.draft)}
	case f.role == "decode" && f.connectTimeout <= 0:
		return nil, exitError{code: 2, msg: "runner: --prefill-connect-timeout must be positive"}
	case f.role == "decode" && f.kvWireDType != "native" && f.kvWireDType != "fp8":
		return nil, exitError{code: 2, msg: fmt.Sprintf("runner: --kv-wire-dtype %q: want native or fp8", f.kvWireDType)}
	case f.role == "decode" && f.prefillHealth != "" && len(splitList(f.prefillHealth)) != len(splitList(f.prefill)):
		return nil, exitError{code: 2, msg: fmt.Sprintf("runner: --prefill-health lists %d addresses, --prefill %d: want one per prefill endpoint, in the same order",
			len(splitList(f.prefillHealth)), len(splitList(f.prefill)))}
	case f.role == "decode" && f.prefill != "" && prefillListErr(f.prefill) != nil:
		return nil, exitError{code: 2, msg: fmt.Sprintf("runner: --prefill: %v", prefillListErr(f.prefill))}
	case f.role == "decode" && (f.kvStreams < 1 || f.kvStreams > kvwire.MaxStreams):
		return nil, exitError{code: 2, msg: fmt.Sprintf("runner: --kv-streams %d: want 1 to %d", f.kvStreams, kvwire.MaxStreams)}
	case f.role == "decode" && f.idleFloor <= 0:
		return nil, exitError{code: 2, msg: "runner: --prefill-idle-floor must be positive"}
	}
	if err := checkTensorFlags(f); err != nil {
		return nil, err
	}
	if err := f.checkStage(); err != nil {
		return nil, exitError{code: 2, msg: "runner: " + err.Error()}
	}
	if err := f.defaults.Check(); err != nil {
		return nil, exitError{code: 2, msg: "runner: --default-*: " + err.Error()}
	}
	return f, nil
}

// prefillListErr is why a --prefill list is not ADDR,… or ADDR@A:B,….
func prefillListErr(list string) error {
	_, _, err := decode.ParsePrefillEndpoints(splitList(list))
	return err
}

// checkStage refuses a pipeline stage's flags that do not go together.
func (f *runnerFlags) checkStage() error {
	given := map[string]bool{"--layers": !f.layers.IsZero(), "--stage": f.stages > 0, "--stage-listen": f.stageListen != "", "--stage-next": f.stageNext != ""}
	if f.stages == 0 {
		for _, name := range []string{"--layers", "--stage-listen", "--stage-next"} {
			if given[name] {
				return fmt.Errorf("%s is a pipeline stage's: it needs --stage I/N (and --layers, --stage-listen, --stage-next)", name)
			}
		}
		return nil
	}
	follower := false // rank > 0 of a stage's tensor group: it talks only to its rank 0
	if f.tensor != "" {
		if f.role == "prefill" {
			return fmt.Errorf("--tensor with --stage on a prefill runner: a prefill stage is not tensor-parallel")
		}
		rank, _, err := tensor.ParseRank(f.tensor)
		if err != nil {
			return err
		}
		follower = rank > 0
	}
	for _, name := range []string{"--layers", "--stage-listen", "--stage-next"} {
		switch {
		case follower && name != "--layers" && given[name]:
			return fmt.Errorf("%s with --tensor %s: a stage's rank > 0 talks only to its rank 0 over the tensor link; only rank 0 (--tensor 0/N) is on the stage ring", name, f.tensor)
		case !given[name] && (!follower || name == "--layers"):
			return fmt.Errorf("--stage %d/%d needs %s", f.stage, f.stages, name)
		}
	}
	switch {
	case f.stage == 0 && f.layers.Start != 0:
		return fmt.Errorf("--stage 0/%d holds the embedding: its --layers start at 0, not %d", f.stages, f.layers.Start)
	case f.testPrefillRate > 0:
		return fmt.Errorf("--test-slow-prefill-tokens-per-sec with --stage: a pipeline stage is not paced")
	}
	return nil
}

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
				_ = json.NewEncoder(w).Encode(map[string]any{"status": "degraded", "role": g.role, "model": g.name,
					"error": err.Error(), "instance": g.instance, "pid": os.Getpid()})
				return
			}
		}
		waiting, running := g.load()
		body := map[string]any{"status": "ok", "role": g.role, "model": g.name,
			"waiting": waiting, "running": running, "instance": g.instance, "pid": os.Getpid()}
		if g.endpoints != nil {
			body["prefill_endpoints"] = g.endpoints()
		}
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

// serveHTTP serves h on l until ctx ends, then drains (d.Stop: new
// requests are refused with 503, those in hand finish or are cut with a
// 503) and shuts down. Requests run under d's context, not ctx, so a
// SIGTERM does not cut them.
func serveHTTP(ctx context.Context, l net.Listener, h http.Handler, d *openai.Drain, readHeader time.Duration, log *slog.Logger) error {
	srv := &http.Server{Handler: d.Handler(h), ReadHeaderTimeout: readHeader, MaxHeaderBytes: openai.MaxHeaderBytes,
		BaseContext: func(net.Listener) context.Context { return d.Context() }}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(l) }()
	select {
	case err := <-errc:
		return fmt.Errorf("http: %w", err)
	case <-ctx.Done():
	}
	d.Stop(openai.DefaultDrainGrace)
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		log.Warn("http shutdown", "err", err)
		_ = srv.Close()
	}
	return nil
}

func cmdRunner(ctx context.Context, args []string) error {
	f, err := parseRunnerFlags(args)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil)).With("role", f.role, "model", f.name)
	var secret []byte
	if f.secretFile != "" {
		b, err := os.ReadFile(f.secretFile)
		if err != nil {
			return fmt.Errorf("runner: secret: %w", err)
		}
		secret = []byte(strings.TrimSpace(string(b)))
		if len(secret) == 0 {
			return fmt.Errorf("runner: secret file %s is empty", f.secretFile)
		}
	}
	httpAddr := f.listen
	if f.role == "prefill" {
		httpAddr = f.metricsAddr
	}
	hl, err := net.Listen("tcp", httpAddr)
	if err != nil {
		return listenError(httpAddr, err)
	}
	gate := &loadGate{role: f.role, name: f.name, instance: f.instance, drain: openai.NewDrain()}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	httpDone := make(chan error, 1)
	go func() { httpDone <- serveHTTP(ctx, hl, gate, gate.drain, f.readHeaderTimeout, log) }()
	log.Info("runner starting", "http", hl.Addr().String(), "source", f.model)

	tr, err := tensor.StartRunner(tensorConfig(f, secret, log))
	if err != nil {
		cancel()
		<-httpDone
		return fmt.Errorf("runner: %w", err)
	}
	m, path, err := loadModel(ctx, f, gate, log, tr.Join())
	if err != nil {
		tr.Close()
		cancel()
		<-httpDone
		return err
	}
	defer m.Close()

	var runErr error
	if tr.Follower() && f.role == "decode" {
		runErr = runTensorFollower(ctx, f, m, tr, secret, gate, log)
	} else if f.role == "decode" {
		runErr = runDecode(ctx, f, m, path, secret, gate, log, tr)
	} else {
		runErr = runPrefill(ctx, f, m, secret, gate, log, tr)
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
func loadModel(ctx context.Context, f *runnerFlags, gate *loadGate, log *slog.Logger, join func(engine.Backend) (engine.Collective, error)) (*engine.Model, string, error) {
	t0 := time.Now()
	downloaded := false
	path, err := hf.Resolve(ctx, f.model, hf.Options{StoreDir: f.modelsDir, Offline: f.offline, Logger: log, Layers: f.layers,
		Progress: func(done, total int64) {
			downloaded = true
			if total > 0 {
				gate.setProgress(0.5 * float64(done) / float64(total))
				gate.setBytes("download", done, total)
			}
		}})
	if err != nil {
		return nil, "", fmt.Errorf("runner: model %s: %w", f.model, err)
	}
	base := 0.0
	if downloaded {
		base = 0.5
	}
	b, err := backend.Open(f.backend, backend.Options{LibPath: f.libPath, Device: f.device, Threads: f.threads, Logger: log})
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
	m, err := engine.Load(ctx, path, b, engine.LoadOptions{Tensor: coll, Layers: engine.LayerRange(f.layers), Progress: func(done, total int64) {
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

func runDecode(ctx context.Context, f *runnerFlags, m *engine.Model, path string, secret []byte, gate *loadGate, log *slog.Logger, tr *tensor.Runner) error {
	st, err := decode.NewSetup(f.name, m, path, f.defaults)
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
	if f.stages > 0 {
		rc = stageRunner(f, m, secret, met, log)
	}
	if tr != nil {
		var tm *tensor.Model
		tm, tensorDone = leadTensor(ctx, tr, m, met, gate)
		dm = tm
		if rc != nil { // a stage of tensor ranks: the ring drives the group
			rc.Ranks, rc.Health = tm, tr.Health
		}
	}
	if f.stages > 0 && f.stage > 0 {
		return runStage(ctx, f, m, st, rc, tr, tensorDone, gate, met, log)
	}
	if f.stages > 0 {
		rc.Running = func() int {
			if gate.ready.Load() == nil { // gate.load is set before ready
				return 0
			}
			_, running := gate.load()
			return running
		}
		ring, err := stage.StartRing(ctx, rc)
		if err != nil {
			return stageListenError(f, err)
		}
		dm, gate.health = ring, stage.Health(ring.Healthy, rc.Health)
	}
	if f.testPrefillRate > 0 {
		dm = paced.Model{Model: m, Rate: f.testPrefillRate}
		log.Warn("TEST ONLY: local prefill capped (--test-slow-prefill-tokens-per-sec)", "tokens_per_s", f.testPrefillRate)
	}
	o := st.Options
	o.Model, o.RemoteMinTokens, o.MaxQueue, o.MaxBatch, o.PrefillChunk, o.Metrics, o.Logger = dm, f.minRemote, f.maxQueue, f.maxBatch, f.chunk, met, log
	o.Speculative, o.SpecTokens = f.speculative, f.specTokens
	if f.draft != "" {
		dpath, err := hf.Resolve(ctx, f.draft, hf.Options{StoreDir: f.modelsDir, Offline: f.offline, Logger: log})
		if err != nil {
			return fmt.Errorf("runner: draft model %s: %w", f.draft, err)
		}
		draft, err := decode.LoadDraft(ctx, dpath, m, o.Text)
		if err != nil {
			return fmt.Errorf("runner: --draft %s: %w", f.draft, err)
		}
		defer draft.Close()
		o.Draft = draft
		log.Info("draft model loaded", "source", f.draft, "path", dpath, "arch", draft.Info().Arch, "layers", draft.Info().Layers)
	}
	if ring, ok := dm.(*stage.Ring); ok && f.prefill != "" {
		w := stageRemote(ctx, f, m, secret, met, log)
		// A stage of tensor ranks: each rank fetches its KV heads of the
		// stage's layers (one request names both ranges).
		o.Remote, gate.endpoints = &stage.Remote{Ring: ring, Local: tr.Remote(w.Remote)}, w.Breaker.Status
	} else if f.prefill != "" {
		w := newRemote(ctx, f, dm, secret, met, log, tr, m)
		o.Remote, o.Router, gate.endpoints = w.Remote, w.Router, w.Breaker.Status
		o.Remote = tr.Remote(o.Remote) // a tensor group: every rank fetches its KV heads
		log.Info("remote prefill enabled", "endpoints", f.prefill, "min_tokens", f.minRemote, "route", f.route, "kv_wire_dtype", f.kvWireDType, "kv_streams", f.kvStreams,
			"connect_timeout", f.connectTimeout, "idle_floor", f.idleFloor)
	}
	o.Stopping = gate.drain.Begun() // queued requests are answered 503 as soon as it stops
	srv := decode.New(o)
	defer srv.Close()
	mux := http.NewServeMux()
	httpapi.Mount(mux, httpapi.Options{Gen: srv, Name: o.Name, Defaults: o.Defaults, AcceptTools: o.AcceptTools, Metrics: met, Logger: log})
	srv.Register(mux)
	var h http.Handler = mux
	gate.load = srv.Load
	gate.ready.Store(&h)
	go trimWhenIdle(ctx, srv.Load, 5*time.Second, log)
	log.Info("decode runner ready", "listen", f.listen)
	var err2 error
	select {
	case <-ctx.Done():
	case err2 = <-tensorDone:
	}
	gate.drain.Stop(openai.DefaultDrainGrace) // the requests in hand end before the server closes under them
	return err2
}

// stageRunner is what the flags say about this runner's pipeline stage
// (runners/stage assembles it).
func stageRunner(f *runnerFlags, m *engine.Model, secret []byte, met *metrics.Runner, log *slog.Logger) *stage.RunnerConfig {
	return &stage.RunnerConfig{Name: f.name, Stage: f.stage, Stages: f.stages, Layers: engine.LayerRange(f.layers),
		Listen: f.stageListen, Next: f.stageNext, Secret: secret, Model: m, Metrics: stage.NewMetrics(met.Registry), Logger: log}
}

// stageListenError points a taken --stage-listen at the cluster file.
func stageListenError(f *runnerFlags, err error) error {
	if errors.Is(err, syscall.EADDRINUSE) {
		return listenError(f.stageListen, err)
	}
	return fmt.Errorf("runner: %w", err)
}

// stageRemote is a pipeline stage's KV-wire client of the prefill
// runners: it asks for the stage's layers only. A pipeline routes by
// --remote-prefill-min-tokens (the cost model needs a whole model).
func stageRemote(ctx context.Context, f *runnerFlags, m *engine.Model, secret []byte, met *metrics.Runner, log *slog.Logger) *decode.RemoteWiring {
	log.Info("pipeline stage: remote prefill of this stage's layers", "endpoints", f.prefill, "min_tokens", f.minRemote, "layers", f.layers.String())
	return decode.NewRemote(ctx, decode.RemoteConfig{Name: f.name, Model: m, Endpoints: splitList(f.prefill), Health: splitList(f.prefillHealth),
		Secret: secret, ConnectTimeout: f.connectTimeout, IdleFloor: f.idleFloor, FP8: f.kvWireDType == "fp8", Streams: f.kvStreams,
		Chunk: f.chunk, Metrics: met, Logger: log})
}

// runStage serves a pipeline stage after the first: its layers on the
// stage link, and /health and /metrics on --listen.
// rc is the stage's (with its tensor group on a tensor stage's rank 0:
// tr, whose end tensorDone carries).
func runStage(ctx context.Context, f *runnerFlags, m *engine.Model, st *decode.Setup, rc *stage.RunnerConfig, tr *tensor.Runner, tensorDone <-chan error, gate *loadGate, met *metrics.Runner, log *slog.Logger) error {
	secret := rc.Secret
	if f.speculative != "" && f.speculative != decode.SpecOff {
		// The supervisor gives every stage the model's flags; stage 0's
		// decode runner logs why a pipeline does not speculate.
		log.Info("pipeline stage: --speculative is stage 0's concern; this stage ignores it", "speculative", f.speculative)
	}
	rc.Picks = &st.Options // the last stage samples: the decode runner's tokenizer, sampler and grammars
	if f.prefill != "" {
		rc.Remote = tr.Remote(stageRemote(ctx, f, m, secret, met, log).Remote)
	} else {
		// Without --prefill of its own, the stage fetches its layers from
		// the prefill runner stage 0's remote fill names.
		rc.RemoteFor = func(endpoint string) decode.Remote {
			g := *f
			g.prefill, g.prefillHealth = endpoint, ""
			return tr.Remote(stageRemote(ctx, &g, m, secret, met, log).Remote)
		}
	}
	node, err := stage.NewStage(rc)
	if err != nil {
		return stageListenError(f, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", met.Handler())
	var h http.Handler = mux
	gate.load = func() (int, int) { return 0, 0 }
	gate.health = stage.Health(node.Healthy, rc.Health)
	gate.ready.Store(&h)
	log.Info("pipeline stage ready", "stage", f.stage, "stages", f.stages, "layers", f.layers.String(), "stage_listen", f.stageListen, "stage_next", f.stageNext)
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

func runPrefill(ctx context.Context, f *runnerFlags, m *engine.Model, secret []byte, gate *loadGate, log *slog.Logger, tr *tensor.Runner) error {
	met := metrics.New("prefill")
	cacheBytes := int64(f.cacheMiB) << 20
	if f.cacheMiB <= 0 {
		cacheBytes = -1
	}
	var pm prefill.Model = m
	if f.testPrefillRate > 0 {
		pm = paced.Model{Model: m, Rate: f.testPrefillRate}
		log.Warn("TEST ONLY: prefill capped (--test-slow-prefill-tokens-per-sec)", "tokens_per_s", f.testPrefillRate)
	}
	var stageRange engine.LayerRange
	if f.stages > 0 {
		if f.testPrefillRate > 0 {
			return fmt.Errorf("runner: --test-slow-prefill-tokens-per-sec with --stage: a prefill stage is not paced")
		}
		if _, err := (&stage.RunnerConfig{Stage: f.stage, Stages: f.stages, Layers: engine.LayerRange(f.layers), Model: m}).Link(); err != nil {
			return fmt.Errorf("runner: %w", err)
		}
		stageRange = engine.LayerRange(f.layers)
	}
	prod := prefill.New(prefill.Options{Name: f.name, Model: pm, Chunk: f.chunk, CacheBytes: cacheBytes, Metrics: met, Logger: log, Stage: stageRange})
	defer prod.Close()
	if err := startTensorPrefill(ctx, tr, prod, m, met, gate, log); err != nil {
		return err
	}
	if f.stages > 0 {
		pp, err := pipeline.NewPipe(prod, m, pipeline.PipeConfig{Stage: f.stage, Stages: f.stages, Listen: f.stageListen, Next: f.stageNext, Secret: secret, Logger: log})
		if err != nil {
			return fmt.Errorf("runner: %w", err)
		}
		pl, err := net.Listen("tcp", f.stageListen)
		if err != nil {
			return listenError(f.stageListen, err)
		}
		pp.SetListener(pl)
		go func() {
			if err := pp.Run(ctx); err != nil {
				log.Error("prefill stage link", "err", err)
			}
		}()
		gate.health = func() error {
			if !pp.Up() {
				return errors.New("prefill stage link down: a link to the previous or next prefill stage is not up")
			}
			return nil
		}
		log.Info("prefill pipeline stage", "stage", f.stage, "stages", f.stages, "layers", f.layers.String(), "stage_listen", f.stageListen, "stage_next", f.stageNext)
	}
	ks, err := kvwire.NewServer(kvwire.ServerConfig{Producer: prod, Secret: secret, MaxQueue: f.maxQueue, Logger: log})
	if err != nil {
		return fmt.Errorf("runner: %w", err)
	}
	kl, err := net.Listen("tcp", f.listen)
	if err != nil {
		return listenError(f.listen, err)
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
	log.Info("prefill runner ready", "kv_listen", kl.Addr().String(), "metrics", f.metricsAddr)
	if err := ks.Serve(ctx, kl); err != nil && !errors.Is(err, context.Canceled) && ctx.Err() == nil {
		return fmt.Errorf("runner: kv wire: %w", err)
	}
	return nil
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

// splitList splits a comma-separated flag value, dropping empty items.
func splitList(s string) []string {
	var out []string
	for _, a := range strings.Split(s, ",") {
		if a = strings.TrimSpace(a); a != "" {
			out = append(out, a)
		}
	}
	return out
}
