#!/usr/bin/env bash
# Nix checks that need no nixpkgs and no Nix store (what CI can run with
# Debian's nix-bin): every .nix file must parse, the pure helpers under
# nix/lib must evaluate to the expected output committed in nix/tests/fixtures,
# flake.lock must lock flake.nix's inputs, the MLX wheel pins must match
# PyPI, and nix/package.nix's vendorHash must match `go mod vendor` (Go proxy).
# With EXO_NIXPKGS_LIB=/path/to/nixpkgs/lib it also evaluates the modules and
# the flake's outputs (nix/tests/{module,flake}-eval.nix). NIX_UPDATE_FIXTURES=1
# rewrites the fixtures. Runs every check, then exits non-zero if any failed.
set -euo pipefail
cd "$(dirname "$0")/../.."

if ! command -v nix-instantiate >/dev/null 2>&1; then
	echo "nix-instantiate not found (apt-get install nix-bin)" >&2
	exit 1
fi

# Evaluation must not touch a Nix store or daemon: read-only mode, and a
# private state directory so it works for root and for ordinary users alike.
export NIX_REMOTE=""
NIX_STATE_DIR=$(mktemp -d)
export NIX_STATE_DIR
trap 'rm -rf "$NIX_STATE_DIR"' EXIT
nixi() { nix-instantiate --readonly-mode "$@"; }

fail=0
n=0
while IFS= read -r -d '' f; do
	n=$((n + 1))
	if ! nixi --parse "$f" >/dev/null; then
		echo "FAIL parse: $f" >&2
		fail=1
	fi
done < <(git ls-files -z --cached --others --exclude-standard -- '*.nix' 2>/dev/null ||
	find . -name .git -prune -o -name '*.nix' -print0)
echo "parsed $n .nix files"
if [ "$n" -eq 0 ]; then
	echo "FAIL: found no .nix files" >&2
	fail=1
fi

if [ -f nix/tests/eval.sh ]; then
	# shellcheck source=/dev/null
	. nix/tests/eval.sh
fi

# The modules under nixpkgs' module system with stand-ins for the NixOS and
# nix-darwin options they set, and the flake's outputs against a stand-in
# nixpkgs (packages return their attributes). Both need a checkout of
# nixpkgs' lib/ (e.g. nix-community/nixpkgs.lib); CI has none, so these run
# only when EXO_NIXPKGS_LIB names one.
if [ -n "${EXO_NIXPKGS_LIB:-}" ]; then
	export EXO_NIXPKGS_LIB
	for t in module-eval flake-eval; do
		got=$(mktemp)
		fx=nix/tests/fixtures-modules/$t.json
		if nixi --eval --strict --json "nix/tests/$t.nix" --arg lib "import $EXO_NIXPKGS_LIB" -A report >"$got" &&
			python3 -c 'import json,sys; print(json.dumps(json.load(open(sys.argv[1])), indent=1, sort_keys=True))' "$got" >"$got.pretty"; then
			if [ "${NIX_UPDATE_FIXTURES:-0}" = 1 ]; then
				cp "$got.pretty" "$fx"
				echo "wrote $fx"
			elif diff -u "$fx" "$got.pretty" >&2; then
				echo "ok   eval: $t under nixpkgs lib ($EXO_NIXPKGS_LIB)"
			else
				echo "FAIL eval: $t differs from $fx" >&2
				fail=1
			fi
		else
			echo "FAIL eval: nix/tests/$t.nix" >&2
			fail=1
		fi
		rm -f "$got" "$got.pretty"
	done
else
	echo "note: EXO_NIXPKGS_LIB not set; modules and flake outputs not evaluated (only parsed)"
fi

# flake.lock must lock exactly flake.nix's inputs, each by a full revision
# (nix/tests/lock-check.nix; no store or network needed).
if problems=$(nixi --eval --strict --json nix/tests/lock-check.nix) && [ "$problems" = "[]" ]; then
	echo "ok   flake.lock locks flake.nix's inputs by revision"
else
	echo "FAIL flake.lock: ${problems:-nix/tests/lock-check.nix did not evaluate}" >&2
	fail=1
fi

# The PyPI files pinned in nix/ (the MLX wheels of nix/mlx-wheels.json,
# the SmolLM2 wheel): URL and sha256 as PyPI's index
# lists them (scripts/check-nix-pypi-pins --download also hashes the bytes).
if [ "${EXO_NIX_OFFLINE:-0}" = 1 ]; then
	echo "note: EXO_NIX_OFFLINE=1; MLX wheel pins not compared with PyPI"
else
	scripts/check-nix-pypi-pins || fail=1
fi

# vendorHash in nix/package.nix must be the NAR hash of `go mod vendor` for
# this tree (what buildGoModule's goModules derivation produces).
if command -v go >/dev/null 2>&1; then
	nix/update-vendor-hash.sh --check || fail=1
else
	echo "note: go not found; vendorHash not checked"
fi

if [ "$fail" -ne 0 ]; then
	echo "nix checks failed" >&2
	exit 1
fi
echo "nix checks ok"
