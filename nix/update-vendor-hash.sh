#!/usr/bin/env bash
# Computes vendorHash for nix/package.nix the way buildGoModule's goModules
# derivation does: `go mod vendor` on the flake's source (the files git
# tracks, as a flake sees them), then the NAR hash of vendor/.
# Needs Go (the go.mod version, GOTOOLCHAIN=local) and nix-bin's nix-hash.
#   nix/update-vendor-hash.sh           print the hash
#   nix/update-vendor-hash.sh --write   also write it into nix/package.nix
#   nix/update-vendor-hash.sh --check   fail when nix/package.nix differs
# EXO_VENDOR_FROM=HEAD uses the last commit instead of the working tree.
set -euo pipefail
cd "$(dirname "$0")/.."

tmp=$(mktemp -d)
trap 'chmod -R u+w "$tmp" 2>/dev/null; rm -rf "$tmp"' EXIT
if [ "${EXO_VENDOR_FROM:-}" = HEAD ]; then
	git archive HEAD | tar -x -C "$tmp"
elif git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
	git ls-files -z --cached | while IFS= read -r -d '' f; do
		[ -e "$f" ] && printf '%s\0' "$f"
	done | xargs -0 cp --parents -t "$tmp"
else
	# Not a git checkout (e.g. an exported tree): take every file.
	tar -c --exclude=./.git --exclude=./vendor . | tar -x -C "$tmp"
fi
(cd "$tmp" && rm -rf vendor && GOFLAGS= GOTOOLCHAIN=local GOWORK=off go mod vendor)
mkdir -p "$tmp/vendor"
base32=$(nix-hash --type sha256 --base32 "$tmp/vendor")
sri=$(nix --extra-experimental-features nix-command hash to-sri "sha256:$base32")

current=$(sed -n 's/^ *vendorHash = "\(.*\)";.*/\1/p' nix/package.nix)
case "${1:-}" in
--write)
	sed -i "s|^\( *vendorHash = \)\".*\";|\1\"$sri\";|" nix/package.nix
	echo "vendorHash = $sri (written to nix/package.nix)"
	;;
--check)
	if [ "$current" != "$sri" ]; then
		echo "FAIL vendorHash: nix/package.nix has $current, go mod vendor gives $sri" >&2
		echo "     run nix/update-vendor-hash.sh --write and commit nix/package.nix" >&2
		exit 1
	fi
	echo "ok   vendorHash $sri"
	;;
*) echo "$sri" ;;
esac
