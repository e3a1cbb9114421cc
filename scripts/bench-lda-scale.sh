#!/usr/bin/env bash
# LDA at scale (issue 36): ebbflow (bare loop, in-process parameter server) against gensim's
# LdaMulticore and the `lda` package on the very same planted corpus, every model scored by the
# project's own held-out evaluator, every ratio from one run (runtime/src/bin/ebbflow-lda-scale.rs).
#
# Usage: scripts/bench-lda-scale.sh [ebbflow-lda-scale flags, e.g. --docs 200000 --topics 100]
#
# Peers: gensim 4.4.0 and lda 3.0.2 in a venv of their own (cached by this list). A peer that
# cannot be set up is reported as such in the table.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
export EBBFLOW_CACHE="${EBBFLOW_CACHE:-$HOME/.cache/ebbflow}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$EBBFLOW_CACHE/target}"

# shellcheck source=lib/bench-venv.sh
source scripts/lib/bench-venv.sh
lda_python="$(cached_venv lda-venv "gensim==4.4.0 lda==3.0.2" bench-lda-scale)"
if [[ -n "$lda_python" ]]; then
  export EBBFLOW_LDA_PYTHON="$lda_python"
fi

echo "==> cargo build --release -p ebbflow-runtime --bin ebbflow-lda-scale" >&2
cargo build --release --locked -q -p ebbflow-runtime --bin ebbflow-lda-scale
exec "$CARGO_TARGET_DIR/release/ebbflow-lda-scale" "$@"
