package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/exo-pd/exo-pd/runners/decode"
	"github.com/exo-pd/exo-pd/runners/hf"
	"github.com/exo-pd/exo-pd/runners/runner"
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
/v1/completions, /v1/responses, /tokenize, /detokenize), Anthropic's (POST
/v1/messages, /v1/messages/count_tokens) and GET /v1/models, /health,
/metrics on --listen.
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
another one answering on the same port. --stop-grace D (both roles; the
supervisor passes its --grace) is the time between SIGTERM and SIGKILL: on
SIGTERM the requests in hand get all of it but 3s to finish (5s without it).`

// runnerFlags are exo runner's flags (both roles): the settings
// runners/runner runs the process from.
type runnerFlags struct{ runner.Config }

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
	f := &runnerFlags{runner.Config{Role: args[0]}}
	fs := flag.NewFlagSet("exo runner "+f.Role, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&f.Model, "model", "", "model source")
	fs.StringVar(&f.Name, "served-name", "", "model name clients send")
	fs.StringVar(&f.Listen, "listen", "", "address to serve on")
	fs.StringVar(&f.SecretFile, "secret-file", "", "file holding the KV-wire secret")
	fs.StringVar(&f.Backend, "backend", "auto", "engine backend: cpu, mlx or auto")
	fs.StringVar(&f.Device, "device", "", "mlx device: gpu or cpu")
	fs.StringVar(&f.LibPath, "mlx-lib", "", "path of libmlxc (default: search)")
	fs.StringVar(&f.ModelsDir, "models-dir", "", "model store directory")
	fs.BoolVar(&f.Offline, "offline", false, "do not download models")
	fs.IntVar(&f.MaxQueue, "max-queue", 0, "requests that may wait (decode default 64, prefill default 8)")
	fs.IntVar(&f.Threads, "threads", 0, "cpu backend threads (0: all cores)")
	fs.IntVar(&f.Chunk, "prefill-chunk", 256, "prefill chunk in tokens")
	fs.DurationVar(&f.ReadHeaderTimeout, "read-header-timeout", 10*time.Second, "HTTP connections that have not sent their headers within this are closed")
	fs.StringVar(&f.Instance, "instance", "", "identity token /health reports (the supervisor's per-start token)")
	fs.DurationVar(&f.StopGrace, "stop-grace", 0, "time between SIGTERM and SIGKILL (the supervisor passes its --grace): requests in hand get all of it but 3s to finish (0: 5s)")
	// Not in the usage text: tests only (routing and scheduling tests make
	// one machine look like several of different speeds).
	fs.Float64Var(&f.TestPrefillRate, "test-slow-prefill-tokens-per-sec", 0, "TEST ONLY: cap this runner's prefill at N tokens/s (0: off)")
	if f.Role == "decode" {
		fs.IntVar(&f.MaxBatch, "max-batch", 0, "generations run at once, their steps batched (default 4; 1: one at a time)")
		fs.Var(optFloat{&f.Defaults.Temperature}, "default-temperature", "default temperature (over the model's)")
		fs.Var(optFloat{&f.Defaults.TopP}, "default-top-p", "default top_p (over the model's)")
		fs.Var(optInt{&f.Defaults.TopK}, "default-top-k", "default top_k (over the model's)")
		fs.Var(optFloat{&f.Defaults.MinP}, "default-min-p", "default min_p (over the model's)")
		fs.Var(optFloat{&f.Defaults.RepetitionPenalty}, "default-repetition-penalty", "default repetition_penalty (over the model's)")
		fs.StringVar(&f.Prefill, "prefill", "", "prefill runners' KV-wire addresses, comma-separated; ADDR@A:B names a prefill pipeline stage holding layers [A, B) (every entry then names its layers)")
		fs.StringVar(&f.PrefillHealth, "prefill-health", "", "the prefill runners' HTTP (--metrics) addresses, comma-separated, in --prefill's order: their /health load ranks busy hosts later")
		fs.IntVar(&f.MinRemote, "remote-prefill-min-tokens", 256, "uncached prompt tokens needed to prefill remotely")
		fs.StringVar(&f.Route, "remote-prefill-route", "", "how a long prompt picks local or remote prefill: cost (predicted time from measured rates, queues and links; the min tokens a floor) or floor (the min tokens alone); default cost, but floor on a pipeline stage, a tensor rank or with prefill stages or ranks, which refuse cost")
		fs.DurationVar(&f.ConnectTimeout, "prefill-connect-timeout", time.Second, "connect + hello deadline of a prefill endpoint; past it the endpoint is skipped until it answers a probe")
		fs.StringVar(&f.KVWireDType, "kv-wire-dtype", "native", "KV dtype asked of prefill runners: native (this cache's dtype) or fp8 (E4M3, per-head scales; half of bf16's bytes)")
		fs.IntVar(&f.KVStreams, "kv-streams", 1, "TCP connections each KV transfer from a prefill runner is striped over (1 to 16; the prefill runner must speak kvwire version 4)")
		fs.StringVar(&f.Speculative, "speculative", decode.SpecOff, "speculative decoding: off, prompt-lookup (drafts from n-grams of the prompt and output) or draft (drafts by --draft's model); drafts are verified in one forward")
		fs.StringVar(&f.Draft, "draft", "", "the draft model (a model directory, .gguf file or Hugging Face id of the same tokenizer) of --speculative draft, loaded on this runner's backend")
		fs.IntVar(&f.SpecTokens, "speculative-tokens", 0, fmt.Sprintf("the most tokens drafted per step (1 to 64; 0: %d)", decode.DefaultSpecTokens))
		fs.DurationVar(&f.IdleFloor, "prefill-idle-floor", 3*time.Second, "shortest wait for the next KV frame (the deadline grows with the endpoint's measured chunk time)")
	} else {
		fs.StringVar(&f.MetricsAddr, "metrics", "", "HTTP address for /health and /metrics")
		fs.IntVar(&f.CacheMiB, "prefix-cache-mib", 1024, "prefix cache size in MiB (0: off)")
	}
	fs.Func("layers", "pipeline stage: this stage's layers A:B ([A, B) of the model)", func(v string) (err error) {
		f.Layers, err = hf.ParseLayers(v)
		return err
	})
	fs.Func("stage", "pipeline stage: I/N, this stage's index of N stages (N ≥ 2)", func(v string) error {
		is, ns, ok := strings.Cut(v, "/")
		i, err1 := strconv.Atoi(is)
		n, err2 := strconv.Atoi(ns)
		if !ok || err1 != nil || err2 != nil || n < 2 || i < 0 || i >= n {
			return fmt.Errorf("want I/N with N ≥ 2 and 0 ≤ I < N, not %q", v)
		}
		f.Stage, f.Stages = i, n
		return nil
	})
	fs.StringVar(&f.Tensor, "tensor", "", "tensor-parallel rank I/N of this runner (with --tensor-peers)")
	fs.StringVar(&f.TensorPeers, "tensor-peers", "", "the tensor-parallel ranks' link addresses, comma-separated, in rank order (rank 0 listens on the first)")
	fs.StringVar(&f.TensorRDMA, "tensor-rdma", "", "with --tensor on --backend mlx: MLX JACCL's RDMA device matrix, JSON N×N (row i: rank i's device toward each rank, null on the diagonal); falls back to the ring where JACCL is unavailable")
	fs.StringVar(&f.StageListen, "stage-listen", "", "pipeline stage: the address the previous stage's link (stage 0: the last stage's) connects to")
	fs.StringVar(&f.StageNext, "stage-next", "", "pipeline stage: the next stage's --stage-listen (the last stage: stage 0's)")
	if err := parseFlags(fs, runnerUsage, args[1:]); err != nil {
		return nil, err
	}
	if fs.NArg() != 0 {
		return nil, exitError{code: 2, msg: fmt.Sprintf("runner: unexpected arguments %q", fs.Args())}
	}
	if err := f.Check(); err != nil {
		return nil, exitError{code: 2, msg: "runner: " + err.Error()}
	}
	return f, nil
}

func cmdRunner(ctx context.Context, args []string) error {
	f, err := parseRunnerFlags(args)
	if err != nil {
		return err
	}
	return runner.Run(ctx, f.Config, slog.New(slog.NewTextHandler(os.Stderr, nil)).With("role", f.Role, "model", f.Name))
}
