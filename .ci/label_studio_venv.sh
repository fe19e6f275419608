#!/usr/bin/env bash
# Build (or reuse) the Label Studio venv the tests start a real server from, and print its path on
# stdout; logs go to stderr. Label Studio 1.23 pins other numpy and pyarrow than clef, so it has an
# environment of its own, outside the clone in $CLEF_VENV_CACHE (default ~/.cache/clef/venvs),
# named by a hash of its pins, so an unchanged pin set is reused across clones and CI runs (a
# build takes about 5 minutes on a 2-core machine).
# Use: CLEF_LABEL_STUDIO_VENV="$(.ci/label_studio_venv.sh)"
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
req="$here/label-studio-requirements.txt"
hash="$( (cat "$req" "$here/label_studio_venv.sh"; python3 --version) | sha256sum | cut -c1-16)"
cache="${CLEF_VENV_CACHE:-$HOME/.cache/clef/venvs}"
venv="$cache/label-studio-$hash"
if [ -f "$venv/.complete" ] && [ -x "$venv/bin/label-studio" ]; then
    echo "$venv"
    exit 0
fi
mkdir -p "$cache"
# A venv's scripts carry its absolute path, so it is built at its final path, then marked complete.
rm -rf "$venv"
python3 -m venv "$venv" >&2
start=$SECONDS
"$venv/bin/python" -m pip install --quiet --upgrade pip >&2
"$venv/bin/python" -m pip install --quiet -r "$req" >&2
echo "built $venv in $((SECONDS - start)) s" >&2
touch "$venv/.complete"
echo "$venv"
