#!/usr/bin/env bash
# Verifies a Linux NVIDIA host (a DGX Spark, or any GPU with a CUDA 13
# driver) for exo's MLX CUDA backend: the pinned mlx-cuda-13 wheel in a venv
# (with NVIDIA's cuBLAS/NVRTC/cuDNN/NCCL wheels it depends on), mlx-c v0.6.0
# built against it, the mlx-tagged tests on the GPU, `exo bench` prefill on
# SmolLM2 and a generated tiny model served on MLX CUDA, and `exo doctor`.
#   scripts/gpu/linux-cuda.sh        results in ./gpu-results (EXO_GPU_OUT)
. "$(dirname "$0")/common.sh"

command -v nvidia-smi >/dev/null || { echo "nvidia-smi not found: install the NVIDIA driver" >&2; exit 1; }
say "GPU"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee -a "$OUT/summary.txt"
cuda=$(nvidia-smi | sed -n 's/.*CUDA Version: \([0-9]*\)\..*/\1/p' | head -1)
if [ "${cuda:-0}" -lt 13 ]; then
	echo "the driver supports CUDA ${cuda:-?}; mlx-cuda-13 needs a CUDA 13 driver (580 or newer)" >&2
	exit 1
fi
case $(uname -m) in
aarch64) sys=aarch64-linux ;;
x86_64) sys=x86_64-linux ;;
*) echo "no mlx-cuda-13 wheel for $(uname -m)" >&2; exit 1 ;;
esac
install_mlx cuda "$sys"
build_mlxc
mlx_tests
serve_and_bench cuda
say "done: $OUT"
