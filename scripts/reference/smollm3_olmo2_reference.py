#!/usr/bin/env python3
"""Tiny SmolLM3 and OLMo 2 models and mlx-lm's outputs on them.

Builds the models with mlx-lm's own smollm3 and olmo2 classes, random
weights from a fixed MLX seed (norm weights perturbed around 1), and writes
each under runners/engine/testdata/reference/<name>/ (config.json as a
Hugging Face checkpoint has it, model.safetensors in HF's layout, float32,
and the tokenizer files of our Go test models: the vocabulary of 512), with
<name>.json beside it: for each prompt (token ids; the long ones span
several prefill chunks of the Go test) the last-position logits (float32,
base64), the greedy 32-token continuation through mlx-lm's caches and each
greedy step's top-two gap. The same models quantized as mlx-lm's convert
does (mlx_lm.utils.quantize_model, save_model and save_config: 4-bit, group
64, every linear and embedding whose input width is a multiple of 64) are
<name>_q4/ with <name>_q4.json.

  smollm3: 6 layers, GQA (4 heads, 2 KV heads), tied embeddings. Its
    config gives both no_rope_layer_interval (3, which alone would mean
    RoPE in layers [1,1,0,1,1,0]) and an explicit no_rope_layers list
    [1,0,1,1,0,1] (1: RoPE, 0: none) that differs from it: HF and mlx-lm
    both follow the list.
  smollm3_q4: the same weights, its config without no_rope_layers, so the
    interval decides ([1,1,0,1,1,0]); then quantized.
  olmo2 / olmo2_q4: 4 layers, GQA (4 heads, 2 KV heads), untied lm_head,
    norms after attention and after the MLP (no pre-norms), q_norm and
    k_norm over the whole projection; intermediate 96, so down_proj stays
    unquantized in the q4 model (96 is no multiple of 64), as convert does.

At the end every directory is loaded back with mlx_lm.load and re-run; the
logits and greedy tokens must equal the ones written.

Run by hand (not in CI), from the repository root (needs go for the
tokenizer files):
    pip install "mlx[cpu]" mlx-lm
    python3 scripts/reference/smollm3_olmo2_reference.py
"""
import base64, contextlib, importlib.metadata, io, json, os, shutil, subprocess, sys, tempfile

import numpy as np
import mlx.core as mx
from mlx.utils import tree_flatten, tree_map_with_path
import mlx_lm
from mlx_lm.models import olmo2, smollm3
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.utils import quantize_model, save_config, save_model

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))
REF = os.path.join(ROOT, "runners", "engine", "testdata", "reference")
STEPS = 32

# As transformers 4.x writes a SmolLM3 config.json (SmolLM3-3B's keys).
SMOLLM3 = {
    "architectures": ["SmolLM3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 509,
    "eos_token_id": 511,
    "hidden_act": "silu",
    "hidden_size": 64,
    "initializer_range": 0.02,
    "intermediate_size": 128,
    "layer_types": ["full_attention"] * 6,
    "max_position_embeddings": 2048,
    "max_window_layers": 6,
    "mlp_bias": False,
    "model_type": "smollm3",
    "no_rope_layer_interval": 3,
    "no_rope_layers": [1, 0, 1, 1, 0, 1],
    "num_attention_heads": 4,
    "num_hidden_layers": 6,
    "num_key_value_heads": 2,
    "pad_token_id": 509,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 50000.0,
    "sliding_window": None,
    "tie_word_embeddings": True,
    "torch_dtype": "float32",
    "transformers_version": "4.54.0",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 512,
}

# As transformers 4.x writes an OLMo 2 config.json (OLMo-2-1124-7B's keys).
OLMO2 = {
    "architectures": ["Olmo2ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": None,
    "eos_token_id": 511,
    "hidden_act": "silu",
    "hidden_size": 64,
    "initializer_range": 0.02,
    "intermediate_size": 96,
    "max_position_embeddings": 2048,
    "model_type": "olmo2",
    "num_attention_heads": 4,
    "num_hidden_layers": 4,
    "num_key_value_heads": 2,
    "pad_token_id": 509,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 500000,
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
    "transformers_version": "4.47.0",
    "use_cache": True,
    "vocab_size": 512,
}


def prompts():
    r = np.random.default_rng(7)
    return [[509], [509, 300, 301, 302, 10, 84, 104, 101, 32, 109],
            [int(x) for x in r.integers(0, 509, 45)], [int(x) for x in r.integers(0, 509, 150)]]


# Weight scales on top of the random init, by parameter-name suffix. SmolLM3
# (tied, pre-norm): the embedding x4 spreads the logits; o_proj and down_proj
# x32 let the attention and MLP outweigh a token's own embedding in the
# residual (else the tied head repeats the input token), q/k x4 sharpen the
# attention so the greedy continuations do not settle on one token. OLMo 2
# (q/k normalized, no pre-norms): lm_head x8 spreads the logits.
SMOLLM3_SCALES = {"embed_tokens.weight": 4.0, "o_proj.weight": 32.0, "down_proj.weight": 32.0,
                  "q_proj.weight": 4.0, "k_proj.weight": 4.0}
OLMO2_SCALES = {"lm_head.weight": 8.0}
# The seeds (28, 22) are ones whose greedy top two stay >= 0.005 apart in
# every step of every prompt, float and q4, so the Go test can hold every
# greedy token.


def build(mod, config, seed, scales):
    mx.random.seed(seed)
    model = mod.Model(mod.ModelArgs.from_dict(config))
    def perturb(path, v):
        # Norm weights (ones at init) perturbed so that a misplaced norm shows.
        if path.endswith("norm.weight"):
            return v + 0.1 * mx.random.normal(v.shape)
        return v * scales.get(path.rsplit(".", 2)[-2] + ".weight", 1.0)
    model.update(tree_map_with_path(perturb, model.parameters()))
    mx.eval(model.parameters())
    return model


def quantized(mod, config, params):
    """A fresh model of config holding params, quantized as mlx-lm's convert does."""
    model = mod.Model(mod.ModelArgs.from_dict(config))
    model.update(params)
    with contextlib.redirect_stdout(io.StringIO()):  # its bits-per-weight line
        model, qcfg = quantize_model(model, config, group_size=64, bits=4)
    mx.eval(model.parameters())
    return model, qcfg


def main():
    mx.set_default_device(mx.cpu)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(["go", "run", "./runners/engine/testmodel/cmd/gen", "-arch", "qwen3", os.path.join(tmp, "m")],
                       cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
        tok = {f: open(os.path.join(tmp, "m", f), "rb").read()
               for f in ["tokenizer.json", "tokenizer_config.json", "generation_config.json"]}
    written = []

    s = build(smollm3, SMOLLM3, 28, SMOLLM3_SCALES)
    assert [not isinstance(l.self_attn.rope, smollm3.NoPE) for l in s.layers] == [bool(x) for x in SMOLLM3["no_rope_layers"]]
    written.append(write_hf(s, "smollm3", SMOLLM3, tok))
    interval = {k: v for k, v in SMOLLM3.items() if k != "no_rope_layers"}
    sq, qcfg = quantized(smollm3, interval, s.parameters())
    assert [not isinstance(l.self_attn.rope, smollm3.NoPE) for l in sq.layers] == [True, True, False, True, True, False]
    written.append(write_mlx(sq, "smollm3_q4", qcfg, tok))

    o = build(olmo2, OLMO2, 22, OLMO2_SCALES)
    written.append(write_hf(o, "olmo2", OLMO2, tok))
    oq, qcfg = quantized(olmo2, OLMO2, o.parameters())
    written.append(write_mlx(oq, "olmo2_q4", qcfg, tok))

    for name in written:
        verify(name)


def fresh_dir(name, tok):
    d = os.path.join(REF, name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    for f, raw in tok.items():
        open(os.path.join(d, f), "wb").write(raw)
    return d


def write_hf(model, name, config, tok):
    """HF's layout: the parameter names mlx-lm's classes use are HF's (no
    lm_head when tied), float32, the "pt" format tag save_pretrained writes."""
    d = fresh_dir(name, tok)
    weights = dict(tree_flatten(model.parameters()))
    assert all(k.startswith("model.") or k == "lm_head.weight" for k in weights)
    mx.save_safetensors(os.path.join(d, "model.safetensors"), weights, metadata={"format": "pt"})
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    return record(model, name)


def write_mlx(model, name, config, tok):
    """What mlx-lm's convert writes: model.safetensors with its index,
    config.json sorted with quantization and quantization_config."""
    d = fresh_dir(name, tok)
    save_model(d, model)
    save_config(dict(config), os.path.join(d, "config.json"))
    return record(model, name)


def run(model, p):
    """Last-position logits of prompt p and the greedy continuation with each step's top-two gap."""
    cache = make_prompt_cache(model)
    logits = model(mx.array([p]), cache=cache)[0, -1].astype(mx.float32)
    first = np.array(logits, dtype=np.float32)
    greedy, steps = [], []
    for _ in range(STEPS):
        v = np.array(logits, dtype=np.float32)
        top2 = np.sort(v)[-2:]
        steps.append(round(float(top2[1] - top2[0]), 5))
        tok_id = int(np.argmax(v))
        greedy.append(tok_id)
        logits = model(mx.array([[tok_id]]), cache=cache)[0, -1].astype(mx.float32)
    return first, greedy, steps


def record(model, name):
    results = []
    for p in prompts():
        first, greedy, steps = run(model, p)
        results.append({"tokens": p, "logits_f32_b64": base64.b64encode(first.astype("<f4").tobytes()).decode(),
                        "greedy": greedy, "min_margin": min(steps), "margins": steps})
        print(name, len(p), "tokens: greedy[:8]", greedy[:8], "min margin", min(steps), file=sys.stderr)
    out = os.path.join(REF, name + ".json")
    with open(out, "w") as f:
        json.dump({"generator": "scripts/reference/smollm3_olmo2_reference.py",
                   "mlx_version": importlib.metadata.version("mlx"),
                   "mlx_lm_version": importlib.metadata.version("mlx-lm"),
                   "device": "cpu", "steps": STEPS, "prompts": results}, f, indent=1)
        f.write("\n")
    print("wrote", os.path.relpath(out, ROOT), file=sys.stderr)
    return name


def verify(name):
    """The directory, loaded the way mlx-lm loads a checkpoint, gives the recorded outputs."""
    model, _ = mlx_lm.load(os.path.join(REF, name))
    fx = json.load(open(os.path.join(REF, name + ".json")))
    for rec in fx["prompts"]:
        first, greedy, _ = run(model, rec["tokens"])
        want = np.frombuffer(base64.b64decode(rec["logits_f32_b64"]), dtype="<f4")
        diff = float(np.max(np.abs(first - want)))
        if diff > 1e-5 or greedy != rec["greedy"]:
            sys.exit(f"{name}: reloaded model differs (max |logit diff| {diff}, greedy {greedy} vs {rec['greedy']})")
    print("verified", name, "through mlx_lm.load", file=sys.stderr)


if __name__ == "__main__":
    main()
