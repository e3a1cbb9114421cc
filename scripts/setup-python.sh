#!/usr/bin/env bash
# Creates (once) the Python virtualenv the tests use and installs scripts/requirements-test.txt
# into it. Idempotent and cached: re-running is a no-op until the requirements file changes.
# Prints the venv's python path as its only stdout line, so callers can do
#   export EBBFLOW_PYTHON="$(scripts/setup-python.sh)"
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="${EBBFLOW_CACHE:-$HOME/.cache/ebbflow}"
venv="$cache/venv"
requirements="$repo/scripts/requirements-test.txt"
stamp="$venv/.requirements.sha256"

base_python="${PYTHON:-python3}"
want="$(sha256sum "$requirements" | cut -d' ' -f1)"

if [[ ! -x "$venv/bin/python" ]]; then
    mkdir -p "$cache"
    "$base_python" -m venv "$venv" >&2
fi
if [[ ! -f "$stamp" || "$(cat "$stamp")" != "$want" ]]; then
    echo "==> installing $requirements into $venv" >&2
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
        -r "$requirements" >&2
    echo "$want" >"$stamp"
fi
echo "$venv/bin/python"
