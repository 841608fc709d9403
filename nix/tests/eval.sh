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

# etc/ ships the same unit and plist for installs without Nix: they must say
# what nix/lib renders (compared as settings: comments, blank lines and
# order do not matter). EXO_NIX_STRICT_ETC=0 turns a difference into a warning.
for pair in "exo.service:etc/systemd/exo.service" "org.exo-pd.exo.plist:etc/launchd/org.exo-pd.exo.plist"; do
	fx=nix/tests/fixtures/${pair%%:*}
	etcf=${pair#*:}
	if [ ! -f "$etcf" ]; then
		echo "note: $etcf absent (copy $fx there)"
	elif python3 - "$etcf" "$fx" <<'PY'; then
import plistlib, sys
def unit(path):
    sec, out = None, []
    for line in open(path):
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            sec = line
            continue
        k, _, v = line.partition("=")
        out.append((sec, k.strip(), v.strip()))
    return sorted(out)
a, b = sys.argv[1], sys.argv[2]
if a.endswith(".plist"):
    x, y = plistlib.load(open(a, "rb")), plistlib.load(open(b, "rb"))
    diff = sorted(k for k in set(x) | set(y) if x.get(k) != y.get(k))
    for k in diff:
        print(f"  {k}: {a} has {x.get(k)!r}, nix/lib renders {y.get(k)!r}", file=sys.stderr)
else:
    x, y = unit(a), unit(b)
    diff = sorted(set(x) ^ set(y))
    for d in diff:
        where = a if d in x else "nix/lib"
        print(f"  only in {where}: {d[0]} {d[1]}={d[2]}", file=sys.stderr)
sys.exit(1 if diff else 0)
PY
		echo "ok   etc: $etcf says what nix/lib renders"
	elif [ "${EXO_NIX_STRICT_ETC:-1}" = 1 ]; then
		echo "FAIL: $etcf is not in step with nix/lib/default.nix (fixture $fx)" >&2
		fail=1
	else
		echo "warning: $etcf is not in step with nix/lib/default.nix (fixture $fx)" >&2
	fi
done
