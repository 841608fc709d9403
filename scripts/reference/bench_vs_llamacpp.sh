#!/usr/bin/env bash
# Engine (cpu backend) against llama.cpp on SmolLM2-135M-Instruct.Q4_1.gguf,
# in one run so both see the same machine load: llama.cpp with 2 threads
# (OMP_WAIT_POLICY=passive: spinning OpenMP barriers collapse on a shared,
# oversubscribed machine) and 1 thread, the engine's Go benchmarks (128-token
# prompt), then llama.cpp again with a 512-token prompt. Run by hand from the
# repository root after `pip install llama-cpp-python`.
set -euo pipefail
cd "$(dirname "$0")/../.."
b=scripts/reference/llama_cpp_bench.py
uptime
OMP_WAIT_POLICY=passive python3 $b --prompt 128 --decode 64 --reps 2 --threads 2
python3 $b --prompt 128 --decode 64 --reps 2 --threads 1
go test -run XXX -bench SmolLM2 -benchtime 10x -count 2 ./runners/engine/ | grep -E '^Benchmark'
OMP_WAIT_POLICY=passive python3 $b --prompt 512 --decode 64 --reps 2 --threads 2
uptime
