# Benchmark mlx-lm on a safetensors model dir: prefill tok/s (cache only, no
# logits, one chunk; the first repetition untimed) and greedy decode tok/s,
# plus process CPU ms per token and peak MLX memory above the weights during
# prefill. Used by bench_vs_mlxlm.sh; the prompt ids match benchPrompt in
# runners/engine/mlx/bench_mlx_test.go.
# With BATCH > 1 it also times batched decode of BATCH sequences, DECODE
# steps of BATCH tokens each: double-buffered by hand as generate_step does
# (step n+1 built from the device's argmax and async_eval'd before step n's
# tokens are read), and through mlx-lm's own BatchGenerator (what
# batch_generate runs). SAMPLE_TEMP > 0 (and SAMPLE_TOP_P) in the environment samples
# with mlx-lm's make_sampler instead of the argmax (generate_step and
# BatchGenerator; the synchronous loop stays greedy).
# usage: mlxlm_bench.py MODEL_DIR CONTEXT PREFILL DECODE REPS [BATCH]
import os, sys, time, resource
from pathlib import Path
import mlx.core as mx
from mlx_lm.utils import load_model
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.generate import generate_step, BatchGenerator
from mlx_lm.sample_utils import make_sampler

def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime

class Timed:
    """The model, with the time spent in its calls (building the lazy graph:
    nothing is evaluated there) added up in .host."""
    def __init__(self, m):
        self.__dict__.update(m=m, host=0.0)
    def __call__(self, *a, **k):
        t = time.perf_counter()
        r = self.m(*a, **k)
        self.__dict__["host"] += time.perf_counter() - t
        return r
    def __getattr__(self, name):
        return getattr(self.m, name)

def serve(path, C, N):
    """The mlx-lm side of decode_vs_mlxlm.py (usage: mlxlm_bench.py --serve
    MODEL_DIR CONTEXT STEPS). Loads the model, fills one cache with the first
    C-1 prompt ids, prints READY, then for each line "rep B TEMP TOPP" on stdin
    runs one repetition and prints "REP {json}": the cache is cut back to C-1;
    generate_step (B = 1) or BatchGenerator over B copies of the cache (B > 1,
    mlx-lm's batched path) is fed the prompt's last id and its first call is
    untimed (it yields position C-1's token with position C's step in flight);
    the window covers the next N calls (positions C ... C+N-1: the window starts
    and ends with one step in flight, as exo's overlapped window does); the
    generator is dropped and the stream synchronized outside the window.
    TEMP > 0 samples with make_sampler(TEMP, TOPP) (mx.random.seed(1) first)."""
    import json
    mx.set_default_device(mx.cpu)
    model, config = load_model(Path(path))
    vocab = config["vocab_size"]
    ids = [(i * 7919 + 13) % (vocab - 3) for i in range(C)]
    tm = Timed(model)
    base = make_prompt_cache(model)
    model(mx.array(ids[:C - 1])[None], cache=base)
    mx.eval([c.state for c in base])
    print(f"READY {path} C={C} N={N}", flush=True)
    for line in sys.stdin:
        f = line.split()
        if not f:
            continue
        if len(f) != 4 or f[0] != "rep":
            sys.exit(f"command {line!r}: want rep B TEMP TOPP")
        B, temp, top_p = int(f[1]), float(f[2]), float(f[3])
        sampler = make_sampler(temp, top_p) if temp > 0 else None
        mx.random.seed(1)
        for c in base:
            c.trim(c.offset - (C - 1))
        if B == 1:
            g = generate_step(mx.array(ids[C - 1:]), tm, max_tokens=N + 2, sampler=sampler, prompt_cache=base)
            step = lambda: [next(g)[0]]
            step()
        else:
            bg = BatchGenerator(tm, stop_tokens=set(), sampler=sampler, completion_batch_size=B, prefill_batch_size=B)
            bg.insert([ids[C - 1:]] * B, max_tokens=N + 2, caches=[base] * B)
            step = lambda: [r.token for r in bg.next()]
            assert len(step()) == B
        r = {"side": "mlx-lm", "loadavg": open("/proc/loadavg").read().split()[0], "batch": B, "sampled": temp > 0,
             "context": C, "positions": [C, C + N], "mode": "generate_step" if B == 1 else "BatchGenerator"}
        tm.host = 0.0
        c0, t0 = cpu(), time.perf_counter()
        r["start"] = time.strftime("%H:%M:%S", time.gmtime())
        for k in range(N):
            got = step()
            if k == 0:
                r["first"] = got
            assert len(got) == B, (len(got), B)
        r["seconds"], r["cpu_s"], r["host_s"] = time.perf_counter() - t0, cpu() - c0, tm.host
        r["tokens"], r["steps"] = N * B, N
        if B == 1:
            g.close()
        else:
            bg.close()
            del bg
        mx.synchronize()
        print("REP " + json.dumps(r), flush=True)

if sys.argv[1] == "--serve":
    serve(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    sys.exit(0)

path, ctx_len, prefill_len, decode_n, reps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
batch = int(sys.argv[6]) if len(sys.argv) > 6 else 1
mx.set_default_device(mx.cpu)
model, config = load_model(Path(path))
vocab = config["vocab_size"]
prompt = lambda n: [(i * 7919 + 13) % (vocab - 3) for i in range(n)]

def measure(name, run, n):
    rates, cpus = [], []
    for r in range(reps + 1):
        setup = run()
        c0, t = cpu(), time.perf_counter()
        setup()
        dt, dc = time.perf_counter() - t, cpu() - c0
        if r > 0:
            rates.append(n / dt); cpus.append(1000 * dc / n)
    print(f"mlx-lm {name}: best {max(rates):.1f} tok/s, reps {[round(x,1) for x in rates]}, cpu-ms/tok min {min(cpus):.2f}")

p = mx.array(prompt(prefill_len))[None]
def prefill():
    cache = make_prompt_cache(model)
    def go():
        model(p, cache=cache)
        mx.eval([c.state for c in cache])
    return go
if prefill_len > 0:
    warm = prefill(); warm()
    base = mx.get_active_memory(); mx.reset_peak_memory()
    measure(f"prefill {prefill_len}", prefill, prefill_len)
    print(f"mlx-lm prefill {prefill_len}: peak-MB above weights {(mx.get_peak_memory() - base) / 2**20:.1f}")

if decode_n == 0: sys.exit(0)
greedy = lambda logprobs: mx.argmax(logprobs, axis=-1)
temp, top_p = float(os.environ.get("SAMPLE_TEMP", "0")), float(os.environ.get("SAMPLE_TOP_P", "0"))
sampler = make_sampler(temp, top_p) if temp > 0 else greedy
if temp > 0:
    print(f"mlx-lm sampling: make_sampler(temp={temp}, top_p={top_p})")
def gen():
    cache = make_prompt_cache(model)
    g = generate_step(mx.array(prompt(ctx_len)), model, max_tokens=decode_n + 1, sampler=sampler, prompt_cache=cache)
    next(g)
    def go():
        for _ in g:
            pass
    return go
measure(f"decode (generate_step) after {ctx_len}", gen, decode_n)

host = []  # per timed repetition: seconds outside mx.eval (building the graph in Python)
def sync():
    cache = make_prompt_cache(model)
    logits = model(mx.array(prompt(ctx_len))[None], cache=cache)
    y = mx.argmax(logits[:, -1, :], axis=-1)
    mx.eval(y)
    def go():
        nonlocal y
        h = 0.0
        for _ in range(decode_n):
            t0 = time.perf_counter()
            logits = model(y[:, None], cache=cache)
            y = mx.argmax(logits[:, -1, :].astype(mx.float32), axis=-1)
            t1 = time.perf_counter()
            mx.eval(y)
            h += t1 - t0  # mx.eval excluded
        host.append(h)
    return go
measure(f"decode (synchronous loop) after {ctx_len}", sync, decode_n)
print(f"mlx-lm decode host-ms/tok (graph building, eval excluded): min {1000 * min(host[1:]) / decode_n:.2f}, reps {[round(1000 * x / decode_n, 2) for x in host[1:]]}")

if batch > 1:
    def batched():
        # The prompt's KV first, evaluated before the window (an earlier
        # version only async_eval'd the prefill, so the window waited for it,
        # logits of all batch x ctx_len positions included: ~15 GFLOP of head
        # on a SmolLM2 shape, most of its 0.8 tok/s); the first token then
        # comes from a one-position step.
        cache = make_prompt_cache(model)
        ids = mx.array([prompt(ctx_len)] * batch)
        model(ids[:, :-1], cache=cache)
        mx.eval([c.state for c in cache])
        y = mx.argmax(model(ids[:, -1:], cache=cache)[:, -1, :], axis=-1)
        mx.eval(y)
        def go():
            nonlocal y
            for _ in range(decode_n):
                nxt = mx.argmax(model(y[:, None], cache=cache)[:, -1, :], axis=-1)
                mx.async_eval(nxt)
                y.tolist()
                y = nxt
            y.tolist()
        return go
    measure(f"decode batch {batch} (double-buffered, tok/s over all rows) after {ctx_len}", batched, decode_n * batch)

    def batchgen():
        g = BatchGenerator(model, stop_tokens=set(), sampler=sampler, completion_batch_size=batch, prefill_batch_size=batch)
        g.insert([prompt(ctx_len)] * batch, max_tokens=decode_n + 1)
        first = g.next()  # the prompts' prefill and first tokens, untimed
        assert len(first) == batch, len(first)
        def go():
            n = 0
            while responses := g.next():
                n += len(responses)
            assert n == decode_n * batch, (n, decode_n * batch)
            g.close()
        return go
    measure(f"decode batch {batch} (BatchGenerator, tok/s over all rows) after {ctx_len}", batchgen, decode_n * batch)
