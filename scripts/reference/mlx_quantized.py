#!/usr/bin/env python3
"""Models quantized by MLX itself (mlx_lm.convert), committed as fixtures.

testmodel writes MLX-format quantized weights with our own Go quantizer;
this script checks the other direction: a small f32 llama test model
(testmodel.Spec{Arch: "llama", Seed: 5, Layers: 1, Hidden: 64, Heads: 2,
KVHeads: 1, Intermediate: 128, Vocab: 320}) is quantized by
mlx_lm.convert (4-bit group 32, and 8-bit group 64 from a bf16 copy) and the
resulting directories (config.json with mlx-lm's quantization block,
model.safetensors, tokenizer files) are copied to
runners/engine/testdata/reference/mlx_quantized/<name>/, together with
mlx-lm's last-position logits and 32 greedy tokens for five prompts in
runners/engine/testdata/reference/mlx_quantized.json.

Run by hand (not in CI), from the repository root:
    pip install "mlx[cpu]" mlx-lm
    python3 scripts/reference/mlx_quantized.py
"""
import base64, importlib.metadata, json, os, shutil, subprocess, tempfile

import numpy as np
import mlx.core as mx
from mlx_lm import convert, load
from mlx_lm.models.cache import make_prompt_cache

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))
REF = os.path.join(ROOT, "runners", "engine", "testdata", "reference")
SPEC = ["-arch", "llama", "-seed", "5", "-layers", "1", "-hidden", "64", "-heads", "2",
        "-kv-heads", "1", "-intermediate", "128", "-vocab", "320"]
VARIANTS = [("llama-mlx-q4g32", "f32", 4, 32), ("llama-mlx-q8g64-bf16", "bf16", 8, 64)]
PROMPTS = [[317], [318, 300, 301, 302, 10, 84, 104, 101, 32, 109], list(range(1, 21)),
           [104, 101, 108, 108, 111, 32, 119, 111, 114, 108, 100, 33, 32, 72, 111, 119],
           [256, 257, 258, 259, 260, 261, 262, 263, 0, 255, 128, 64, 319]]
STEPS = 32
KEEP = ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]


def run(model, prompt):
    cache = make_prompt_cache(model)
    logits = model(mx.array([prompt]), cache=cache)[0, -1].astype(mx.float32)
    first = np.array(logits, dtype=np.float32)
    greedy = []
    for _ in range(STEPS):
        tok = int(np.argmax(np.array(logits, dtype=np.float32)))
        greedy.append(tok)
        logits = model(mx.array([[tok]]), cache=cache)[0, -1].astype(mx.float32)
    return first, greedy


def main():
    mx.set_default_device(mx.cpu)
    out = {"generator": "scripts/reference/mlx_quantized.py",
           "mlx_version": importlib.metadata.version("mlx"),
           "mlx_lm_version": importlib.metadata.version("mlx-lm"),
           "steps": STEPS, "prompts": PROMPTS, "models": []}
    with tempfile.TemporaryDirectory() as tmp:
        for name, dtype, bits, group in VARIANTS:
            src = os.path.join(tmp, name + "-src")
            subprocess.run(["go", "run", "./runners/engine/testmodel/cmd/gen", *SPEC, "-dtype", dtype, src],
                           cwd=ROOT, check=True)
            q = os.path.join(tmp, name)
            convert(src, mlx_path=q, quantize=True, q_group_size=group, q_bits=bits)
            dst = os.path.join(REF, "mlx_quantized", name)
            shutil.rmtree(dst, ignore_errors=True)
            os.makedirs(dst)
            for f in KEEP:
                shutil.copy(os.path.join(q, f), os.path.join(dst, f))
            model, _ = load(dst)
            results = []
            for p in PROMPTS:
                first, greedy = run(model, p)
                results.append({"logits_f32_b64": base64.b64encode(first.astype("<f4").tobytes()).decode(),
                                "greedy": greedy})
            out["models"].append({"name": name, "bits": bits, "group_size": group, "dtype": dtype,
                                  "results": results})
            print(name, "greedy[0][:8] =", results[0]["greedy"][:8])
    with open(os.path.join(REF, "mlx_quantized.json"), "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
