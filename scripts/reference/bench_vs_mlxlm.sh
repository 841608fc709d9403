#!/usr/bin/env bash
# The mlx backend against mlx-lm on MLX's CPU backend, in one run so both see
# the same machine load. For decode, decode_vs_mlxlm.py is the fairer tool
# (both sides resident, repetitions alternating one by one, every issue-31
# configuration, one table); this script remains for prefill. Rounds alternate which side goes first; each side
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
#
# Where mlx-c is linked against the very libmlx.so that mlx-lm's wheel ships
# (the same file), give MLXC=path/to/libmlxc.so and PY=that venv's python
# instead of PREFIX: no LD_PRELOAD is needed. PREFILL=0 skips prefill.
# BENCH picks exo's decode benchmarks (default 'BenchmarkDecode$'; e.g.
# 'BenchmarkDecode(Overlap)?$' adds the overlapped steps of batch sizes
# $EXO_MLX_BENCH_BATCHES); BATCH > 1 adds mlx-lm's batched decode. COUNT
# and REPS (default 3) are exo's -test.count and mlx-lm's repetitions.
# EXO_MLX_BENCH_TEMP (and EXO_MLX_BENCH_TOPP) > 0 samples on both sides
# (exo: seeded, on the device in the overlapped steps; mlx-lm: make_sampler).
set -euo pipefail
cd "$(dirname "$0")/../.."
if [[ -z ${MLXC:-} ]]; then
	: "${PREFIX:?set PREFIX to the prefix holding lib/libmlx.so and lib/libmlxc.so, or MLXC}"
	MLXC=$PREFIX/lib/libmlxc.so
	export LD_PRELOAD_LM=$PREFIX/lib/libmlx.so
fi
: "${MODEL:?set MODEL to the benchmark model directory}"
PY=${PY:-python3}
DECODE=${DECODE:-16}
PREFILL=${PREFILL:-256}
test=$(mktemp -d)/mlx.test
go test -c -tags mlx -o "$test" ./runners/engine/mlx/
export EXO_MLXC_PATH=$MLXC EXO_MLX_BENCH_MODEL=$MODEL
exo() {
	if ((PREFILL)); then
		EXO_MLX_BENCH_PREFILL=$PREFILL "$test" -test.run XXX -test.bench BenchmarkPrefill -test.benchtime 1x -test.count 3 | grep ^Bench
	fi
	"$test" -test.run XXX -test.bench "${BENCH:-BenchmarkDecode\$}" -test.benchtime "${DECODE}x" -test.count "${COUNT:-3}" | grep ^Bench
}
lm() {
	LD_PRELOAD=${LD_PRELOAD_LM:-} SAMPLE_TEMP=${EXO_MLX_BENCH_TEMP:-0} SAMPLE_TOP_P=${EXO_MLX_BENCH_TOPP:-0} \
		"$PY" scripts/reference/mlxlm_bench.py "$MODEL" 128 "$PREFILL" "$DECODE" "${REPS:-3}" "${BATCH:-1}"
}
[[ -f $MODEL/config.json ]] || "$test" -test.run XXX -test.bench BenchmarkPrefill -test.benchtime 1x >/dev/null # writes MODEL
rounds=("$@")
((${#rounds[@]})) || rounds=(1 2)
for round in "${rounds[@]}"; do
	echo "== round $round $(date -u +%T) load $(cut -d' ' -f1 /proc/loadavg)"
	if ((round % 2)); then lm; exo; else exo; lm; fi
done
