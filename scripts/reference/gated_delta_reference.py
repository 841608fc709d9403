#!/usr/bin/env python3
"""Reference numerics from mlx-lm for the gated delta rule (Gated DeltaNet).

Draws random inputs (seeded numpy), runs mlx-lm's own gated_delta_update
(mlx_lm.models.gated_delta, the function Qwen3-Next and Qwen3.5 call) on
MLX's CPU backend in float32, and writes
runners/engine/testdata/reference/gated_delta.json: per case the inputs
q, k [L, Hk, Dk], v [L, Hv, Dv], a, b [L, Hv], A_log, dt_bias [Hv], the
initial state [Hv, Dv, Dk], and mlx-lm's outputs y [L, Hv, Dv], the final
state, and the gates g = compute_g(A_log, a, dt_bias), beta = sigmoid(b)
(float32, base64, batch axis dropped). runners/engine/cpu/delta_test.go and
the mlx backend's tests check DeltaGates and GatedDelta against it.

Run by hand (not in CI), from the repository root:
    pip install "mlx[cpu]" mlx-lm
    python3 scripts/reference/gated_delta_reference.py
"""
import base64, importlib.metadata, json, os

import numpy as np
import mlx.core as mx
from mlx_lm.models.gated_delta import compute_g, gated_delta_update

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))
OUT = os.path.join(ROOT, "runners", "engine", "testdata", "reference", "gated_delta.json")

CASES = [
    # name, L, Hk, Hv, Dk, Dv, seed
    ("gqa", 13, 2, 4, 16, 8, 1),
    ("mha-decode", 1, 3, 3, 8, 8, 2),
    ("long", 40, 1, 2, 32, 16, 3),
]


def b64(a):
    return base64.b64encode(np.asarray(a, dtype="<f4").tobytes()).decode()


def main():
    mx.set_default_device(mx.cpu)
    cases = []
    for name, L, Hk, Hv, Dk, Dv, seed in CASES:
        r = np.random.default_rng(seed)
        f = lambda *s, scale=1.0: (r.standard_normal(s) * scale).astype(np.float32)
        q, k = f(L, Hk, Dk, scale=Dk ** -0.5), f(L, Hk, Dk, scale=Dk ** -0.5)
        v = f(L, Hv, Dv)
        a, b = f(L, Hv, scale=2.0), f(L, Hv, scale=2.0)
        a[0, 0] = 30.0  # softplus's linear region
        A_log = np.log(r.uniform(0.5, 16, Hv)).astype(np.float32)
        dt_bias = f(Hv, scale=0.5)
        state = f(Hv, Dv, Dk, scale=0.1)
        y, s = gated_delta_update(
            mx.array(q)[None], mx.array(k)[None], mx.array(v)[None], mx.array(a)[None], mx.array(b)[None],
            mx.array(A_log), mx.array(dt_bias), mx.array(state)[None], use_kernel=False)
        g = compute_g(mx.array(A_log), mx.array(a), mx.array(dt_bias))
        beta = mx.sigmoid(mx.array(b))
        mx.eval(y, s, g, beta)
        cases.append({
            "name": name, "L": L, "Hk": Hk, "Hv": Hv, "Dk": Dk, "Dv": Dv,
            "q": b64(q), "k": b64(k), "v": b64(v), "a": b64(a), "b": b64(b),
            "A_log": b64(A_log), "dt_bias": b64(dt_bias), "state": b64(state),
            "y": b64(np.array(y[0])), "state_out": b64(np.array(s[0])),
            "g": b64(np.array(g)), "beta": b64(np.array(beta)),
        })
    with open(OUT, "w") as fp:
        json.dump({
            "generator": "scripts/reference/gated_delta_reference.py",
            "mlx_version": importlib.metadata.version("mlx"),
            "mlx_lm_version": importlib.metadata.version("mlx-lm"),
            "device": "cpu",
            "cases": cases,
        }, fp, indent=1)
        fp.write("\n")
    print("wrote", OUT)


if __name__ == "__main__":
    main()
