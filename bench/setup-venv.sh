#!/usr/bin/env bash
# Creates (once) the benchmark's own Python virtualenv under $EBBFLOW_CACHE/bench-venv and installs
# bench/requirements.txt into it. Idempotent: a no-op until the requirements file changes.
# Prints the venv's python path as its only stdout line.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache="${EBBFLOW_CACHE:-$HOME/.cache/ebbflow}"
venv="$cache/bench-venv"
requirements="$here/requirements.txt"
stamp="$venv/.requirements.sha256"
want="$(sha256sum "$requirements" | cut -d' ' -f1)"

if [[ ! -x "$venv/bin/python" ]]; then
    mkdir -p "$cache"
    "${PYTHON:-python3}" -m venv "$venv" >&2
fi
if [[ ! -f "$stamp" || "$(cat "$stamp")" != "$want" ]]; then
    echo "==> installing $requirements into $venv (torch is large; this takes a while once)" >&2
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip setuptools wheel >&2
    # scikit-surprise builds from source against the numpy pinned above.
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check numpy==1.26.4 Cython >&2
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-build-isolation \
        -r "$requirements" >&2
    echo "$want" >"$stamp"
fi
echo "$venv/bin/python"
