#!/usr/bin/env bash
# Build (or reuse) the vLLM engine's venv and print its path on stdout; logs go to stderr.
# The venv lives outside the clone, in $CLEF_VENV_CACHE (default ~/.cache/clef/venvs), named by a
# hash of the pinned inputs, so an unchanged pin set is reused across clones and CI runs.
# Use: CLEF_VLLM_PYTHON="$(.ci/vllm_venv.sh)/bin/python"
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
req="$here/vllm-requirements.txt"
over="$here/vllm-overrides.txt"
hash="$(cat "$req" "$over" "$here/vllm_venv.sh" | sha256sum | cut -c1-16)"
cache="${CLEF_VENV_CACHE:-$HOME/.cache/clef/venvs}"
venv="$cache/vllm-$hash"
if [ -f "$venv/.complete" ]; then
    echo "$venv"
    exit 0
fi
mkdir -p "$cache"
# A venv's scripts carry its absolute path, so it is built at its final path, then marked complete.
rm -rf "$venv"
python3 -m venv "$venv" >&2
pip=("$venv/bin/python" -m pip)
start=$SECONDS
"${pip[@]}" install --quiet --upgrade pip >&2
"${pip[@]}" install --quiet -r "$req" >&2
# Stage 2 from the package index alone: no local find-links (config file or $PIP_FIND_LINKS),
# which would offer torch 2.13.0+cpu again (a local version sorts above the plain one).
cert=()
[ -f /etc/ssl/certs/ca-certificates.crt ] && cert=(--cert /etc/ssl/certs/ca-certificates.crt)
env -u PIP_FIND_LINKS -u PIP_CONSTRAINT PIP_CONFIG_FILE=/dev/null \
    "${pip[@]}" install --quiet "${cert[@]}" --force-reinstall -r "$over" >&2
"${pip[@]}" uninstall --quiet -y torchaudio torchcodec >&2 || true
"$venv/bin/python" -c "import vllm, torch, torchvision; print('vllm', vllm.__version__, 'torch', torch.__version__)" >&2
echo "built $venv in $((SECONDS - start)) s" >&2
touch "$venv/.complete"
echo "$venv"
