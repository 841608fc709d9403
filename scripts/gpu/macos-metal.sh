#!/usr/bin/env bash
# Verifies an Apple Silicon Mac for exo's MLX Metal backend: the pinned
# mlx-metal wheel in a venv (libmlx.dylib + mlx.metallib; no Xcode needed),
# mlx-c v0.6.0 built against it (Command Line Tools: clang, plus cmake), the
# mlx-tagged tests on the GPU, `exo bench` prefill on SmolLM2 and a generated
# tiny model served on MLX Metal, and `exo doctor`.
#   scripts/gpu/macos-metal.sh       results in ./gpu-results (EXO_GPU_OUT)
. "$(dirname "$0")/common.sh"

[ "$(uname -s)/$(uname -m)" = Darwin/arm64 ] || { echo "needs macOS on Apple Silicon" >&2; exit 1; }
say "Mac"
sysctl -n machdep.cpu.brand_string hw.memsize | tee -a "$OUT/summary.txt"
sw_vers -productVersion | tee -a "$OUT/summary.txt"
install_mlx metal aarch64-darwin
build_mlxc
mlx_tests
serve_and_bench metal
say "done: $OUT"
