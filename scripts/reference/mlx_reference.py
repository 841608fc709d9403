#!/usr/bin/env python3
"""Reference numerics from mlx-lm (MLX CPU backend) for the test models.

Generates the reference set of tiny models with our Go generator, runs each
through mlx-lm, and writes runners/engine/testdata/reference/mlx_lm.json:
for every model (llama/qwen2/qwen3 × f32/bf16/4-bit) and each of the five
fixed prompts (token ids), the last-position logits (float32, base64) and
the greedy 32-token continuation (argmax with mlx-lm's KV cache, no stop
token), plus the smallest top-1/top-2 logit margin seen while decoding, and
the sha256 of model.safetensors so the Go test can check it regenerated the
very same weights.  runners/engine/reference_test.go checks the engine
against this file.

Run by hand (not in CI), from the repository root:
    pip install "mlx[cpu]" mlx-lm
    python3 scripts/reference/mlx_reference.py
    python3 scripts/reference/mlx_reference.py --sliding
The second form does the same for the sliding-window set (testmodel.SlidingSet:
Gemma 3 text models via mlx-lm's gemma3_text, prompts several windows long) and
writes runners/engine/testdata/reference/mlx_lm_sliding.json, which
runners/engine/reference_sliding_test.go checks.
"""
import base64, hashlib, importlib.metadata, json, os, subprocess, sys, tempfile

import numpy as np
import mlx.core as mx
from mlx_lm import load
from mlx_lm.models.cache import make_prompt_cache

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))
SLIDING = "--sliding" in sys.argv[1:]
OUT = os.path.join(ROOT, "runners", "engine", "testdata", "reference",
                   "mlx_lm_sliding.json" if SLIDING else "mlx_lm.json")
STEPS = 32


def last_logits(model, tokens, cache):
    out = model(mx.array([tokens]), cache=cache)
    return out[0, -1].astype(mx.float32)


def main():
    mx.set_default_device(mx.cpu)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(["go", "run", "./runners/engine/testmodel/cmd/gen",
                        "-sliding-reference" if SLIDING else "-reference", tmp],
                       cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
        prompts = json.load(open(os.path.join(tmp, "prompts.json")))
        names = sorted(d for d in os.listdir(tmp) if os.path.isdir(os.path.join(tmp, d)))
        models = []
        for name in names:
            path = os.path.join(tmp, name)
            sha = hashlib.sha256(open(os.path.join(path, "model.safetensors"), "rb").read()).hexdigest()
            model, _ = load(path)
            results = []
            for prompt in prompts:
                cache = make_prompt_cache(model)
                logits = last_logits(model, prompt, cache)
                first = np.array(logits, dtype=np.float32)
                greedy, margin = [], float("inf")
                for _ in range(STEPS):
                    v = np.array(logits, dtype=np.float32)
                    top2 = np.sort(v)[-2:]
                    margin = min(margin, float(top2[1] - top2[0]))
                    tok = int(np.argmax(v))
                    greedy.append(tok)
                    logits = last_logits(model, [tok], cache)
                results.append({
                    "logits_f32_b64": base64.b64encode(first.astype("<f4").tobytes()).decode(),
                    "greedy": greedy,
                    "min_margin": round(margin, 5),
                })
            models.append({"name": name, "safetensors_sha256": sha, "results": results})
            print(name, "greedy[0][:8] =", results[0]["greedy"][:8],
                  "min margins:", [r["min_margin"] for r in results], file=sys.stderr)
    doc = {
        "generator": "scripts/reference/mlx_reference.py",
        "mlx_version": importlib.metadata.version("mlx"),
        "mlx_lm_version": importlib.metadata.version("mlx-lm"),
        "device": str(mx.default_device()),
        "steps": STEPS,
        "prompts": prompts,
        "models": models,
    }
    with open(OUT, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print("wrote", os.path.relpath(OUT, ROOT))


if __name__ == "__main__":
    main()
