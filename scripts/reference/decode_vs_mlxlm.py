#!/usr/bin/env python3
"""Decode tok/s of exo's MLX backend against mlx-lm, side by side on the same
libmlx (MLX's CPU device), every configuration of issue 31 in one run.

For each model (SmolLM2-shaped and 8B-shaped, f32 and bf16) it starts two
long-lived processes that load the model and fill their caches with the same
prompt ids once:

  exo     the test binary's TestDecodeBenchServe (EXO_MLX_BENCH_SERVE=1,
          runners/engine/mlx/benchserve_mlx_test.go): engine.Overlap, the
          decode runner's path (--serial adds the serial step: ForwardBatch,
          logits to the host, the host's pick);
  mlx-lm  scripts/reference/mlxlm_bench.py --serve: generate_step for one
          stream, BatchGenerator (what batch_generate runs) for a batch.

and then alternates repetitions between them (A B, B A, A B, ...) for each
configuration (greedy, batch of 4 greedy, one sampled stream at temperature
0.8, top-p 0.9), so that both sides see the same load. A repetition is the
same on both sides: the caches are cut back to CONTEXT-1 ids, one untimed
step feeds the prompt's last id (position CONTEXT-1), then the window covers
STEPS decode steps (positions CONTEXT ... CONTEXT+STEPS-1), starting and
ending with one step in flight; tearing down (exo's Stop, mlx-lm's dropped
generator and mx.synchronize) is outside the window. tok/s = tokens of all
rows in the window / its wall time; cpu-ms/tok = the process's user+system
CPU time (all threads) in the window per token; host-ms/step = exo: a step's
wall time outside MLX's eval, mlx-lm: the time inside the model's __call__
(building the lazy graph; its sampler and Python loop are not counted).

--exo-b K=V[,K=V] puts a second exo process, with those extra environment
variables, where mlx-lm was: an A/B of exo against itself in the same
alternation (EXO_MLX_BENCH_PLAIN_LOAD=1: weights copied with
mlx_array_new_data into 4 KiB pages, the load before huge pages).

The table prints per configuration the median of each side, the ratio of the
medians and the median (min-max) of the paired ratios (each exo repetition
over the mlx-lm one next to it). First tokens: whether both sides' first
timed tokens agree (greedy rows should, bar bf16 rounding near a tie;
sampled rows draw from different generators, so agreement there is chance).

Usage (from the repository root; about 12 minutes at load 2, see
docs/BENCHMARKS.md):

  scripts/reference/decode_vs_mlxlm.py --reps 3 --budget 720

Environment: EXO_MLXC_PATH (libmlxc.so, default /work/build/mlxc/lib/...),
PY (mlx-lm's python, default /tmp/mlxlm-venv/bin/python), TEST (a prebuilt
`go test -c -tags mlx ./runners/engine/mlx/` binary; built when absent),
BENCH_DIR (where the models are or get written, default /tmp), TEST_BASE
(optional: a second test binary, e.g. built from an earlier commit, served
beside the first as side "exo-base" and alternated with the others; the
table's notes then give exo over exo-base per configuration).
"""
import argparse
import json
import os
import queue
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))

# name, directory, EXO_MLX_BENCH_SHAPE, dtype, context, steps
MODELS = [
    ("smol-f32", "overlap-smol-f32", "", "f32", 128, 16),
    ("smol-bf16", "overlap-smol-bf16", "", "bf16", 128, 16),
    # 8B-shaped: a shorter prompt (the step's cost is its 2 x 218 M + 525 M
    # weights; attention over 32 or 128 positions is noise), since a prefill
    # of these widths on MLX's CPU device takes minutes.
    ("8b2-f32", "overlap-8b2-f32", "8b", "f32", 32, 4),
    ("8b2-bf16", "overlap-8b2-bf16", "8b", "bf16", 32, 4),
    # The host-bound tiny model (4 layers, width 256, vocabulary 512): only
    # when asked for (--models tiny); a quick check of the script itself.
    ("tiny-f32", "bench-tiny-f32", "tiny", "f32", 128, 32),
]
# name, batch, temperature, top-p
CONFIGS = [("greedy", 1, 0.0, 0.0), ("batch4", 4, 0.0, 0.0), ("sampled", 1, 0.8, 0.9)]


def log(*a):
    print(time.strftime("%H:%M:%S", time.gmtime()), *a, file=sys.stderr, flush=True)


class Server:
    """A benchmark process speaking the READY / rep / REP line protocol."""

    def __init__(self, name, argv, env, timeout):
        self.name, self.timeout = name, timeout
        self.p = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT)
        self.lines = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.ready = self._expect("READY")

    def _read(self):
        for line in self.p.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def _expect(self, prefix):
        deadline = time.monotonic() + self.timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                self.close()
                raise TimeoutError(f"{self.name}: no {prefix} line within {self.timeout} s")
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                continue
            if line is None:
                raise RuntimeError(f"{self.name}: exited (rc {self.p.wait()}) before {prefix}")
            if line.startswith(prefix):
                return line[len(prefix):].strip()
            print(f"  [{self.name}] {line}", file=sys.stderr, flush=True)

    def rep(self, cmd):
        before = self.thread_cpu()
        self.p.stdin.write(cmd + "\n")
        self.p.stdin.flush()
        r = json.loads(self._expect("REP"))
        after = self.thread_cpu()
        # Which threads did the work: each busy thread's share of the
        # process's CPU over the repetition (untimed first step included).
        d = sorted((after[t] - before.get(t, 0) for t in after), reverse=True)
        tot = sum(d) or 1
        r["thread_shares"] = [round(x / tot, 2) for x in d if x / tot >= 0.02]
        return r

    def thread_cpu(self):
        """{tid: user+system clock ticks} of the process's threads."""
        out = {}
        try:
            for tid in os.listdir(f"/proc/{self.p.pid}/task"):
                with open(f"/proc/{self.p.pid}/task/{tid}/stat") as f:
                    rest = f.read().rsplit(")", 1)[1].split()
                out[tid] = int(rest[11]) + int(rest[12])
        except OSError:
            pass
        return out

    def threads(self):
        try:
            return len(os.listdir(f"/proc/{self.p.pid}/task"))
        except OSError:
            return -1

    def close(self):
        if self.p.stdin and not self.p.stdin.closed:
            try:
                self.p.stdin.close()
            except OSError:
                pass
        try:
            self.p.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()


def build_test():
    if os.environ.get("TEST"):
        return os.environ["TEST"]
    out = os.path.join(tempfile.mkdtemp(), "mlx.test")
    log("building", out)
    subprocess.run(["go", "test", "-c", "-tags", "mlx", "-o", out, "./runners/engine/mlx/"], cwd=ROOT, check=True)
    return out


def per_tok(r, key):
    return 1000 * r[key] / r["tokens"]


def per_step(r, key):
    return 1000 * r[key] / r["steps"]


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=3, help="repetitions per side and configuration (at most)")
    ap.add_argument("--min-reps", type=int, default=2, help="repetitions run even past the budget")
    ap.add_argument("--budget", type=float, default=0, help="seconds for the whole run (0: no limit); each model gets an equal share of what is left")
    ap.add_argument("--warmup", type=int, default=1, help="untimed repetitions per side and configuration first")
    ap.add_argument("--models", default=".", help="regular expression: which models (%s)" % ", ".join(m[0] for m in MODELS))
    ap.add_argument("--configs", default=".", help="regular expression: which configurations (%s)" % ", ".join(c[0] for c in CONFIGS))
    ap.add_argument("--serial", action="store_true", help="also time exo's serial step (host time before the overlap)")
    ap.add_argument("--exo-b", default="", metavar="K=V[,K=V]",
                    help="run a second exo process with these extra environment variables instead of mlx-lm, as the baseline "
                         "side 'exo-b' (e.g. EXO_MLX_BENCH_PLAIN_LOAD=1: weights copied with mlx_array_new_data, no huge pages)")
    ap.add_argument("--steps", type=int, default=0, help="override every model's decode steps per repetition")
    ap.add_argument("--jsonl", default="", help="append every repetition's JSON here")
    ap.add_argument("--timeout", type=float, default=1200, help="seconds a process may take to answer (load, or one repetition)")
    ap.add_argument("--table", default="", help="print the table of a --jsonl file's repetitions and exit (runs nothing; with --exo-b for such a run)")
    a = ap.parse_args()
    if a.table:
        results = {}
        for line in open(a.table):
            r = json.loads(line)
            results.setdefault((r["model"], r["config"], r["side"]), []).append(r)
        seen = {k[0] for k in results}
        print_table([m for m in MODELS if m[0] in seen], CONFIGS, results, {}, a, 0)
        return

    mlxc = os.environ.get("EXO_MLXC_PATH", "/work/build/mlxc/lib/libmlxc.so")
    py = os.environ.get("PY", "/tmp/mlxlm-venv/bin/python")
    bench_dir = os.environ.get("BENCH_DIR", "/tmp")
    models = [m for m in MODELS if re.search(a.models, m[0]) and (m[2] != "tiny" or "tiny" in a.models)]
    configs = [c for c in CONFIGS if re.search(a.configs, c[0])]
    if not models or not configs:
        sys.exit("no model or configuration matches")
    test = build_test()
    t_start = time.monotonic()
    results = {}  # (model, config, side) -> [rep]
    info = {}  # model -> notes
    try:
        run(a, models, configs, test, mlxc, py, bench_dir, t_start, results, info)
    finally:  # a partial table too (an error, ^C)
        print_table(models, configs, results, info, a, time.monotonic() - t_start)


def run(a, models, configs, test, mlxc, py, bench_dir, t_start, results, info):
    jl = open(a.jsonl, "a") if a.jsonl else None
    for mi, (mname, mdir, shape, dtype, C, N) in enumerate(models):
        N = a.steps or N
        path = os.path.join(bench_dir, mdir)
        left = a.budget - (time.monotonic() - t_start) if a.budget else 0
        deadline = time.monotonic() + left / (len(models) - mi) if a.budget else None
        maxB = max(c[1] for c in configs)
        env = dict(os.environ, EXO_MLX_BENCH_SERVE="1", EXO_MLXC_PATH=mlxc, EXO_MLX_BENCH_MODEL=path,
                   EXO_MLX_BENCH_CONTEXT=str(C), EXO_MLX_BENCH_STEPS=str(N), EXO_MLX_BENCH_BATCHES=str(maxB),
                   EXO_MLX_BENCH_SHAPE=shape, EXO_MLX_BENCH_DTYPE=dtype)
        log(f"{mname}: starting exo (writes {path} if absent) and mlx-lm, context {C}, {N} steps a repetition")
        t0 = time.monotonic()
        exo = Server("exo", [test, "-test.run", "^TestDecodeBenchServe$", "-test.timeout", "0"], env, a.timeout)
        if a.exo_b:
            extra = dict(kv.split("=", 1) for kv in a.exo_b.split(","))
            lm = Server("exo-b", [test, "-test.run", "^TestDecodeBenchServe$", "-test.timeout", "0"], dict(env, **extra), a.timeout)
            base_cmd = "rep overlap"
        else:
            lm = Server("mlx-lm", [py, os.path.join(ROOT, "scripts/reference/mlxlm_bench.py"), "--serve", path, str(C), str(N)],
                        dict(os.environ), a.timeout)
            base_cmd = "rep"
        old = None
        if os.environ.get("TEST_BASE"):
            old = Server("exo-base", [os.environ["TEST_BASE"], "-test.run", "^TestDecodeBenchServe$", "-test.timeout", "0"], env, a.timeout)
        base = base_side(a)
        info[mname] = {"startup_s": round(time.monotonic() - t0), "threads": {"exo": exo.threads(), base: lm.threads()}}
        sides = {"exo": lambda B, T, P: exo.rep(f"rep overlap {B} {T} {P}"),
                 base: lambda B, T, P: lm.rep(f"{base_cmd} {B} {T} {P}")}
        if a.serial:
            sides["exo-serial"] = lambda B, T, P: exo.rep(f"rep serial {B} {T} {P}")
        if old:
            sides["exo-base"] = lambda B, T, P: old.rep(f"rep overlap {B} {T} {P}")
        try:
            for _ in range(a.warmup):
                for cname, B, T, P in configs:
                    for s, run in sides.items():
                        r = run(B, T, P)
                        log(f"{mname} {cname} {s} warm-up: {r['tokens'] / r['seconds']:.2f} tok/s")
            rnd = 0
            while rnd < a.reps:
                t_round = time.monotonic()
                for ci, (cname, B, T, P) in enumerate(configs):
                    order = list(sides)
                    if (rnd + ci) % 2:
                        order.reverse()  # A B, then B A, ...
                    for s in order:
                        r = sides[s](B, T, P)
                        r.update(model=mname, config=cname, round=rnd, side=s)
                        if jl:
                            jl.write(json.dumps(r) + "\n")
                            jl.flush()
                        results.setdefault((mname, cname, s), []).append(r)
                        log(f"{mname} {cname} {s} rep {rnd}: {r['tokens'] / r['seconds']:.2f} tok/s, "
                            f"{per_tok(r, 'cpu_s'):.0f} cpu-ms/tok, host {per_step(r, 'host_s'):.2f} ms/step, load {r['loadavg']}")
                rnd += 1
                took = time.monotonic() - t_round
                if deadline and rnd >= a.min_reps and time.monotonic() + took > deadline:
                    log(f"{mname}: stopping after {rnd} rounds (budget)")
                    break
            info[mname]["threads_after"] = {"exo": exo.threads(), base: lm.threads()}
        finally:
            exo.close()
            lm.close()
            if old:
                old.close()


def base_side(a):
    """The side exo is compared with: mlx-lm, or a second exo process (--exo-b)."""
    return "exo-b" if a.exo_b else "mlx-lm"


def print_table(models, configs, results, info, a, total):
    base = base_side(a)
    print()
    print(f"decode_vs_mlxlm.py: {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC, {total / 60:.1f} min, "
          f"reps {a.reps} (min {a.min_reps}), budget {a.budget or 'none'} s")
    print()
    if a.exo_b:
        print(f"exo-b: a second exo process with {a.exo_b}")
        print()
    print(f"| model | config | exo tok/s (median; reps) | {base} tok/s (median; reps) | ratio of medians | paired ratio median (min–max) "
          f"| cpu-ms/tok exo / {base} | host-ms/step exo / {base}" + (" / exo serial" if a.serial else "") +
          " | first tokens | load |")
    print("|---|---|---|---|---:|---|---|---|---|---|")
    for mname, *_ in models:
        for cname, B, T, P in configs:
            e, l = results.get((mname, cname, "exo"), []), results.get((mname, cname, base), [])
            if not e or not l:
                continue
            rate = lambda rs: [r["tokens"] / r["seconds"] for r in rs]
            er, lr = rate(e), rate(l)
            paired = [x / y for x, y in zip(er, lr)]
            ecpu, lcpu = med([per_tok(r, "cpu_s") for r in e]), med([per_tok(r, "cpu_s") for r in l])
            host = f"{med([per_step(r, 'host_s') for r in e]):.2f} / {med([per_step(r, 'host_s') for r in l]):.2f}"
            if a.serial:
                s = results.get((mname, cname, "exo-serial"), [])
                host += f" / {med([per_step(r, 'host_s') for r in s]):.2f}" if s else " / —"
            same = all(x["first"] == y["first"] for x, y in zip(e, l))
            loads = [float(r["loadavg"]) for r in e + l]
            fmt = lambda xs: ", ".join(f"{x:.2f}" for x in xs)
            print(f"| {mname} | {cname} (B={B}{f', T={T}, top-p {P}' if T else ''}) | **{med(er):.2f}** ({fmt(er)}) | **{med(lr):.2f}** ({fmt(lr)}) "
                  f"| **{med(er) / med(lr):.2f}** | {med(paired):.2f} ({min(paired):.2f}–{max(paired):.2f}) | {ecpu:.0f} / {lcpu:.0f} "
                  f"| {host} | {('same' if same else 'differ') if T == 0 else ('same' if same else 'differ') + ' (sampled: own RNGs)'} | {min(loads):.1f}–{max(loads):.1f} |")
    print()
    for mname, *_ in models:
        for cname, B, T, P in configs:
            e, b = results.get((mname, cname, "exo"), []), results.get((mname, cname, "exo-base"), [])
            if e and b:
                er, br = [r["tokens"] / r["seconds"] for r in e], [r["tokens"] / r["seconds"] for r in b]
                paired = [x / y for x, y in zip(er, br)]
                print(f"- {mname} {cname}: exo-base (TEST_BASE) {med(br):.2f} tok/s ({', '.join(f'{x:.2f}' for x in br)}), "
                      f"{med([per_tok(r, 'cpu_s') for r in b]):.0f} cpu-ms/tok, host {med([per_step(r, 'host_s') for r in b]):.2f} ms/step; "
                      f"exo / exo-base: ratio of medians {med(er) / med(br):.2f}, paired {med(paired):.2f} ({min(paired):.2f}–{max(paired):.2f})")
    for mname, *_ in models:
        for s in ("exo", base, "exo-serial", "exo-base"):
            shares = [tuple(r.get("thread_shares", [])) for c in configs for r in results.get((mname, c[0], s), [])]
            if shares:
                busy = med([len(x) for x in shares])
                print(f"- {mname} {s}: threads with >= 2 % of the CPU in a repetition: median {busy:g}; "
                      f"e.g. shares {list(shares[-1])}; cores busy (cpu/wall) median "
                      f"{med([r['cpu_s'] / r['seconds'] for c in configs for r in results.get((mname, c[0], s), [])]):.2f}")
    for mname, i in info.items():
        print(f"- {mname}: startup (load, write if absent, prefill) {i['startup_s']} s; threads exo/{base} at start "
              f"{i['threads']['exo']}/{i['threads'][base]}, after {i.get('threads_after', {}).get('exo', '?')}/"
              f"{i.get('threads_after', {}).get(base, '?')}")


if __name__ == "__main__":
    main()
