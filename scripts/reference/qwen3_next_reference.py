#!/usr/bin/env python3
"""A tiny Qwen3-Next (Gated DeltaNet hybrid) model and mlx-lm's outputs on it.

Builds the model with mlx-lm's own qwen3_next classes (4 layers with a full
attention layer every 2nd: two full-attention intervals; layer 0 a dense
MLP, the others routed experts with a shared expert), random weights from a
fixed MLX seed (norm weights perturbed around 1), and writes, under
runners/engine/testdata/reference/qwen3_next/: config.json,
model.safetensors (mlx-lm's layout, as mlx-community ships it: stacked
switch_mlp experts, conv1d [C, K, 1]) and the tokenizer files of our Go
test models (the vocabulary of 512), then qwen3_next.json beside it; and
the same model quantized as mlx-lm's convert does (4-bit, group 64, the
router and shared-expert gate at 8 bits, float32 scales) under
qwen3_next_q4/ with qwen3_next_q4.json; and Qwen3.5 built with mlx-lm's
qwen3_5 and qwen3_5_moe classes (the text model under text_config, separate
q/k/v, z, b, a projections, weights under language_model.*) as qwen3_5/ and
qwen3_5_moe/, and the dense one's weights cast to bfloat16 as qwen3_5_bf16/. Each fixture holds, for
each prompt (token ids; the long ones span several prefill chunks of the
Go test), the last-position logits (float32, base64) and the greedy
32-token continuation through mlx-lm's caches.

Run by hand (not in CI), from the repository root:
    pip install "mlx[cpu]" mlx-lm
    python3 scripts/reference/qwen3_next_reference.py
"""
import base64, importlib.metadata, json, os, shutil, subprocess, sys, tempfile

import numpy as np
import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_map_with_path
from mlx_lm.models import qwen3_5, qwen3_5_moe, qwen3_next
from mlx_lm.models.cache import make_prompt_cache

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))
REF = os.path.join(ROOT, "runners", "engine", "testdata", "reference")
STEPS = 32

CONFIG = {
    "architectures": ["Qwen3NextForCausalLM"],
    "model_type": "qwen3_next",
    "hidden_size": 64,
    "num_hidden_layers": 4,
    "intermediate_size": 96,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "linear_num_value_heads": 4,
    "linear_num_key_heads": 2,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "linear_conv_kernel_dim": 4,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "decoder_sparse_step": 1,
    "shared_expert_intermediate_size": 48,
    "mlp_only_layers": [0],
    "moe_intermediate_size": 32,
    "norm_topk_prob": True,
    "rms_norm_eps": 1e-6,
    "vocab_size": 512,
    "rope_theta": 10000.0,
    "partial_rotary_factor": 0.25,
    "max_position_embeddings": 2048,
    "full_attention_interval": 2,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "torch_dtype": "float32",
    "bos_token_id": 509,
    "eos_token_id": 511,
}


def prompts():
    r = np.random.default_rng(7)
    return [[509], [509, 300, 301, 302, 10, 84, 104, 101, 32, 109],
            [int(x) for x in r.integers(0, 509, 45)], [int(x) for x in r.integers(0, 509, 150)]]


def main():
    mx.set_default_device(mx.cpu)
    mx.random.seed(11)
    args = qwen3_next.ModelArgs.from_dict(CONFIG)
    model = qwen3_next.Model(args)
    # Norm weights (ones at init) perturbed so that a misplaced norm shows.
    def perturb(path, v):
        if path.endswith("norm.weight"):
            return v + 0.1 * mx.random.normal(v.shape)
        if path.endswith("lm_head.weight"):
            return v * 4.0  # logits spread enough for a stable greedy
        return v
    model.update(tree_map_with_path(perturb, model.parameters()))
    mx.eval(model.parameters())
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(["go", "run", "./runners/engine/testmodel/cmd/gen", "-arch", "qwen3", os.path.join(tmp, "m")],
                       cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
        tok = {f: open(os.path.join(tmp, "m", f), "rb").read()
               for f in ["tokenizer.json", "tokenizer_config.json", "generation_config.json"]}
    write(model, "qwen3_next", CONFIG, tok)
    # mlx-lm's convert: 4-bit where the input width is a multiple of the
    # group, the model's quant_predicate (routers, shared-expert gates at 8).
    pred = model.quant_predicate
    def class_predicate(path, m):
        if not hasattr(m, "to_quantized") or m.weight.shape[-1] % 64 != 0:
            return False
        return pred(path, m)
    nn.quantize(model, group_size=64, bits=4, class_predicate=class_predicate)
    qcfg = dict(CONFIG)
    q = {"group_size": 64, "bits": 4}
    for path, _ in tree_flatten(model.leaf_modules(), is_leaf=nn.Module.is_module):
        if path.endswith("mlp.gate") or path.endswith("shared_expert_gate"):
            q[path] = {"group_size": 64, "bits": 8}
    qcfg["quantization"] = q
    write(model, "qwen3_next_q4", qcfg, tok)

    for name, mod, arch, moe in [("qwen3_5", qwen3_5, "Qwen3_5ForConditionalGeneration", False),
                                 ("qwen3_5_moe", qwen3_5_moe, "Qwen3_5MoeForConditionalGeneration", True)]:
        text = {k: v for k, v in CONFIG.items() if k not in ("architectures", "model_type", "partial_rotary_factor",
                                                               "rope_theta", "mlp_only_layers", "torch_dtype",
                                                               "bos_token_id", "eos_token_id")}
        text["model_type"] = name + "_text"
        text["rope_parameters"] = {"type": "default", "mrope_section": [2, 1, 1], "rope_theta": 10000.0,
                                   "partial_rotary_factor": 0.25}
        if not moe:
            for k in ("num_experts", "num_experts_per_tok", "decoder_sparse_step", "shared_expert_intermediate_size",
                      "moe_intermediate_size", "norm_topk_prob"):
                text.pop(k)
        cfg = {"architectures": [arch], "model_type": name, "text_config": text, "tie_word_embeddings": False,
               "torch_dtype": "float32", "bos_token_id": 509, "eos_token_id": 511}
        mx.random.seed(12)
        m = mod.Model(mod.ModelArgs.from_dict(cfg))
        m.update(tree_map_with_path(perturb, m.parameters()))
        mx.eval(m.parameters())
        write(m, name, cfg, tok)
        if not moe:
            # The same weights in bfloat16, as an mlx-community bf16
            # checkpoint: mlx-lm computes in bfloat16, the recurrent state
            # and the gates in float32 (mlx-lm >= 0.32; 0.31 kept the state
            # in bf16). Dense only: MLX's CPU GatherMM is float32-only.
            bf = mod.Model(mod.ModelArgs.from_dict(cfg))
            bf.update(m.parameters())
            bf.set_dtype(mx.bfloat16)
            mx.eval(bf.parameters())
            write(bf, name + "_bf16", dict(cfg, torch_dtype="bfloat16"), tok, margins=True)


def write(model, name, config, tok, margins=False):
    d = os.path.join(REF, name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    for f, raw in tok.items():
        open(os.path.join(d, f), "wb").write(raw)
    weights = dict(tree_flatten(model.parameters()))
    mx.save_safetensors(os.path.join(d, "model.safetensors"), weights, metadata={"format": "mlx"})
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
        f.write("\n")
    results = []
    for p in prompts():
        cache = model.make_cache()
        logits = model(mx.array([p]), cache=cache)[0, -1].astype(mx.float32)
        first = np.array(logits, dtype=np.float32)
        greedy, margin, steps = [], float("inf"), []
        for _ in range(STEPS):
            v = np.array(logits, dtype=np.float32)
            top2 = np.sort(v)[-2:]
            margin = min(margin, float(top2[1] - top2[0]))
            steps.append(round(float(top2[1] - top2[0]), 5))
            tok_id = int(np.argmax(v))
            greedy.append(tok_id)
            logits = model(mx.array([[tok_id]]), cache=cache)[0, -1].astype(mx.float32)
        results.append({"tokens": p, "logits_f32_b64": base64.b64encode(first.astype("<f4").tobytes()).decode(),
                        "greedy": greedy, "min_margin": round(margin, 5)})
        if margins:  # each greedy step's top-two gap
            results[-1]["margins"] = steps
        print(name, len(p), "tokens: greedy[:8]", greedy[:8], "min margin", round(margin, 5), file=sys.stderr)
    out = os.path.join(REF, name + ".json")
    with open(out, "w") as f:
        json.dump({"generator": "scripts/reference/qwen3_next_reference.py",
                   "mlx_version": importlib.metadata.version("mlx"),
                   "mlx_lm_version": importlib.metadata.version("mlx-lm"),
                   "device": "cpu", "steps": STEPS, "prompts": results}, f, indent=1)
        f.write("\n")
    print("wrote", os.path.relpath(out, ROOT))

if __name__ == "__main__":
    main()
