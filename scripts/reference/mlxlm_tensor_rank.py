"""One rank of mlx-lm's tensor-parallel decode (Model.shard over MLX's ring),
or with a 4th argument "pipeline" of its pipeline (sharded_load with a
pipeline group: this rank's layers only), for scripts/reference/tensor_vs_mlxlm.py. Without MLX_RANK it runs the whole
model in one process. Prints one JSON line on rank 0: decode tok/s of each
timed generation (greedy, DECODE tokens after a fixed 32-token prompt; the
time from the first generated token to the last)."""
import json
import os
import sys
import time

import mlx.core as mx
from mlx_lm import load
from mlx_lm.generate import generate_step

model_dir, decode, reps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
pipeline = len(sys.argv) > 4 and sys.argv[4] == "pipeline"
group = None
if "MLX_RANK" in os.environ:
    group = mx.distributed.init(strict=True, backend="ring")
if pipeline:
    from mlx_lm.utils import sharded_load
    model, _ = sharded_load(model_dir, pipeline_group=group)
else:
    model, _ = load(model_dir)
    if group is not None:
        model.shard(group)
mx.eval(model.parameters())
prompt = mx.array([(i * 37 + 11) % 500 for i in range(32)], dtype=mx.uint32)
rates = []
for rep in range(reps + 1):
    times = []
    for _tok, _ in generate_step(prompt, model, max_tokens=decode + 1):
        times.append(time.perf_counter())
    if rep > 0:  # the first generation warms up
        rates.append(decode / (times[-1] - times[0]))
if group is None or group.rank() == 0:
    print(json.dumps({"ranks": 1 if group is None else group.size(), "decode_tok_s": rates}), flush=True)
