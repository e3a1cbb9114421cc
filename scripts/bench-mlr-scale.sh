#!/usr/bin/env bash
# Softmax regression at scale (issue 36): ebbflow (bare loop, in-process parameter server)
# against PyTorch on CPU and scikit-learn's SGDClassifier on the very same planted Gaussian
# classes, with the Bayes-optimal classifier's test accuracy (from the planted means) as the bar,
# every ratio from one run (runtime/src/bin/ebbflow-mlr-scale.rs). Default: 4 M examples × 100
# features × 10 classes, separation 0.15.
#
# Usage: scripts/bench-mlr-scale.sh [ebbflow-mlr-scale flags, e.g. --examples 8000000]
#
# Peers: PyTorch from the test venv (scripts/setup-python.sh); scikit-learn 1.5.2 in a venv of
# its own (cached by this list). A peer that cannot be set up is reported as such in the table.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
export EBBFLOW_CACHE="${EBBFLOW_CACHE:-$HOME/.cache/ebbflow}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$EBBFLOW_CACHE/target}"
export EBBFLOW_BENCH_PYTHON="${EBBFLOW_BENCH_PYTHON:-$(scripts/setup-python.sh)}"

# shellcheck source=lib/bench-venv.sh
source scripts/lib/bench-venv.sh
sklearn_python="$(cached_venv sklearn-venv "numpy==1.26.4 scikit-learn==1.5.2" bench-mlr-scale)"
if [[ -n "$sklearn_python" ]]; then
  export EBBFLOW_SKLEARN_PYTHON="$sklearn_python"
fi

echo "==> cargo build --release -p ebbflow-runtime --bin ebbflow-mlr-scale" >&2
cargo build --release --locked -q -p ebbflow-runtime --bin ebbflow-mlr-scale
exec "$CARGO_TARGET_DIR/release/ebbflow-mlr-scale" "$@"
