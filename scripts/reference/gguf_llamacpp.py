#!/usr/bin/env python3
"""Windowed and hybrid architectures as GGUF, with llama.cpp as the reference.

For each architecture (gemma3, gptoss, qwen3next, qwen35, qwen35moe) this
takes a tiny model (made by our Go generator, testmodel; drawn here for
Qwen3-Next; the mlx-lm-checked fixtures under runners/engine/testdata/
reference for Qwen3.5), writes it as a GGUF in the layout llama.cpp's
converter gives that architecture (tensor names and metadata keys from
gguf-py's constants; the per-architecture transforms are stated where they
are done; this script is ours), has llama.cpp quantize it where asked
(llama_model_quantize), and runs llama.cpp on prompts several sliding
windows (or prefill chunks) long: logits at the last position, and a
32-token greedy continuation. Writes under
runners/engine/testdata/reference/gguf/:

  <arch>_<type>.gguf          the model llama.cpp ran
  <arch>_llamacpp.json        per file and prompt: tokens, last-position
                              logits (float32, base64), greedy continuation;
                              for quantized files also llama.cpp's results on
                              the same weights dequantized to f32

runners/engine/reference_gguf_test.go checks the engine against them. For
Qwen3.5 it also prints (and records) llama.cpp on the f32 GGUF against
mlx-lm's recorded outputs for the same model: a check of this layout.

Run by hand (not in CI), from the repository root:
    pip install gguf numpy safetensors llama-cpp-python   # 0.3.36 was used
    python3 scripts/reference/gguf_llamacpp.py [gemma3 gptoss qwen3next qwen35 qwen35moe]
"""
import base64, ctypes, json, os, shutil, subprocess, sys, tempfile

import numpy as np
import gguf
import llama_cpp
from llama_cpp import Llama
from safetensors.numpy import load_file

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))
OUT = os.path.join(ROOT, "runners", "engine", "testdata", "reference", "gguf")
GEN = ["go", "run", "./runners/engine/testmodel/cmd/gen"]
VOCAB = 300
GREEDY = 32


def prompts():
    # One shorter than the window (8), the others 3 and 5 windows long (for
    # Qwen3-Next: several of the Go test's 5-token prefill chunks).
    out = [[297, 200, 201, 202, 10, 84]]
    for n, a in ((24, 37), (40, 53)):
        out.append([(i * a + 11) % 290 for i in range(n)])
    return out


# Per architecture: generator flags, the GGUF writer, and the llama.cpp
# quantizations written besides f32.
MODELS = {
    # Gemma 3 as the converter writes it: no sliding_window_pattern key
    # (llama.cpp's default 6: layer 5 global), so 6 layers; tied embeddings.
    "gemma3": dict(gen=["-arch", "gemma3", "-layers", "6", "-pattern", "6", "-hidden", "32", "-heads", "2",
                        "-kv-heads", "1", "-head-dim", "16", "-intermediate", "64", "-vocab", str(VOCAB),
                        "-tied", "-seed", "21"],
                   quant={"q8_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0, "q4_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0}),
    # gpt-oss: dense f32 experts (the converter's non-MXFP4 path), and the
    # same shapes with MXFP4 experts as the released checkpoints have
    # (repacked into ggml's MXFP4 blocks, the rest f32). No quantization by
    # llama.cpp: its MXFP4 ftype is what the second file already is.
    "gptoss": dict(gen=["-arch", "gptoss", "-layers", "4", "-hidden", "32", "-heads", "2", "-kv-heads", "1",
                        "-head-dim", "16", "-experts", "4", "-moe-intermediate", "32", "-vocab", str(VOCAB),
                        "-seed", "31"],
                   variants={"mxfp4": ["-mxfp4"]}),
    # Qwen3-Next: our generator has no qwen3_next, so the weights are drawn
    # here (numpy, fixed seed) in mlx-lm's layout; the tokenizer files come
    # from the generator. Every layer sparse with a shared expert (llama.cpp's
    # qwen3next has no dense layers), a full-attention layer every 2nd
    # (two intervals), 2 value heads per key head.
    "qwen3next": dict(gen=["-arch", "qwen3", "-vocab", str(VOCAB), "-seed", "41"], make=lambda d: make_qwen3next(d),
                      quant={"q8_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0}),
}

# Qwen3.5 (dense and MoE): the mlx-lm-checked fixtures of
# scripts/reference/qwen3_next_reference.py (2 key heads, 4 value heads, so
# that the converter's reordering of value heads matters), written in the
# converter's layout. Only llama.cpp's Q4_0 of each is kept (llama.cpp's run
# on its dequantized weights is the strict reference); the f32 GGUF is not,
# its safetensors being in the repository.
MODELS["qwen35"] = dict(src="qwen3_5", quant={"q4_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0}, keep_f32=False)
MODELS["qwen35moe"] = dict(src="qwen3_5_moe", quant={"q4_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0}, keep_f32=False)

QWEN3NEXT = {
    "architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next",
    "hidden_size": 32, "num_hidden_layers": 4, "intermediate_size": 64, "num_attention_heads": 2,
    "num_key_value_heads": 1, "head_dim": 16, "linear_num_value_heads": 2, "linear_num_key_heads": 1,
    "linear_key_head_dim": 16, "linear_value_head_dim": 16, "linear_conv_kernel_dim": 4, "num_experts": 4,
    "num_experts_per_tok": 2, "decoder_sparse_step": 1, "shared_expert_intermediate_size": 32, "mlp_only_layers": [],
    "moe_intermediate_size": 32, "norm_topk_prob": True, "rms_norm_eps": 1e-6, "vocab_size": VOCAB,
    "rope_theta": 10000.0, "partial_rotary_factor": 0.25, "max_position_embeddings": 512,
    "full_attention_interval": 2, "tie_word_embeddings": False, "attention_bias": False, "torch_dtype": "float32",
}


def make_qwen3next(d):
    """Replaces the generator's model in directory d by a Qwen3-Next of
    QWEN3NEXT's shape, weights drawn in mlx-lm's layout: in_proj_qkvz and
    in_proj_ba grouped per key head as HF has them, conv1d [C, K, 1],
    stacked switch_mlp experts, norm weights as multipliers (around 1)."""
    from safetensors.numpy import save_file
    c = dict(QWEN3NEXT)
    old = json.load(open(os.path.join(d, "config.json")))
    c["bos_token_id"], c["eos_token_id"] = old["bos_token_id"], old["eos_token_id"]
    json.dump(c, open(os.path.join(d, "config.json"), "w"), indent=1)
    rng = np.random.default_rng(41)
    t = {}

    def lin(name, out, inp, scale=1.0):
        t[name + ".weight"] = (rng.standard_normal((out, inp)) * scale / np.sqrt(inp)).astype(np.float32)

    def norm(name, n):
        t[name] = (1 + 0.1 * rng.standard_normal(n)).astype(np.float32)
    D, V, H, Hkv, hd = c["hidden_size"], VOCAB, c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    Hk, Hv, Dk, Dv, K = (c["linear_num_key_heads"], c["linear_num_value_heads"], c["linear_key_head_dim"],
                         c["linear_value_head_dim"], c["linear_conv_kernel_dim"])
    E, F, Fs = c["num_experts"], c["moe_intermediate_size"], c["shared_expert_intermediate_size"]
    t["model.embed_tokens.weight"] = rng.standard_normal((V, D)).astype(np.float32)
    lin("lm_head", V, D, 4)
    norm("model.norm.weight", D)
    for l in range(c["num_hidden_layers"]):
        p = "model.layers.%d." % l
        norm(p + "input_layernorm.weight", D)
        norm(p + "post_attention_layernorm.weight", D)
        if (l + 1) % c["full_attention_interval"] == 0:
            lin(p + "self_attn.q_proj", 2 * H * hd, D)
            lin(p + "self_attn.k_proj", Hkv * hd, D)
            lin(p + "self_attn.v_proj", Hkv * hd, D)
            lin(p + "self_attn.o_proj", D, H * hd)
            norm(p + "self_attn.q_norm.weight", hd)
            norm(p + "self_attn.k_norm.weight", hd)
        else:
            a = p + "linear_attn."
            lin(a + "in_proj_qkvz", 2 * Hk * Dk + 2 * Hv * Dv, D)
            lin(a + "in_proj_ba", 2 * Hv, D, 2)
            lin(a + "out_proj", D, Hv * Dv)
            t[a + "conv1d.weight"] = (rng.standard_normal((2 * Hk * Dk + Hv * Dv, K, 1)) * 0.5).astype(np.float32)
            t[a + "A_log"] = np.log(rng.uniform(1, 16, Hv)).astype(np.float32)
            t[a + "dt_bias"] = (0.5 * rng.standard_normal(Hv)).astype(np.float32)
            norm(a + "norm.weight", Dv)
        m = p + "mlp."
        lin(m + "gate", E, D, 2)
        t[m + "switch_mlp.gate_proj.weight"] = (rng.standard_normal((E, F, D)) / np.sqrt(D)).astype(np.float32)
        t[m + "switch_mlp.up_proj.weight"] = (rng.standard_normal((E, F, D)) / np.sqrt(D)).astype(np.float32)
        t[m + "switch_mlp.down_proj.weight"] = (rng.standard_normal((E, D, F)) / np.sqrt(F)).astype(np.float32)
        lin(m + "shared_expert.gate_proj", Fs, D)
        lin(m + "shared_expert.up_proj", Fs, D)
        lin(m + "shared_expert.down_proj", D, Fs)
        lin(m + "shared_expert_gate", 1, D, 2)
    save_file(t, os.path.join(d, "model.safetensors"), {"format": "mlx"})


def vocab_keys(w, src, cfg):
    tj = json.load(open(os.path.join(src, "tokenizer.json")))
    vocab = dict(tj["model"]["vocab"])
    for a in tj["added_tokens"]:
        vocab[a["content"]] = a["id"]
    toks = [None] * (max(vocab.values()) + 1)
    for k, v in vocab.items():
        toks[v] = k
    special = {a["id"] for a in tj["added_tokens"]}
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(toks)
    w.add_token_types([gguf.TokenType.CONTROL if i in special else gguf.TokenType.NORMAL for i in range(len(toks))])
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]])
    w.add_bos_token_id(cfg["bos_token_id"])
    w.add_eos_token_id(cfg["eos_token_id"])


def f32(w, name, arr):
    w.add_tensor(name, np.ascontiguousarray(np.asarray(arr, dtype=np.float32)))


def write_gemma3(src, dst):
    cfg = json.load(open(os.path.join(src, "config.json")))
    t = load_file(os.path.join(src, "model.safetensors"))
    w = gguf.GGUFWriter(dst, "gemma3")
    n = cfg["num_hidden_layers"]
    w.add_block_count(n)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_key_length(cfg["head_dim"])
    w.add_value_length(cfg["head_dim"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_rope_freq_base(cfg["rope_theta"])  # the global layers' base
    w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
    w.add_rope_scaling_factor(cfg["rope_scaling"]["factor"])
    w.add_sliding_window(cfg["sliding_window"])
    assert cfg["sliding_window_pattern"] == 6 and cfg["rope_local_base_freq"] == 10000
    vocab_keys(w, src, cfg)
    # Gemma's RMSNorms scale by 1 + w; the converter stores 1 + w.
    f32(w, "token_embd.weight", t["model.embed_tokens.weight"])
    f32(w, "output_norm.weight", t["model.norm.weight"] + 1)
    for l in range(n):
        p, b = "model.layers.%d." % l, "blk.%d." % l
        for hf, gg in (("input_layernorm", "attn_norm"), ("post_attention_layernorm", "post_attention_norm"),
                       ("pre_feedforward_layernorm", "ffn_norm"), ("post_feedforward_layernorm", "post_ffw_norm"),
                       ("self_attn.q_norm", "attn_q_norm"), ("self_attn.k_norm", "attn_k_norm")):
            f32(w, b + gg + ".weight", t[p + hf + ".weight"] + 1)
        for hf, gg in (("self_attn.q_proj", "attn_q"), ("self_attn.k_proj", "attn_k"),
                       ("self_attn.v_proj", "attn_v"), ("self_attn.o_proj", "attn_output"),
                       ("mlp.gate_proj", "ffn_gate"), ("mlp.up_proj", "ffn_up"), ("mlp.down_proj", "ffn_down")):
            f32(w, b + gg + ".weight", t[p + hf + ".weight"])
    finish(w)


def mxfp4_blocks(weight, scales):
    """MLX's mxfp4 (weight: uint32 [..., cols/8], E2M1 codes packed 8 to a
    word, element j of a word in bits 4j..4j+3; scales: uint8 E8M0
    [..., cols/32]) as ggml MXFP4 blocks [..., cols/32, 17]: the E8M0 byte,
    then 16 bytes whose low nibbles are elements 0..15 of the block and
    high nibbles elements 16..31. The codes and scales are unchanged (ggml's
    value table is E2M1 doubled, its scale halved)."""
    b = weight.view(np.uint8)  # little-endian: byte k holds elements 2k, 2k+1
    codes = np.stack([b & 15, b >> 4], axis=-1).reshape(*b.shape[:-1], -1)  # [..., cols]
    codes = codes.reshape(*codes.shape[:-1], -1, 32)
    qs = codes[..., :16] | (codes[..., 16:] << 4)
    return np.concatenate([scales[..., None], qs], axis=-1).astype(np.uint8)


E2M1 = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6])


def dequantize_mxfp4_dir(src, dst):
    """Copies the model directory src to dst with its MLX mxfp4 tensors
    dequantized (E2M1 value times 2^(scale-127), exact in f32)."""
    from safetensors.numpy import save_file
    shutil.copytree(src, dst)
    t = load_file(os.path.join(src, "model.safetensors"))
    out = {}
    for k, v in t.items():
        sk = k[:-len(".weight")] + ".scales" if k.endswith(".weight") else None
        if k.endswith(".scales"):
            continue
        if sk in t:
            b = v.view(np.uint8)
            codes = np.stack([b & 15, b >> 4], axis=-1).reshape(*b.shape[:-1], -1)
            v = (E2M1[codes] * np.repeat(2.0 ** (t[sk].astype(np.float64) - 127), 32, axis=-1)).astype(np.float32)
        out[k] = v
    save_file(out, os.path.join(dst, "model.safetensors"))


def dequantize_gguf(src, dst):
    """Rewrites the GGUF src as dst with every tensor dequantized to f32
    (gguf-py's dequantizers) and the same metadata."""
    r = gguf.GGUFReader(src)
    w = gguf.GGUFWriter(dst, r.fields["general.architecture"].contents())
    for k, f in r.fields.items():
        if k.startswith("GGUF.") or k in ("general.architecture", "general.file_type", "general.quantization_version"):
            continue
        w.add_key_value(k, f.contents(), f.types[0], f.types[1] if len(f.types) > 1 else None)
    for t in r.tensors:
        v = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        w.add_tensor(t.name, v.reshape([int(d) for d in reversed(t.shape)]))
    finish(w)


def write_gptoss(src, dst):
    cfg = json.load(open(os.path.join(src, "config.json")))
    t = load_file(os.path.join(src, "model.safetensors"))
    w = gguf.GGUFWriter(dst, "gpt-oss")
    n = cfg["num_hidden_layers"]
    w.add_block_count(n)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_key_length(cfg["head_dim"])
    w.add_value_length(cfg["head_dim"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_rope_freq_base(cfg["rope_theta"])
    rs = cfg["rope_scaling"]
    assert rs["rope_type"] == "yarn" and rs["beta_fast"] == 32 and rs["beta_slow"] == 1
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(rs["factor"])
    w.add_rope_scaling_orig_ctx_len(rs["original_max_position_embeddings"])
    w.add_expert_count(cfg["num_local_experts"])
    w.add_expert_used_count(cfg["num_experts_per_tok"])
    w.add_expert_feed_forward_length(cfg["intermediate_size"])
    w.add_sliding_window(cfg["sliding_window"])
    # llama.cpp's default pattern for gpt-oss (period 2: even layers slide)
    # and its fixed SwiGLU limit 7 are the generator's.
    assert cfg["layer_types"][:2] == ["sliding_attention", "full_attention"] and cfg["swiglu_limit"] == 7
    vocab_keys(w, src, cfg)
    f32(w, "token_embd.weight", t["model.embed_tokens.weight"])
    f32(w, "output_norm.weight", t["model.norm.weight"])
    f32(w, "output.weight", t["lm_head.weight"])
    for l in range(n):
        p, b = "model.layers.%d." % l, "blk.%d." % l
        f32(w, b + "attn_norm.weight", t[p + "input_layernorm.weight"])
        f32(w, b + "post_attention_norm.weight", t[p + "post_attention_layernorm.weight"])
        for hf, gg in (("q_proj", "attn_q"), ("k_proj", "attn_k"), ("v_proj", "attn_v"), ("o_proj", "attn_output")):
            for suf in ("weight", "bias"):
                f32(w, b + gg + "." + suf, t[p + "self_attn." + hf + "." + suf])
        f32(w, b + "attn_sinks.weight", t[p + "self_attn.sinks"])
        f32(w, b + "ffn_gate_inp.weight", t[p + "mlp.router.weight"])
        f32(w, b + "ffn_gate_inp.bias", t[p + "mlp.router.bias"])
        for hf, gg in (("gate_proj", "ffn_gate_exps"), ("up_proj", "ffn_up_exps"), ("down_proj", "ffn_down_exps")):
            e = p + "mlp.experts." + hf
            if e + ".scales" in t:
                blk = mxfp4_blocks(t[e + ".weight"], t[e + ".scales"])
                w.add_tensor(b + gg + ".weight", blk.reshape(*blk.shape[:-2], -1),
                             raw_dtype=gguf.GGMLQuantizationType.MXFP4)
            else:
                f32(w, b + gg + ".weight", t[e + ".weight"])
            f32(w, b + gg + ".bias", t[e + ".bias"])
    finish(w)


def write_qwen3next(src, dst):
    """Qwen3-Next in the converter's layout: in_proj_qkvz regrouped into
    attn_qkv (all q heads, all k heads, all v heads) and attn_gate (z),
    in_proj_ba kept grouped as ssm_ba, conv1d squeezed to [C, K], ssm_a =
    -exp(A_log), dt_bias as ssm_dt.bias. Norm weights: the converter adds
    1 to HF's zero-centred ones; mlx-lm's layout already holds 1 + w, so
    they are written as they are (the gated linear_attn.norm is a plain
    weight in both)."""
    c = json.load(open(os.path.join(src, "config.json")))
    t = load_file(os.path.join(src, "model.safetensors"))
    w = gguf.GGUFWriter(dst, "qwen3next")
    n, D = c["num_hidden_layers"], c["hidden_size"]
    Hk, Hv, Dk, Dv = c["linear_num_key_heads"], c["linear_num_value_heads"], c["linear_key_head_dim"], c["linear_value_head_dim"]
    w.add_block_count(n)
    w.add_context_length(c["max_position_embeddings"])
    w.add_embedding_length(D)
    w.add_feed_forward_length(c["intermediate_size"])
    w.add_head_count(c["num_attention_heads"])
    w.add_head_count_kv(c["num_key_value_heads"])
    w.add_key_length(c["head_dim"])
    w.add_value_length(c["head_dim"])
    w.add_layer_norm_rms_eps(c["rms_norm_eps"])
    w.add_rope_freq_base(c["rope_theta"])
    w.add_rope_dimension_count(int(c["head_dim"] * c["partial_rotary_factor"]))
    w.add_expert_count(c["num_experts"])
    w.add_expert_used_count(c["num_experts_per_tok"])
    w.add_expert_feed_forward_length(c["moe_intermediate_size"])
    w.add_expert_shared_feed_forward_length(c["shared_expert_intermediate_size"])
    w.add_ssm_conv_kernel(c["linear_conv_kernel_dim"])
    w.add_ssm_state_size(Dk)
    w.add_ssm_group_count(Hk)
    w.add_ssm_time_step_rank(Hv)
    w.add_ssm_inner_size(Dv * Hv)
    w.add_uint32("qwen3next.full_attention_interval", c["full_attention_interval"])
    assert c["norm_topk_prob"] and c["mlp_only_layers"] == [] and Dk == Dv
    vocab_keys(w, src, c)
    f32(w, "token_embd.weight", t["model.embed_tokens.weight"])
    f32(w, "output_norm.weight", t["model.norm.weight"])
    f32(w, "output.weight", t["lm_head.weight"])
    r = Hv // Hk
    for l in range(n):
        p, b = "model.layers.%d." % l, "blk.%d." % l
        f32(w, b + "attn_norm.weight", t[p + "input_layernorm.weight"])
        f32(w, b + "post_attention_norm.weight", t[p + "post_attention_layernorm.weight"])
        if p + "self_attn.q_proj.weight" in t:
            for hf, gg in (("q_proj", "attn_q"), ("k_proj", "attn_k"), ("v_proj", "attn_v"), ("o_proj", "attn_output"),
                           ("q_norm", "attn_q_norm"), ("k_norm", "attn_k_norm")):
                f32(w, b + gg + ".weight", t[p + "self_attn." + hf + ".weight"])
        else:
            a = p + "linear_attn."
            qkvz = t[a + "in_proj_qkvz.weight"].reshape(Hk, 2 * Dk + 2 * r * Dv, D)
            q, k, v, z = np.split(qkvz, [Dk, 2 * Dk, 2 * Dk + r * Dv], axis=1)
            f32(w, b + "attn_qkv.weight", np.concatenate([q.reshape(-1, D), k.reshape(-1, D), v.reshape(-1, D)]))
            f32(w, b + "attn_gate.weight", z.reshape(-1, D))
            f32(w, b + "ssm_ba.weight", t[a + "in_proj_ba.weight"])
            f32(w, b + "ssm_conv1d.weight", t[a + "conv1d.weight"][:, :, 0])
            f32(w, b + "ssm_a", -np.exp(t[a + "A_log"]))
            f32(w, b + "ssm_dt.bias", t[a + "dt_bias"])
            f32(w, b + "ssm_norm.weight", t[a + "norm.weight"])
            f32(w, b + "ssm_out.weight", t[a + "out_proj.weight"])
        m = p + "mlp."
        f32(w, b + "ffn_gate_inp.weight", t[m + "gate.weight"])
        for hf, gg in (("gate_proj", "ffn_gate"), ("up_proj", "ffn_up"), ("down_proj", "ffn_down")):
            f32(w, b + gg + "_exps.weight", t[m + "switch_mlp." + hf + ".weight"])
            f32(w, b + gg + "_shexp.weight", t[m + "shared_expert." + hf + ".weight"])
        f32(w, b + "ffn_gate_inp_shexp.weight", t[m + "shared_expert_gate.weight"][0])
    finish(w)


def tiled(x, nk, r, hd, axis=0):
    """The converter's reordering of value heads along axis: from grouped
    by key head (g·r + j) to tiled (j·nk + g), hd rows (or columns) each."""
    x = np.moveaxis(x, axis, 0)
    shape = x.shape
    x = x.reshape(nk, r, hd, *shape[1:]).swapaxes(0, 1).reshape(shape)
    return np.moveaxis(x, 0, axis)


def write_qwen35(src, dst):
    """Qwen3.5 in the converter's layout (qwen35 / qwen35moe): like
    qwen3next but with Qwen3.5's separate projections (in_proj_qkv →
    attn_qkv, in_proj_z → attn_gate, in_proj_b → ssm_beta, in_proj_a →
    ssm_alpha), the value heads reordered from grouped-by-key-head to tiled
    in every tensor that has them (the v rows of attn_qkv and of the conv
    kernel, attn_gate, ssm_beta, ssm_alpha, ssm_a, ssm_dt, the columns of
    ssm_out), and rope.dimension_sections (interleaved MRoPE, which for
    text positions is plain RoPE over rope.dimension_count dims)."""
    top = json.load(open(os.path.join(src, "config.json")))
    c = dict(top["text_config"])
    moe = "num_experts" in c
    t = {k.replace("language_model.", "", 1): v for k, v in load_file(os.path.join(src, "model.safetensors")).items()}
    w = gguf.GGUFWriter(dst, "qwen35moe" if moe else "qwen35")
    n, D = c["num_hidden_layers"], c["hidden_size"]
    Hk, Hv, Dk, Dv = c["linear_num_key_heads"], c["linear_num_value_heads"], c["linear_key_head_dim"], c["linear_value_head_dim"]
    rp = c["rope_parameters"]
    w.add_block_count(n)
    w.add_context_length(c["max_position_embeddings"])
    w.add_embedding_length(D)
    w.add_feed_forward_length(c["intermediate_size"])
    w.add_head_count(c["num_attention_heads"])
    w.add_head_count_kv(c["num_key_value_heads"])
    w.add_key_length(c["head_dim"])
    w.add_value_length(c["head_dim"])
    w.add_layer_norm_rms_eps(c["rms_norm_eps"])
    w.add_rope_freq_base(rp["rope_theta"])
    w.add_rope_dimension_count(int(c["head_dim"] * rp["partial_rotary_factor"]))
    w.add_rope_dimension_sections(list(rp["mrope_section"]) + [0] * (4 - len(rp["mrope_section"])))
    if moe:
        w.add_expert_count(c["num_experts"])
        w.add_expert_used_count(c["num_experts_per_tok"])
        w.add_expert_feed_forward_length(c["moe_intermediate_size"])
        w.add_expert_shared_feed_forward_length(c["shared_expert_intermediate_size"])
        assert c["norm_topk_prob"]
    w.add_ssm_conv_kernel(c["linear_conv_kernel_dim"])
    w.add_ssm_state_size(Dk)
    w.add_ssm_group_count(Hk)
    w.add_ssm_time_step_rank(Hv)
    w.add_ssm_inner_size(Dv * Hv)
    w.add_uint32(("qwen35moe" if moe else "qwen35") + ".full_attention_interval", c["full_attention_interval"])
    assert Dk == Dv
    vocab_keys(w, src, top)
    f32(w, "token_embd.weight", t["model.embed_tokens.weight"])
    f32(w, "output_norm.weight", t["model.norm.weight"])
    f32(w, "output.weight", t["lm_head.weight"])
    r = Hv // Hk
    for l in range(n):
        p, b = "model.layers.%d." % l, "blk.%d." % l
        f32(w, b + "attn_norm.weight", t[p + "input_layernorm.weight"])
        f32(w, b + "post_attention_norm.weight", t[p + "post_attention_layernorm.weight"])
        if p + "self_attn.q_proj.weight" in t:
            for hf, gg in (("q_proj", "attn_q"), ("k_proj", "attn_k"), ("v_proj", "attn_v"), ("o_proj", "attn_output"),
                           ("q_norm", "attn_q_norm"), ("k_norm", "attn_k_norm")):
                f32(w, b + gg + ".weight", t[p + "self_attn." + hf + ".weight"])
        else:
            a = p + "linear_attn."
            qkv = t[a + "in_proj_qkv.weight"]
            f32(w, b + "attn_qkv.weight", np.concatenate([qkv[:2 * Hk * Dk], tiled(qkv[2 * Hk * Dk:], Hk, r, Dv)]))
            f32(w, b + "attn_gate.weight", tiled(t[a + "in_proj_z.weight"], Hk, r, Dv))
            f32(w, b + "ssm_beta.weight", tiled(t[a + "in_proj_b.weight"], Hk, r, 1))
            f32(w, b + "ssm_alpha.weight", tiled(t[a + "in_proj_a.weight"], Hk, r, 1))
            conv = t[a + "conv1d.weight"][:, :, 0]
            f32(w, b + "ssm_conv1d.weight", np.concatenate([conv[:2 * Hk * Dk], tiled(conv[2 * Hk * Dk:], Hk, r, Dv)]))
            f32(w, b + "ssm_a", tiled(-np.exp(t[a + "A_log"]), Hk, r, 1))
            f32(w, b + "ssm_dt.bias", tiled(t[a + "dt_bias"], Hk, r, 1))
            f32(w, b + "ssm_norm.weight", t[a + "norm.weight"])
            f32(w, b + "ssm_out.weight", tiled(t[a + "out_proj.weight"], Hk, r, Dv, axis=1))
        m = p + "mlp."
        if moe:
            f32(w, b + "ffn_gate_inp.weight", t[m + "gate.weight"])
            for hf, gg in (("gate_proj", "ffn_gate"), ("up_proj", "ffn_up"), ("down_proj", "ffn_down")):
                f32(w, b + gg + "_exps.weight", t[m + "switch_mlp." + hf + ".weight"])
                f32(w, b + gg + "_shexp.weight", t[m + "shared_expert." + hf + ".weight"])
            f32(w, b + "ffn_gate_inp_shexp.weight", t[m + "shared_expert_gate.weight"][0])
        else:
            for hf, gg in (("gate_proj", "ffn_gate"), ("up_proj", "ffn_up"), ("down_proj", "ffn_down")):
                f32(w, b + gg + ".weight", t[m + hf + ".weight"])
    finish(w)


WRITERS = {"gemma3": write_gemma3, "gptoss": write_gptoss, "qwen3next": write_qwen3next,
           "qwen35": write_qwen35, "qwen35moe": write_qwen35}


def finish(w):
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def check_against_mlx_lm(path, src):
    """Runs llama.cpp on the f32 GGUF written from an mlx-lm fixture
    directory on that fixture's prompts and compares with mlx-lm's recorded
    outputs (runners/engine/testdata/reference/<src>.json): a check of this
    script's layout, printed and recorded as information."""
    fx = json.load(open(os.path.join(ROOT, "runners", "engine", "testdata", "reference", src + ".json")))
    m = Llama(path, n_ctx=512, n_batch=512, logits_all=True, verbose=False, type_k=0, type_v=0)
    out = []
    for p in fx["prompts"]:
        m.reset()
        m.eval(p["tokens"])
        lg = np.array(m.scores[m.n_tokens - 1], dtype=np.float64)
        want = np.frombuffer(base64.b64decode(p["logits_f32_b64"]), "<f4").astype(np.float64)
        cur, agree = lg, 0
        for tok in p["greedy"]:
            if int(np.argmax(cur)) != tok:
                break
            agree += 1
            m.eval([tok])
            cur = np.array(m.scores[m.n_tokens - 1])
        cos = float(lg @ want / np.linalg.norm(lg) / np.linalg.norm(want))
        print("%s: llama.cpp on the f32 GGUF vs mlx-lm, %d tokens: cosine %.7f, greedy agrees %d/%d"
              % (src, len(p["tokens"]), cos, agree, len(p["greedy"])))
        out.append({"tokens": len(p["tokens"]), "cosine": round(cos, 7), "greedy_agree": agree, "greedy": len(p["greedy"])})
    return out


def run_llama(path):
    # F32 KV cache: llama.cpp's default F16 cache would be the largest
    # difference from the engine's.
    m = Llama(path, n_ctx=256, n_batch=256, logits_all=True, verbose=False, type_k=0, type_v=0)
    res = []
    for toks in prompts():
        m.reset()
        m.eval(toks)
        lg = np.array(m.scores[m.n_tokens - 1], dtype=np.float32)
        greedy, cur = [], lg
        for _ in range(GREEDY):
            tok = int(np.argmax(cur))
            greedy.append(tok)
            m.eval([tok])
            cur = np.array(m.scores[m.n_tokens - 1], dtype=np.float32)
        res.append({"tokens": toks, "logits_f32_b64": base64.b64encode(lg.astype("<f4").tobytes()).decode(),
                    "greedy": greedy})
    return res


def main(archs):
    os.makedirs(OUT, exist_ok=True)
    for arch in archs:
        spec = MODELS[arch]
        files, dequantized, mlx_check = {}, {}, None
        with tempfile.TemporaryDirectory() as tmp:
            for name, extra in [("f32", [])] + list(spec.get("variants", {}).items()):
                if "src" in spec:
                    st = os.path.join(ROOT, "runners", "engine", "testdata", "reference", spec["src"])
                else:
                    st = os.path.join(tmp, name)
                    subprocess.run(GEN + spec["gen"] + extra + [st], cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
                if "make" in spec:
                    spec["make"](st)
                files[name] = os.path.join(OUT if spec.get("keep_f32", True) or name != "f32" else tmp,
                                           "%s_%s.gguf" % (arch, name))
                WRITERS[arch](st, files[name])
                if name == "mxfp4":
                    # llama.cpp on the same weights dequantized exactly to
                    # f32: the MXFP4 file's reference without llama.cpp's
                    # 8-bit rounding of the activations.
                    dense = os.path.join(tmp, name + "_dense")
                    dequantize_mxfp4_dir(st, dense)
                    WRITERS[arch](dense, os.path.join(tmp, name + "_dense.gguf"))
                    dequantized[name] = run_llama(os.path.join(tmp, name + "_dense.gguf"))
            base = files["f32"]
            for name, ftype in spec.get("quant", {}).items():
                out = os.path.join(OUT, "%s_%s.gguf" % (arch, name))
                p = llama_cpp.llama_model_quantize_default_params()
                p.ftype = ftype
                p.nthread = 2
                if llama_cpp.llama_model_quantize(base.encode(), out.encode(), ctypes.byref(p)) != 0:
                    raise SystemExit("llama_model_quantize failed")
                files[name] = out
                # llama.cpp on this file's weights dequantized to f32.
                dense = os.path.join(tmp, name + "_dense.gguf")
                dequantize_gguf(out, dense)
                dequantized[name] = run_llama(dense)
            if "src" in spec:
                mlx_check = check_against_mlx_lm(files["f32"], spec["src"])
            if not spec.get("keep_f32", True):
                # llama.cpp's quantizations need the f32 file, which is
                # not kept.
                files["f32"] = None
        doc = {"generator": "scripts/reference/gguf_llamacpp.py", "gen": spec.get("gen"), "src": spec.get("src"),
               "variants": spec.get("variants", {}),
               "llama_cpp_python": llama_cpp.__version__, "files": []}
        if mlx_check is not None:
            doc["f32_gguf_vs_mlx_lm"] = mlx_check
        for name, path in files.items():
            if path is None:
                continue
            entry = {"type": name, "file": os.path.basename(path), "prompts": run_llama(path)}
            if name in dequantized:
                entry["dequantized_prompts"] = dequantized[name]
            doc["files"].append(entry)
            print("wrote", os.path.relpath(path, ROOT), os.path.getsize(path), "bytes")
        with open(os.path.join(OUT, arch + "_llamacpp.json"), "w") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main(sys.argv[1:] or list(MODELS))
