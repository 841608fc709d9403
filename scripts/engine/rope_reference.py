#!/usr/bin/env python3
"""Prints RoPE inverse frequencies and attention factors for the cases in
runners/engine/rope_test.go, computed with a numpy transcription of HF
transformers' _compute_default_rope_parameters, _compute_llama3_parameters and
_compute_yarn_parameters (transformers 5.24; torch, which those functions
need, is not installable here). Run by hand: python3 scripts/engine/rope_reference.py
"""
import math

import numpy as np


def default(base, dim):
    return (1.0 / (np.float32(base) ** (np.arange(0, dim, 2).astype(np.float32) / np.float32(dim)))).astype(np.float32)


def llama3(base, dim, factor, low, high, old):
    inv = default(base, dim)
    lw, hw = old / low, old / high
    wl = 2 * math.pi / inv
    il = np.where(wl > lw, inv / factor, inv)
    sm = (old / wl - low) / (high - low)
    sinv = (1 - sm) * il / factor + sm * il
    med = ~(wl < hw) & ~(wl > lw)
    return np.where(med, sinv, il).astype(np.float32), 1.0


def yarn(base, dim, factor, orig, bf=32, bs=1, mscale=None, mad=None):
    def gm(s, m=1):
        return 1.0 if s <= 1 else 0.1 * m * math.log(s) + 1.0
    af = gm(factor, mscale) / gm(factor, mad) if (mscale and mad) else gm(factor)
    pf = np.float32(base) ** (np.arange(0, dim, 2).astype(np.float32) / np.float32(dim))
    ie, ii = 1.0 / pf, 1.0 / (factor * pf)

    def cd(r):
        return (dim * math.log(orig / (r * 2 * math.pi))) / (2 * math.log(base))
    lo, hi = max(math.floor(cd(bf)), 0), min(math.ceil(cd(bs)), dim - 1)
    if lo == hi:
        hi += 0.001
    ramp = np.clip((np.arange(dim // 2).astype(np.float32) - lo) / (hi - lo), 0, 1)
    ef = 1 - ramp
    return (ii * (1 - ef) + ie * ef).astype(np.float32), af


IDX = [0, 5, 10, 20, 30, 40, 50, 63]
for name, (inv, af) in {
    "llama3": llama3(500000.0, 128, 8.0, 1.0, 4.0, 8192),
    "yarn": yarn(1000000.0, 128, 4.0, 32768),
    "yarn mscale": yarn(10000.0, 64, 40.0, 4096, mscale=1.0, mad=0.707),
    "linear": (default(10000.0, 64) / 2.0, 1.0),
}.items():
    print(name, af, [float(inv[i]) for i in IDX if i < len(inv)])
