package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/exo-pd/exo-pd/internal/bench"
)

const benchUsage = `usage: exo bench [--url URL] [--model NAME] [--pp 512,2048] [--tg 64] [--repeat 3]
                 [--concurrency N] [--duration D] [--compare-local] [--json]

Sends streaming chat requests whose prompts have exactly PP tokens after the
model's chat template (built with the runner's POST /tokenize), generating TG
tokens each (ignore_eos), at temperature 0, and reports time to first token,
prompt tokens/s and generation tokens/s (medians over --repeat runs). Every
run starts its prompt with a fresh nonce, so no prefix cache can serve it.
With --compare-local each prompt length is also run with
x_exo_disable_remote_prefill (the decode runner prefills locally) and the
TTFT speedup of remote prefill is shown. With --concurrency N every run sends
N such requests at once (each with its own nonce) and also reports the
aggregate generation rate: all completion tokens over the run's wall time,
which is what a decode runner's batching (--max-batch) raises.
With --duration D (load mode) each prompt length instead keeps N requests
in flight for D, one after another per stream, and reports how many
succeeded, the non-200 answers by status, TTFT and request latency p50/p99
and, for 429s, the fewest requests in flight when one came; it exits 1 if
any request failed other than with 429.`

func cmdBench(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("exo bench", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	url := fs.String("url", "http://127.0.0.1:52415", "base URL of a gateway or decode runner")
	model := fs.String("model", "", "model name (default: the only one /v1/models lists)")
	ppList := fs.String("pp", "512,2048", "prompt lengths in tokens, comma-separated")
	tg := fs.Int("tg", 64, "tokens to generate per request")
	repeat := fs.Int("repeat", 3, "runs per prompt length and mode")
	compare := fs.Bool("compare-local", false, "also run with remote prefill disabled and show the speedup")
	asJSON := fs.Bool("json", false, "print JSON instead of a table")
	timeout := fs.Duration("timeout", 30*time.Minute, "overall time limit")
	conc := fs.Int("concurrency", 1, "requests sent at once in each run")
	dur := fs.Duration("duration", 0, "load mode: keep --concurrency requests in flight this long per prompt length (instead of --repeat runs) and report counts by status, p50/p99 TTFT and latency")
	if err := parseFlags(fs, benchUsage, args); err != nil {
		return err
	}
	if fs.NArg() != 0 || *tg < 1 || *repeat < 1 || *conc < 1 || *conc > 256 {
		fmt.Fprintln(os.Stderr, benchUsage)
		return exitError{code: 2, msg: "bench: bad arguments"}
	}
	var pps []int
	for _, s := range strings.Split(*ppList, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 8 {
			return exitError{code: 2, msg: fmt.Sprintf("bench: --pp %q: want integers ≥ 8", s)}
		}
		pps = append(pps, n)
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	err := bench.Run(ctx, bench.Config{URL: *url, Model: *model, PP: pps, TG: *tg, Repeat: *repeat, CompareLocal: *compare,
		JSON: *asJSON, Concurrency: *conc, Duration: *dur}, os.Stdout, os.Stderr)
	if errors.Is(err, bench.ErrPickModel) {
		return exitError{code: 2, msg: err.Error()}
	}
	return err
}
