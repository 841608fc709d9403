"""Make a view of a Llama model directory that mlx-lm 0.31.1 can pipeline, for
scripts/reference/tensor_vs_mlxlm.py with PIPELINE=1:

  python scripts/reference/mlxlm_pipeline_view.py SRC_DIR OUT_DIR

mlx-lm pipelines (sharded_load with a pipeline group) only the model types
that have a pipeline() (DeepSeek V2/V3, GLM-4 MoE, Ministral 3). Ministral 3
is Llama's layers plus a per-position attention scale 1 + beta·log(1 +
floor(pos / original_max_position_embeddings)); with beta 0 it is exactly
Llama. OUT_DIR gets SRC_DIR's config.json with model_type "ministral3" and
rope_parameters (the rope scaling, rope_theta, llama_4_scaling_beta 0) added
— exo reads `architectures`, unchanged — a model.safetensors.index.json
(which mlx-lm's pipeline loading requires), and links to the other files."""
import json
import os
import struct
import sys

src, out = sys.argv[1], sys.argv[2]
os.makedirs(out, exist_ok=True)
cfg = json.load(open(os.path.join(src, "config.json")))
rope = dict(cfg.get("rope_scaling") or {"rope_type": "default"})
rope["rope_theta"] = cfg.get("rope_theta", 10000.0)
rope["llama_4_scaling_beta"] = 0.0
rope.setdefault("original_max_position_embeddings", cfg.get("max_position_embeddings", 4096))
cfg["model_type"] = "ministral3"
cfg["rope_parameters"] = rope
json.dump(cfg, open(os.path.join(out, "config.json"), "w"), indent=2)
weights = {}
for name in sorted(os.listdir(src)):
    if name == "config.json":
        continue
    dst = os.path.join(out, name)
    if not os.path.exists(dst):
        os.symlink(os.path.abspath(os.path.join(src, name)), dst)
    if name.endswith(".safetensors"):
        with open(os.path.join(src, name), "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            for k in json.loads(f.read(n)):
                if k != "__metadata__":
                    weights[k] = name
if not os.path.exists(os.path.join(out, "model.safetensors.index.json")):
    json.dump({"metadata": {}, "weight_map": weights}, open(os.path.join(out, "model.safetensors.index.json"), "w"))
print(f"{out}: {len(weights)} tensors, model_type ministral3 (beta 0)")
