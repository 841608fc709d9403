# Sourced by nix/tests/check.sh: evaluates nix/tests/eval.nix (pure helpers,
# no nixpkgs) and compares every attribute with nix/tests/fixtures/<name>.
# NIX_UPDATE_FIXTURES=1 rewrites the fixtures instead (review the diff!).
evaljson=$(mktemp)
if ! nixi --eval --strict --json nix/tests/eval.nix >"$evaljson"; then
	echo "FAIL eval: nix/tests/eval.nix" >&2
	fail=1
elif ! python3 - "$evaljson" nix/tests/fixtures "${NIX_UPDATE_FIXTURES:-0}" <<'PY'; then
import difflib, json, os, sys
got = json.load(open(sys.argv[1]))
fixdir, update = sys.argv[2], sys.argv[3] == "1"
bad = False
for name, text in sorted(got.items()):
    path = os.path.join(fixdir, name)
    if update:
        with open(path, "w") as f:
            f.write(text)
        print("wrote", path)
        continue
    try:
        want = open(path).read()
    except FileNotFoundError:
        print(f"FAIL eval: no fixture {path}", file=sys.stderr)
        bad = True
        continue
    if want != text:
        bad = True
        print(f"FAIL eval: {name} differs from {path}:", file=sys.stderr)
        sys.stderr.writelines(difflib.unified_diff(want.splitlines(True), text.splitlines(True), path, "evaluated"))
    else:
        print(f"ok   eval: {name}")
for f in sorted(os.listdir(fixdir)):
    if f not in got:
        print(f"FAIL eval: fixture {f} is not produced by eval.nix", file=sys.stderr)
        bad = True
sys.exit(1 if bad else 0)
PY
	fail=1
fi
rm -f "$evaljson"

# The example cluster file must evaluate through the same port rules
# (builtins.fromTOML reads it as the module reads services.exo.settings).
if [ -f etc/exo/cluster.example.toml ]; then
	if nixi --eval --strict -E 'let lib = import ./nix/lib; s = builtins.fromTOML (builtins.readFile ./etc/exo/cluster.example.toml); in map (h: lib.hostPorts { settings = s; host = h; }) (builtins.attrNames s.hosts)' >/dev/null; then
		echo "ok   eval: hostPorts over etc/exo/cluster.example.toml"
	else
		echo "FAIL eval: hostPorts over etc/exo/cluster.example.toml" >&2
		fail=1
	fi
fi

# etc/ ships the same unit and plist for installs without Nix. A difference
# is reported; it fails the check when EXO_NIX_STRICT_ETC=1.
for pair in "exo.service:etc/systemd/exo.service" "org.exo-pd.exo.plist:etc/launchd/org.exo-pd.exo.plist"; do
	fx=nix/tests/fixtures/${pair%%:*}
	etcf=${pair#*:}
	if [ ! -f "$etcf" ]; then
		echo "note: $etcf absent (copy $fx there)"
	elif ! diff -u "$etcf" "$fx" >&2; then
		if [ "${EXO_NIX_STRICT_ETC:-0}" = 1 ]; then
			echo "FAIL: $etcf is not what nix/lib renders ($fx)" >&2
			fail=1
		else
			echo "warning: $etcf is not what nix/lib renders ($fx)" >&2
		fi
	else
		echo "ok   etc: $etcf matches $fx"
	fi
done
