#!/usr/bin/env python3
"""Writes runners/kvwire/testdata/e4m3_ref.txt: float32 -> float8_e4m3fn
(ml_dtypes, the independent reference) for edge cases and random values,
and every e4m3 byte widened to float32.

Run: /work/venv/bin/python scripts/fp8/e4m3_fixture.py  (ml_dtypes 0.7.0)
"""
import numpy as np
import ml_dtypes

rng = np.random.default_rng(15)
edge = [0.0, -0.0, 448.0, -448.0, 464.0, 465.0, 480.0, 1e9, np.inf, -np.inf,
        2.0**-6, 2.0**-7, 2.0**-9, 2.0**-10, 2.0**-10 * 1.0001, 3 * 2.0**-10,
        2.0**-9 * 1.5, 2.0**-9 * 2.5, 1.0, 1.0625, 1.1875, 1.0625 * 1.0001,
        240.0, 232.0, 248.0, 1e-30, -1e-30, np.float32(1.4e-45)]
vals = np.concatenate([
    np.array(edge, dtype=np.float32),
    rng.standard_normal(3000).astype(np.float32) * 50,
    (rng.standard_normal(1000) * 0.01).astype(np.float32),
    # exact ties between neighbouring e4m3 values
    (np.arange(0, 126, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32) +
     np.arange(1, 127, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)) / 2,
]).astype(np.float32)
q = vals.astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
allb = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)
with open("runners/kvwire/testdata/e4m3_ref.txt", "w") as f:
    f.write("# float32 bits -> e4m3fn byte (ml_dtypes %s, scripts/fp8/e4m3_fixture.py)\n" % ml_dtypes.__version__)
    for v, b in zip(vals.view(np.uint32), q):
        f.write("enc %08x %02x\n" % (v, b))
    for i, v in enumerate(allb.view(np.uint32)):
        f.write("dec %02x %08x\n" % (i, v))
