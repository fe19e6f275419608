#!/usr/bin/env bash
# Build (or reuse) a venv holding the newest releases that pyproject.toml allows (clef's ranges and
# its test extra), as a fresh `pip install clef-cli` gets them today, with torch pinned as .ci/run
# pins it (the golden values' torch). Prints the venv's path on stdout; logs go to stderr.
# pip resolves first (--dry-run, about a minute); the venv lives outside the clone in
# $CLEF_VENV_CACHE (default ~/.cache/clef/venvs), named by a hash of what was resolved, so it is
# rebuilt (a few minutes) only when a new release lands; the older newest-* venvs are removed then.
# clef itself is not installed into it (the venv outlives the clone): the caller installs it from
# its clone, editable and without dependencies.
# Use: CLEF_NEWEST_VENV="$(.ci/newest_venv.sh)"; "$CLEF_NEWEST_VENV/bin/python" -m pip install --no-deps -e .
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
cache="${CLEF_VENV_CACHE:-$HOME/.cache/clef/venvs}"
mkdir -p "$cache"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
python3 -m pip install --quiet --dry-run --ignore-installed --report "$work/report.json" \
    -r "$here/torch.txt" -e "$root[test]" >&2
python3 - "$work/report.json" >"$work/resolved.txt" <<'EOF'
import json, sys
items = json.load(open(sys.argv[1]))["install"]
pins = {f"{i['metadata']['name']}=={i['metadata']['version']}" for i in items if i["metadata"]["name"] != "clef-cli"}
print("\n".join(sorted(pins, key=str.lower)))
EOF
hash="$( (cat "$work/resolved.txt" "$here/newest_venv.sh"; python3 --version) | sha256sum | cut -c1-16)"
venv="$cache/newest-$hash"
if [ ! -f "$venv/.complete" ]; then
    # A venv's scripts carry its absolute path, so it is built at its final path, then marked complete.
    for old in "$cache"/newest-*; do [ -e "$old" ] && rm -rf "$old"; done
    start=$SECONDS
    python3 -m venv "$venv" >&2
    "$venv/bin/python" -m pip install --quiet --upgrade pip >&2
    "$venv/bin/python" -m pip install --quiet --no-deps -r "$work/resolved.txt" >&2
    cp "$work/resolved.txt" "$venv/resolved.txt"
    echo "built $venv in $((SECONDS - start)) s" >&2
    touch "$venv/.complete"
fi
grep -i -E '^(transformers|tokenizers|pyarrow|datasets|numpy|torch|av|pillow)==' "$venv/resolved.txt" | tr '\n' ' ' >&2
echo >&2
echo "$venv"
