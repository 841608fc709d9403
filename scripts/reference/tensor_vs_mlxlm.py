"""Decode tok/s on MLX's CPU device, 2 tensor-parallel ranks over MLX's ring on
loopback: exo's runners (`exo runner decode --backend mlx --device cpu
--tensor I/2`) against mlx-lm's own Model.shard() path
(scripts/reference/mlxlm_tensor_rank.py), alternating in one run so both see
the same machine load. Both must run on the same libmlx: mlx-c linked to the
libmlx.so of the venv's mlx wheel (compare their sha256). Run by hand from the
repository root with the venv's python:

  EXO=/tmp/exo EXO_MLXC_PATH=/path/libmlxc.so \
    /venv/bin/python scripts/reference/tensor_vs_mlxlm.py MODEL_DIR [ROUNDS] [DECODE]

MODEL_DIR: a Llama model both can load whose head counts divide by 2 (e.g. one
written by runners/engine/testmodel). exo's rate is read from a streamed
/v1/completions (greedy, ignore_eos, the same 32 prompt token ids as the
mlx-lm side): DECODE tokens over the time from the first streamed token to the
last, after one untimed request. WHOLE=1 runs one process a side instead.

PIPELINE=1 compares 2 pipeline stages instead (the first half of the layers
on stage 0): exo's stages (`--layers --stage I/2 --stage-listen
--stage-next`, hidden states over MLX's ring) against mlx-lm's own pipeline
(`sharded_load` with a pipeline group; its ranks started with MLX_RANK and
an MLX_HOSTFILE of one loopback address per rank, as `mlx.launch --backend
ring` starts them, or with LAUNCH=mlx.launch by `mlx.launch --backend ring
-n 2` itself). mlx-lm 0.31.1 pipelines only the models with a `pipeline()`
(DeepSeek V2/V3, GLM-4 MoE, Ministral 3): give it a Llama model seen as
Ministral 3 with a zero attention-scale beta, which is exactly Llama
(scripts/reference/mlxlm_pipeline_view.py SRC OUT; exo reads the unchanged
architectures)."""
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request

model, rounds, decode = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 2, int(sys.argv[3]) if len(sys.argv) > 3 else 64
exo = os.environ.get("EXO", "exo")
here = os.path.dirname(os.path.abspath(__file__))
prompt = [(i * 37 + 11) % 500 for i in range(32)]
REPS = 3
# WHOLE=1: one process each side, the whole model (the same comparison
# without tensor parallelism, to tell the split's cost from the rest).
WHOLE = os.environ.get("WHOLE") == "1"
PIPELINE = os.environ.get("PIPELINE") == "1"
LAYERS = json.load(open(os.path.join(model, "config.json")))["num_hidden_layers"]


def exo_round():
    peers = "127.0.0.1:18410,127.0.0.1:18420"
    procs, logs = [], []
    for r in ((0,) if WHOLE else (1, 0)):
        log = tempfile.NamedTemporaryFile(prefix=f"exo-rank{r}-", suffix=".log", delete=False)
        logs.append(log.name)
        tensor = [] if WHOLE else ["--tensor", f"{r}/2", "--tensor-peers", peers]
        if PIPELINE:  # stage r listens on 184r0 (its MLX ring on 184r1)
            cut = LAYERS // 2
            tensor = ["--layers", f"0:{cut}" if r == 0 else f"{cut}:{LAYERS}", "--stage", f"{r}/2",
                      "--stage-listen", f"127.0.0.1:184{r + 1}0", "--stage-next", f"127.0.0.1:184{2 - r}0"]
        procs.append(subprocess.Popen([exo, "runner", "decode", "--backend", "mlx", "--device", "cpu", "--offline",
                                       "--served-name", "m", "--model", model, "--listen", f"127.0.0.1:1840{r}",
                                       "--max-batch", "1"] + tensor,
                                      stdout=log, stderr=subprocess.STDOUT))
    try:
        for _ in range(600):
            try:
                if urllib.request.urlopen("http://127.0.0.1:18400/health", timeout=2).status == 200:
                    break
            except Exception:
                pass
            if any(p.poll() is not None for p in procs):
                raise SystemExit("an exo rank exited; logs: " + " ".join(logs))
            time.sleep(0.5)
        else:
            raise SystemExit("exo ranks not healthy; logs: " + " ".join(logs))
        rates = []
        if PIPELINE:
            # A random model's tokens past the test tokenizer's vocabulary
            # stream no text: the decode rate is DECODE tokens over the
            # time a request of DECODE + 1 tokens takes beyond one of 1.
            def took(n):
                body = json.dumps({"model": "m", "prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": True}).encode()
                req = urllib.request.Request("http://127.0.0.1:18400/v1/completions", body, {"content-type": "application/json"})
                t0 = time.perf_counter()
                with urllib.request.urlopen(req, timeout=600) as resp:
                    if json.load(resp)["usage"]["completion_tokens"] != n:
                        raise SystemExit("exo: short completion")
                return time.perf_counter() - t0
            took(decode + 1)  # warm-up
            for rep in range(REPS):
                one, full = took(1), took(decode + 1)
                rates.append(decode / (full - one))
            return rates
        for rep in range(REPS + 1):
            body = json.dumps({"model": "m", "prompt": prompt, "max_tokens": decode + 1, "temperature": 0,
                               "ignore_eos": True, "stream": True}).encode()
            req = urllib.request.Request("http://127.0.0.1:18400/v1/completions", body, {"content-type": "application/json"})
            times = []
            with urllib.request.urlopen(req, timeout=600) as resp:
                for line in resp:
                    line = line.strip()
                    if not line.startswith(b"data:") or line == b"data: [DONE]":
                        continue
                    d = json.loads(line[5:])
                    if d.get("choices") and d["choices"][0].get("text"):
                        times.append(time.perf_counter())
            if rep > 0:
                rates.append((len(times) - 1) / (times[-1] - times[0]))
        return rates
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait()


def lm_round():
    if PIPELINE and os.environ.get("LAUNCH") == "mlx.launch":
        out = subprocess.run([os.path.join(os.path.dirname(sys.executable), "mlx.launch"), "--backend", "ring", "-n", "2",
                              "--hosts", "127.0.0.1", "--starting-port", "18430", "--connections-per-ip", "1",
                              os.path.join(here, "mlxlm_tensor_rank.py"), model, str(decode), str(REPS), "pipeline"],
                             stdout=subprocess.PIPE, text=True, check=True).stdout
        return json.loads([l for l in out.splitlines() if "decode_tok_s" in l][-1])["decode_tok_s"]
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump([["127.0.0.1:18430"], ["127.0.0.1:18431"]], f)
    procs = []
    for r in ((0,) if WHOLE else (1, 0)):
        env = dict(os.environ, MLX_RANK=str(r), MLX_HOSTFILE=f.name)
        if WHOLE:
            env.pop("MLX_RANK")
        procs.append(subprocess.Popen([sys.executable, os.path.join(here, "mlxlm_tensor_rank.py"), model, str(decode), str(REPS)]
                                      + (["pipeline"] if PIPELINE else []),
                                      env=env, stdout=subprocess.PIPE, text=True))
    out = [p.communicate()[0] for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit("an mlx-lm rank failed")
    return json.loads(out[-1].strip().splitlines()[-1])["decode_tok_s"]


def med(xs):
    return sorted(xs)[len(xs) // 2]


for rnd in range(1, rounds + 1):
    load = open("/proc/loadavg").read().split()[0]
    order = [("mlx-lm", lm_round), ("exo", exo_round)] if rnd % 2 else [("exo", exo_round), ("mlx-lm", lm_round)]
    res = {}
    for name, fn in order:
        res[name] = fn()
        print(f"round {rnd} ({time.strftime('%H:%M:%S')}, load {load}) {name}: decode tok/s {[round(x, 1) for x in res[name]]}", flush=True)
    print(f"round {rnd}: exo / mlx-lm (medians) = {med(res['exo']) / med(res['mlx-lm']):.3f}", flush=True)
