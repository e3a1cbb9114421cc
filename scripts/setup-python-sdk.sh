#!/usr/bin/env bash
# Builds the Python SDK's wheel (python/, maturin) and installs it into the test venv, once per
# change of its sources: re-running is a no-op until python/, runtime/ or the lock file change.
#
#   scripts/setup-python-sdk.sh [PYTHON]     # PYTHON: the venv's python (default: setup-python.sh's)
#
# Users install the SDK the same way: `pip install ./python` (see docs/python.md).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
python="${1:-${EBBFLOW_PYTHON:-$(scripts/setup-python.sh)}}"
venv_bin="$(dirname "$python")"
stamp="$(dirname "$venv_bin")/.ebbflow-sdk.sha256"
want="$(git ls-files -s python runtime Cargo.lock Cargo.toml | sha256sum | cut -d' ' -f1)$(git diff --stat -- python runtime | sha256sum | cut -d' ' -f1)"
if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]] && "$python" -c "import ebbflow._core" 2>/dev/null; then
  exit 0
fi
echo "==> building the Python SDK wheel (maturin) into $(dirname "$venv_bin")" >&2
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/ebbflow/target}"
PATH="$venv_bin:$PATH" "$python" -m pip install --quiet --disable-pip-version-check \
  --no-build-isolation --no-deps --force-reinstall ./python >&2
echo "$want" >"$stamp"
