# Count the MLX operations in one mlx-lm decode step (the graph generate_step
# builds for one token: model, logsumexp, argmax), by primitive, from
# mx.export_to_dot, without evaluating anything; and the dtypes of the
# logits and of what argmax reads. Used for docs/BENCHMARKS.md's "what each
# side computes" (exo's counterpart: BenchmarkDecodeOverlap's arrays/step).
# usage: mlxlm_step_ops.py MODEL_DIR [DOT_FILE]
import collections, re, sys
from pathlib import Path
import mlx.core as mx
from mlx_lm.utils import load_model
from mlx_lm.models.cache import make_prompt_cache

mx.set_default_device(mx.cpu)
model, config = load_model(Path(sys.argv[1]), lazy=True)
cache = make_prompt_cache(model)
logits = model(mx.array([[1]]), cache=cache)[:, -1, :]
logprobs = logits - mx.logsumexp(logits, keepdims=True)
y = mx.argmax(logprobs, axis=-1)
print(f"logits dtype {logits.dtype}, argmax reads {logprobs.dtype}")
dot = sys.argv[2] if len(sys.argv) > 2 else "/dev/stdout"
with open(dot if len(sys.argv) > 2 else "/tmp/mlxlm_step.dot", "w") as f:
    mx.export_to_dot(f, y)
text = open(dot if len(sys.argv) > 2 else "/tmp/mlxlm_step.dot").read()
ops = collections.Counter(m.group(1) for m in re.finditer(r'label\s*=\s*"?([A-Za-z_]+)', text))
arrays = [k for k in ops if k[0].islower()]
print(f"{sum(v for k, v in ops.items() if k[0].isupper())} primitive nodes:", ", ".join(f"{k} {v}" for k, v in ops.most_common() if k[0].isupper()))
