//go:build mlx && cgo && (linux || darwin)

package mlx

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/sample"
)

// serveRep is one repetition's result, one JSON line on stdout after "REP ".
type serveRep struct {
	Side     string  `json:"side"`      // "exo" (overlapped) or "exo-serial"
	Tokens   int     `json:"tokens"`    // timed tokens over all rows
	Steps    int     `json:"steps"`     // timed steps
	Seconds  float64 `json:"seconds"`   // wall time of the timed steps
	CPUSecs  float64 `json:"cpu_s"`     // process CPU time (all threads) in that window
	HostSecs float64 `json:"host_s"`    // the steps' wall time outside MLX's eval
	Arrays   int64   `json:"arrays"`    // MLX arrays the host made in the window
	First    []int32 `json:"first"`     // the first timed step's tokens (a sanity check)
	Load     string  `json:"loadavg"`   // /proc/loadavg's first field at the start
	Started  string  `json:"start"`     // UTC time of the window's start
	Context  int     `json:"context"`   // the prompt length the steps follow
	Batch    int     `json:"batch"`     // rows per step
	Sampled  bool    `json:"sampled"`   // temperature > 0
	Mode     string  `json:"mode"`      // overlap or serial
	ModelDir string  `json:"model"`     // the model directory
	TimedPos [2]int  `json:"positions"` // the cache positions the timed steps ran at [from, to)
}

// TestDecodeBenchServe is not a test: with EXO_MLX_BENCH_SERVE=1 it is the
// exo side of scripts/reference/decode_vs_mlxlm.py, which runs it beside
// mlx-lm's scripts/reference/mlxlm_bench.py --serve and alternates
// repetitions between the two so that both see the same load. It loads
// $EXO_MLX_BENCH_MODEL (written by benchModel if absent), fills
// $EXO_MLX_BENCH_BATCHES (one number, the largest B) caches with the first
// C-1 tokens of benchPrompt (one prefill, copied into the others)(C = $EXO_MLX_BENCH_CONTEXT), prints READY, then
// for each line "rep overlap|serial B TEMP TOPP" on stdin runs one
// repetition over the first B caches and prints "REP {json}":
//
//   - every cache is cut back to C-1 tokens; one untimed step feeds the
//     prompt's last token (position C-1) to every row, as mlx-lm's
//     generate_step/BatchGenerator untimed first call does;
//   - the window then covers $EXO_MLX_BENCH_STEPS (N) steps at positions
//     C … C+N-1: overlapped (engine.Overlap: each Next queues the following
//     step before reading its tokens, so the window starts and ends with
//     one step in flight, like mlx-lm's generator), or serial (ForwardBatch,
//     logits to the host, the host's argmax or sampler);
//   - Stop (which waits for and drops the step in flight) is outside the
//     window, as mlx-lm's generator's discarded last step is.
//
// TEMP > 0 (with TOPP) samples, seeded per row, the same seeds every
// repetition; the overlapped path samples on the device.
// EXO_MLX_BENCH_PLAIN_LOAD=1 loads the weights the old way (no huge pages).
func TestDecodeBenchServe(t *testing.T) {
	if os.Getenv("EXO_MLX_BENCH_SERVE") != "1" {
		t.Skip("the exo side of scripts/reference/decode_vs_mlxlm.py; set EXO_MLX_BENCH_SERVE=1")
	}
	be := newTestBackend(t)
	if os.Getenv("EXO_MLX_BENCH_PLAIN_LOAD") == "1" {
		// The load before huge pages (decode_vs_mlxlm.py --exo-b): every
		// weight copied with mlx_array_new_data into 4 KiB pages.
		be.do(func() { be.readerLoad = false })
	}
	dir := benchModel(t)
	m := load(t, dir, be)
	ctx := context.Background()
	C, N := benchInt("EXO_MLX_BENCH_CONTEXT", 128), benchInt("EXO_MLX_BENCH_STEPS", 16)
	B := benchBatches([]int{1})[0]
	if C < 2 {
		t.Fatalf("EXO_MLX_BENCH_CONTEXT=%d: need at least 2", C)
	}
	prompt := benchPrompt(C, m.Info().Vocab)
	// One prefill; the other rows get a copy of its KV (Export/Import), as
	// mlx-lm's BatchGenerator merges copies of its one cache: on the 8B
	// shape a prefill here takes minutes.
	caches := make([]engine.KVCache, B)
	for i := range caches {
		caches[i] = m.NewCache()
		defer caches[i].Free()
	}
	if err := m.Prefill(ctx, caches[0], prompt[:C-1], 0, nil); err != nil {
		t.Fatal(err)
	}
	for l := range caches[0].Geometry().Layers {
		k, v, err := caches[0].Export(l, 0, C-1)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range caches[1:] {
			if err := c.Import(l, 0, C-1, k, v); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, c := range caches[1:] {
		if err := c.Commit(C - 1); err != nil {
			t.Fatal(err)
		}
	}
	out := bufio.NewWriter(os.Stdout)
	fmt.Fprintf(out, "READY %s B=%d C=%d N=%d\n", dir, B, C, N)
	out.Flush()
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		f := strings.Fields(in.Text())
		if len(f) == 0 {
			continue
		}
		q, err := parseServeRep(f, B)
		if err != nil {
			t.Fatal(err)
		}
		var r serveRep
		switch q.mode {
		case "overlap":
			r, err = serveOverlap(ctx, be, m, caches[:q.batch], prompt, N, q)
		case "serial":
			r, err = serveSerial(ctx, be, m, caches[:q.batch], prompt, N, q)
		}
		if err != nil {
			t.Fatal(err)
		}
		r.Context, r.Batch, r.Mode, r.ModelDir = C, q.batch, q.mode, dir
		r.Sampled = q.temp > 0
		r.TimedPos = [2]int{C, C + N}
		raw, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(out, "REP %s\n", raw)
		out.Flush()
	}
	if err := in.Err(); err != nil {
		t.Fatal(err)
	}
}

// serveQuery is one "rep MODE B TEMP TOPP" line.
type serveQuery struct {
	mode       string
	batch      int
	temp, topP float64
}

func parseServeRep(f []string, maxB int) (q serveQuery, err error) {
	if len(f) != 5 || f[0] != "rep" || (f[1] != "overlap" && f[1] != "serial") {
		return q, fmt.Errorf("command %q: want rep overlap|serial B TEMP TOPP", strings.Join(f, " "))
	}
	q.mode = f[1]
	if q.batch, err = strconv.Atoi(f[2]); err != nil || q.batch < 1 || q.batch > maxB {
		return q, fmt.Errorf("command %q: B must be 1..%d (EXO_MLX_BENCH_BATCHES)", strings.Join(f, " "), maxB)
	}
	if q.temp, err = strconv.ParseFloat(f[3], 64); err != nil {
		return q, fmt.Errorf("command %q: TEMP: %w", strings.Join(f, " "), err)
	}
	if q.topP, err = strconv.ParseFloat(f[4], 64); err != nil {
		return q, fmt.Errorf("command %q: TOPP: %w", strings.Join(f, " "), err)
	}
	return q, nil
}

// sampling is row's sampling for q: greedy, or seeded per row (the same
// seeds every repetition).
func (q serveQuery) sampling(row int) sample.Params {
	if q.temp <= 0 {
		return sample.Params{}
	}
	return sample.Params{Temperature: q.temp, TopP: q.topP, Seed: int64(row + 1)}
}

// serveReset cuts every cache back to the prompt less its last token and
// returns the rows' first tokens (the prompt's last).
func serveReset(caches []engine.KVCache, prompt []int32) []int32 {
	toks := make([]int32, len(caches))
	for i, c := range caches {
		c.Truncate(len(prompt) - 1)
		toks[i] = prompt[len(prompt)-1]
	}
	return toks
}

func serveWindow(be *backend) (start time.Time, cpu0 time.Duration, made0 int64, r serveRep) {
	r.Load = loadAvg()
	start = time.Now()
	r.Started = start.UTC().Format("15:04:05")
	return start, cpuTime(), be.made.Load(), r
}

func serveOverlap(ctx context.Context, be *backend, m *engine.Model, caches []engine.KVCache, prompt []int32, N int, q serveQuery) (serveRep, error) {
	toks := serveReset(caches, prompt)
	specs := make([]engine.SampleSpec, len(caches))
	for i := range specs {
		p := q.sampling(i)
		specs[i].Params = p
		if p.Temperature > 0 {
			specs[i].Uniform = sample.New(p).Uniform
		}
	}
	o, err := m.StartOverlap(ctx, caches, toks, specs)
	if err != nil {
		return serveRep{}, err
	}
	defer o.Stop()
	if _, err := o.Next(ctx); err != nil { // position C-1's tokens; position C's step now in flight
		return serveRep{}, err
	}
	start, cpu0, made0, r := serveWindow(be)
	var host time.Duration
	for k := 0; k < N; k++ {
		t0, e0 := time.Now(), be.evalNanos.Load()
		got, err := o.Next(ctx)
		if err != nil {
			return serveRep{}, err
		}
		host += time.Since(t0) - time.Duration(be.evalNanos.Load()-e0)
		if k == 0 {
			r.First = append([]int32(nil), got...)
		}
	}
	r.Seconds = time.Since(start).Seconds()
	r.CPUSecs = (cpuTime() - cpu0).Seconds()
	r.Arrays = be.made.Load() - made0
	r.HostSecs = host.Seconds()
	r.Side, r.Tokens, r.Steps = "exo", N*len(caches), N
	return r, o.Stop()
}

func serveSerial(ctx context.Context, be *backend, m *engine.Model, caches []engine.KVCache, prompt []int32, N int, q serveQuery) (serveRep, error) {
	toks := serveReset(caches, prompt)
	samplers := make([]*sample.Sampler, len(caches)) // nil: argmax
	for i := range samplers {
		if p := q.sampling(i); p.Temperature > 0 {
			samplers[i] = sample.New(p)
		}
	}
	step := func() error {
		logits, err := m.ForwardBatch(ctx, caches, toks)
		if err != nil {
			return err
		}
		for i := range toks {
			if samplers[i] != nil {
				toks[i] = samplers[i].Sample(logits[i], nil)
			} else {
				toks[i] = argmax(logits[i])
			}
		}
		return nil
	}
	if err := step(); err != nil { // position C-1, untimed
		return serveRep{}, err
	}
	start, cpu0, made0, r := serveWindow(be)
	var host time.Duration
	for k := 0; k < N; k++ {
		t0, e0 := time.Now(), be.evalNanos.Load()
		if err := step(); err != nil {
			return serveRep{}, err
		}
		host += time.Since(t0) - time.Duration(be.evalNanos.Load()-e0)
		if k == 0 {
			r.First = append([]int32(nil), toks...)
		}
	}
	r.Seconds = time.Since(start).Seconds()
	r.CPUSecs = (cpuTime() - cpu0).Seconds()
	r.Arrays = be.made.Load() - made0
	r.HostSecs = host.Seconds()
	r.Side, r.Tokens, r.Steps = "exo-serial", N*len(caches), N
	return r, nil
}

func loadAvg() string {
	raw, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	if f := strings.Fields(string(raw)); len(f) > 0 {
		return f[0]
	}
	return ""
}
