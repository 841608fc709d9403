#!/usr/bin/env bash
# The mlx backend against mlx-lm on MLX's CPU backend, in one run so both see
# the same machine load. Rounds alternate which side goes first; each side
# times 3 prefills of 256 tokens (after one untimed) and greedy decode after a
# 128-token prompt. Both sides run on the same libmlx: mlx-lm's bindings get
# $PREFIX/lib/libmlx.so by LD_PRELOAD (PyPI's x86 CPU wheel uses a reference
# BLAS that is ~25x slower). Run by hand from the repository root:
#
#   PREFIX=/path/to/mlx-and-mlx-c/prefix MODEL=/tmp/smol-f32 \
#     scripts/reference/bench_vs_mlxlm.sh 1 2 3 4
#
# with `pip install mlx[cpu]==0.31.2 mlx-lm` and MLX/mlx-c built as the
# README's MLX section says. MODEL is written by the first Go run if absent
# (random weights, SmolLM2-135M's shapes; EXO_MLX_BENCH_DTYPE=bf16 for bf16).
set -euo pipefail
cd "$(dirname "$0")/../.."
: "${PREFIX:?set PREFIX to the prefix holding lib/libmlx.so and lib/libmlxc.so}"
: "${MODEL:?set MODEL to the benchmark model directory}"
DECODE=${DECODE:-16}
test=$(mktemp -d)/mlx.test
go test -c -tags mlx -o "$test" ./runners/engine/mlx/
export EXO_MLXC_PATH=$PREFIX/lib/libmlxc.so EXO_MLX_BENCH_MODEL=$MODEL
exo() {
	EXO_MLX_BENCH_PREFILL=256 "$test" -test.run XXX -test.bench BenchmarkPrefill -test.benchtime 1x -test.count 3 | grep ^Bench
	"$test" -test.run XXX -test.bench BenchmarkDecode -test.benchtime "${DECODE}x" -test.count 3 | grep ^Bench
}
lm() { LD_PRELOAD=$PREFIX/lib/libmlx.so python3 scripts/reference/mlxlm_bench.py "$MODEL" 128 256 "$DECODE" 3; }
"$test" -test.run XXX -test.bench BenchmarkPrefill -test.benchtime 1x >/dev/null # writes MODEL if absent
rounds=("$@")
((${#rounds[@]})) || rounds=(1 2)
for round in "${rounds[@]}"; do
	echo "== round $round $(date -u +%T) load $(cut -d' ' -f1 /proc/loadavg)"
	if ((round % 2)); then lm; exo; else exo; lm; fi
done
