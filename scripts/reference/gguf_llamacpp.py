#!/usr/bin/env python3
"""Windowed and hybrid architectures as GGUF, with llama.cpp as the reference.

For each architecture (gemma3, gpt-oss, qwen3next) this generates a tiny
model with our Go generator (testmodel, f32 safetensors), writes it as a GGUF
in the layout llama.cpp's converter gives that architecture (tensor names and
metadata keys from gguf-py's constants; the per-architecture transforms are
stated where they are done; this script is ours), has llama.cpp quantize it
where asked (llama_model_quantize), and runs llama.cpp on prompts several
sliding windows long: logits at the last position, and a 32-token greedy
continuation. Writes under runners/engine/testdata/reference/gguf/:

  <arch>_<type>.gguf          the model llama.cpp ran
  <arch>_llamacpp.json        per file and prompt: tokens, last-position
                              logits (float32, base64), greedy continuation

runners/engine/reference_gguf_test.go checks the engine against them.

Run by hand (not in CI), from the repository root:
    pip install gguf numpy safetensors llama-cpp-python
    python3 scripts/reference/gguf_llamacpp.py gemma3 [gptoss qwen3next]
"""
import base64, ctypes, json, os, subprocess, sys, tempfile

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
    # One shorter than the window (8), the others 3 and 5 windows long.
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
}


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


WRITERS = {"gemma3": write_gemma3}


def finish(w):
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


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
        files = {}
        with tempfile.TemporaryDirectory() as tmp:
            st = os.path.join(tmp, "st")
            subprocess.run(GEN + spec["gen"] + [st], cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
            base = os.path.join(OUT, arch + "_f32.gguf")
            WRITERS[arch](st, base)
            files["f32"] = base
            for name, ftype in spec.get("quant", {}).items():
                out = os.path.join(OUT, "%s_%s.gguf" % (arch, name))
                p = llama_cpp.llama_model_quantize_default_params()
                p.ftype = ftype
                p.nthread = 2
                if llama_cpp.llama_model_quantize(base.encode(), out.encode(), ctypes.byref(p)) != 0:
                    raise SystemExit("llama_model_quantize failed")
                files[name] = out
        doc = {"generator": "scripts/reference/gguf_llamacpp.py", "gen": spec["gen"],
               "llama_cpp_python": llama_cpp.__version__, "files": []}
        for name, path in files.items():
            doc["files"].append({"type": name, "file": os.path.basename(path), "prompts": run_llama(path)})
            print("wrote", os.path.relpath(path, ROOT), os.path.getsize(path), "bytes")
        with open(os.path.join(OUT, arch + "_llamacpp.json"), "w") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main(sys.argv[1:] or list(MODELS))
