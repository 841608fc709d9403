#!/usr/bin/env python3
"""Qwen3-MoE as GGUF, with llama.cpp as the reference.

Generates a tiny all-sparse Qwen3-MoE with our Go generator (testmodel,
f32 safetensors), writes it as a GGUF the way llama.cpp's converter names
MoE tensors (blk.N.ffn_gate_inp = router, ffn_{gate,up,down}_exps = experts
stacked [E, out, in]; this script is ours, written from the GGUF naming),
quantizes it to Q4_0 with llama.cpp itself (llama_model_quantize), and runs
llama.cpp on the five reference prompts. Writes

  runners/engine/testdata/reference/qwen3moe_q4_0.gguf   (the quantized model)
  runners/engine/testdata/reference/qwen3moe_llamacpp.json
      last-position logits (float32, base64) per prompt

runners/engine/reference_gguf_moe_test.go checks the engine against them.

Run by hand (not in CI), from the repository root:
    pip install gguf numpy safetensors llama-cpp-python
    python3 scripts/reference/qwen3moe_gguf.py
"""
import base64, ctypes, json, os, subprocess, tempfile

import numpy as np
import gguf
import llama_cpp
from llama_cpp import Llama
from safetensors.numpy import load_file

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))
REF = os.path.join(ROOT, "runners", "engine", "testdata", "reference")
GEN = ["go", "run", "./runners/engine/testmodel/cmd/gen", "-arch", "qwen3moe", "-all-sparse", "-layers", "2",
       "-hidden", "64", "-heads", "2", "-kv-heads", "1", "-vocab", "300", "-seed", "11"]
PROMPTS = [[297], [298, 200, 201, 202, 10, 84, 104, 101, 32, 109], list(range(1, 21)),
           [200, 17, 200, 17, 200, 17, 256, 257, 258, 259, 260, 261],
           [104, 101, 108, 108, 111, 32, 119, 111, 114, 108, 100, 33, 32, 72, 111, 119, 32, 97, 114, 101]]


def to_gguf(src, dst):
    cfg = json.load(open(os.path.join(src, "config.json")))
    t = load_file(os.path.join(src, "model.safetensors"))
    tj = json.load(open(os.path.join(src, "tokenizer.json")))
    w = gguf.GGUFWriter(dst, "qwen3moe")
    n = cfg["num_hidden_layers"]
    w.add_block_count(n)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_key_length(cfg["head_dim"])
    w.add_value_length(cfg["head_dim"])
    w.add_rope_freq_base(cfg["rope_theta"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_expert_count(cfg["num_experts"])
    w.add_expert_used_count(cfg["num_experts_per_tok"])
    w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
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
    w.add_chat_template(json.load(open(os.path.join(src, "tokenizer_config.json")))["chat_template"])

    def add(name, arr):
        w.add_tensor(name, np.ascontiguousarray(arr.astype(np.float32)))
    add("token_embd.weight", t["model.embed_tokens.weight"])
    add("output_norm.weight", t["model.norm.weight"])
    add("output.weight", t["lm_head.weight"])
    for l in range(n):
        p, b = "model.layers.%d." % l, "blk.%d." % l
        for hf, gg in (("input_layernorm", "attn_norm"), ("post_attention_layernorm", "ffn_norm"),
                       ("self_attn.q_proj", "attn_q"), ("self_attn.k_proj", "attn_k"),
                       ("self_attn.v_proj", "attn_v"), ("self_attn.o_proj", "attn_output"),
                       ("self_attn.q_norm", "attn_q_norm"), ("self_attn.k_norm", "attn_k_norm")):
            add(b + gg + ".weight", t[p + hf + ".weight"])
        add(b + "ffn_gate_inp.weight", t[p + "mlp.gate.weight"])
        for hf, gg in (("gate_proj", "ffn_gate_exps"), ("up_proj", "ffn_up_exps"), ("down_proj", "ffn_down_exps")):
            add(b + gg + ".weight", np.stack([t[p + "mlp.experts.%d.%s.weight" % (e, hf)]
                                              for e in range(cfg["num_experts"])]))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    with tempfile.TemporaryDirectory() as tmp:
        st = os.path.join(tmp, "st")
        subprocess.run(GEN + [st], cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
        f32 = os.path.join(tmp, "f32.gguf")
        to_gguf(st, f32)
        out = os.path.join(REF, "qwen3moe_q4_0.gguf")
        p = llama_cpp.llama_model_quantize_default_params()
        p.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0
        p.nthread = 2
        if llama_cpp.llama_model_quantize(f32.encode(), out.encode(), ctypes.byref(p)) != 0:
            raise SystemExit("llama_model_quantize failed")
    m = Llama(out, n_ctx=256, logits_all=True, verbose=False)
    res = []
    for toks in PROMPTS:
        m.reset()
        m.eval(toks)
        lg = np.array(m.scores[m.n_tokens - 1], dtype=np.float32)
        res.append({"tokens": toks, "logits_f32_b64": base64.b64encode(lg.astype("<f4").tobytes()).decode()})
    with open(os.path.join(REF, "qwen3moe_llamacpp.json"), "w") as f:
        json.dump({"generator": "scripts/reference/qwen3moe_gguf.py", "gen": GEN[3:],
                   "llama_cpp_python": llama_cpp.__version__, "prompts": res}, f, indent=1)
        f.write("\n")
    print("wrote", os.path.relpath(out, ROOT), os.path.getsize(out), "bytes")


if __name__ == "__main__":
    main()
