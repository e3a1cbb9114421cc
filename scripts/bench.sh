#!/usr/bin/env bash
# Runtime benchmark of issue 3, every ratio measured in one run: sets up the real data
# (scripts/fetch-data.sh) and the benchmark's own Python venv with the peers (bench/setup-venv.sh:
# PyTorch CPU, scikit-surprise, scikit-learn, lda; large, installed once, never by the tests),
# builds ebbflow-bench in release mode and runs it. Extra arguments go to ebbflow-bench
# (e.g. --apps mf,mlr). Prints a Markdown table on stdout; progress on stderr.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
export EBBFLOW_CACHE="${EBBFLOW_CACHE:-$HOME/.cache/ebbflow}"
export EBBFLOW_DATA_DIR="${EBBFLOW_DATA_DIR:-$(scripts/fetch-data.sh)}"
export EBBFLOW_BENCH_PYTHON="${EBBFLOW_BENCH_PYTHON:-$(bench/setup-venv.sh)}"
cargo build --quiet --release -p ebbflow-runtime --bin ebbflow-bench --bin ebbflow-runtime >&2
target_dir="$(cargo metadata --format-version 1 --no-deps | "${PYTHON:-python3}" -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')"
exec "$target_dir/release/ebbflow-bench" "$@"
