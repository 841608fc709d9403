#!/usr/bin/env python3
"""Does how a weight was loaded, or the pages behind it, change how fast MLX's
CPU device multiplies by it? (issue 31: the 8B-shaped f32 stack.)

One process makes several copies of one safetensors tensor, each by a method:

  copy      mx.array(numpy memmap of the file): a copy from the mapped file
            into a buffer MLX allocates, as exo's mlx_array_new_data did;
  load      mx.load(file)[name]: MLX's own safetensors loader (mlx-lm's way);
  collapse  a copy, then madvise(MADV_HUGEPAGE) + madvise(MADV_COLLAPSE) on
            its 2 MiB-aligned interior (moves it into transparent huge pages);

then times y = x @ W.T (x: one row, as in a decode step) for every copy in
turn, round after round (each round reverses the order), and prints per copy
the median process CPU time of one product, the share of its 4 KiB pages
whose physical successor is the next frame (/proc/self/pagemap, needs root;
"-" without) and the process's AnonHugePages. With the copies together over
the last-level cache, each product reads its weight from memory, as a decode
step does.

  weight_pages.py FILE TENSOR METHODS ROUNDS
  e.g. weight_pages.py /tmp/overlap-8b2-f32/model.safetensors \\
         model.layers.0.mlp.gate_proj.weight copy,load,copy,load,copy,load 7

Run it under GLIBC_TUNABLES=glibc.malloc.hugetlb=1 to have glibc advise every
large allocation as huge pages at allocation time (what exo's loader now does
for its weights, see docs/BENCHMARKS.md).
"""
import ctypes
import json
import os
import statistics
import struct
import sys
import time

import mlx.core as mx
import numpy as np


def main():
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    path, name, methods, rounds = sys.argv[1], sys.argv[2], sys.argv[3].split(","), int(sys.argv[4])
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    t = header[name]
    if t["dtype"] != "F32":
        sys.exit("an F32 tensor, please")
    a, _ = t["data_offsets"]
    mm = np.memmap(path, dtype=np.float32, mode="r", offset=8 + n + a, shape=tuple(t["shape"]))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]

    ws = []
    for m in methods:
        if m in ("copy", "collapse"):
            w = mx.array(mm)
        elif m == "load":
            w = mx.load(path)[name]
        else:
            sys.exit(f"unknown method {m}")
        mx.eval(w)
        if m == "collapse":
            p = address(w)
            lo, hi = (p + (1 << 21) - 1) & ~((1 << 21) - 1), (p + w.nbytes) & ~((1 << 21) - 1)
            if libc.madvise(lo, hi - lo, 14) or libc.madvise(lo, hi - lo, 25):  # MADV_HUGEPAGE, MADV_COLLAPSE
                print(f"madvise: errno {ctypes.get_errno()}", file=sys.stderr)
        ws.append(w)
    x = mx.random.normal((1, 1, t["shape"][1]))
    mx.eval(x)

    def product(w):
        c0 = time.process_time()
        mx.eval(x @ w.T)
        return (time.process_time() - c0) * 1000

    for w in ws:
        product(w)
    times = [[] for _ in ws]
    for r in range(rounds):
        order = list(range(len(ws)))[:: -1 if r % 2 else 1]
        for i in order:
            times[i].append(product(ws[i]))
    for i, m in enumerate(methods):
        print(f"{i} {m:8s} cpu-ms median {statistics.median(times[i]):6.1f} "
              f"({', '.join(f'{v:.0f}' for v in times[i])}), contiguous frames {contiguity(address(ws[i]), ws[i].nbytes)}")
    print(next((l.strip() for l in open("/proc/self/smaps_rollup") if l.startswith("AnonHugePages")), ""))


def address(w):
    return np.asarray(memoryview(w)).__array_interface__["data"][0]


def contiguity(p, nbytes):
    try:
        fd = os.open("/proc/self/pagemap", os.O_RDONLY)
    except OSError:
        return "-"
    try:
        first, last = p // 4096, (p + nbytes - 1) // 4096
        v = np.frombuffer(os.pread(fd, 8 * (last - first + 1), 8 * first), dtype=np.uint64)
    finally:
        os.close(fd)
    pfn = (v & np.uint64((1 << 55) - 1)).astype(np.int64)
    if not pfn.any():
        return "-"  # frames hidden (not root)
    return f"{(np.diff(pfn) == 1).mean():.2f}"


if __name__ == "__main__":
    main()
