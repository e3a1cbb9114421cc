#!/usr/bin/env bash
# Matrix factorization at the seed's scale (issue 36): ebbflow (bare loop, in-process parameter
# server) against LIBMF and PyTorch on CPU on the very same Netflix-shaped planted ratings, every
# ratio from one run (runtime/src/bin/ebbflow-mf-scale.rs). Default: 25 M ratings at the Netflix
# prize data's density (119,468 users × 17,770 items), true rank 16, noise 0.1, learned rank 32,
# SGD rate 0.03 (decay 0.92 a pass), L2 0.02, test RMSE bar 0.2.
#
# Usage: scripts/bench-mf-scale.sh [ebbflow-mf-scale flags, e.g. --ratings 50000000 --rank 1000]
#
# Peers: PyTorch from the test venv (scripts/setup-python.sh); Spark MLlib ALS (pyspark 4.0.1 in a
# venv of its own, cached; local mode, Java 17); LIBMF 0.9.2 built once (cached)
# from the `libmf` sdist's sources with LIBMF's own Makefile flags (-O3 -march=native, SSE,
# OpenMP), loaded through the binding's ctypes interface. A peer that cannot be set up is
# reported as such in the table.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
export EBBFLOW_CACHE="${EBBFLOW_CACHE:-$HOME/.cache/ebbflow}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$EBBFLOW_CACHE/target}"
python="${EBBFLOW_BENCH_PYTHON:-$(scripts/setup-python.sh)}"

libmf_version=0.9.2
libmf="$EBBFLOW_CACHE/libmf-$libmf_version/libmf.so"
if [[ ! -f "$libmf" ]]; then
  echo "==> building LIBMF $libmf_version from the libmf sdist (once)" >&2
  src="$(mktemp -d)"
  if "$python" -m pip download --quiet --disable-pip-version-check --no-deps --no-binary :all: \
      "libmf==$libmf_version" -d "$src" >&2 &&
    tar -xzf "$src/libmf-$libmf_version.tar.gz" -C "$src" &&
    mkdir -p "$(dirname "$libmf")" &&
    g++ -O3 -march=native -pthread -std=c++11 -DUSESSE -DUSEOMP -fopenmp -shared -fPIC \
      "$src/libmf-$libmf_version/src_cpp/libmf_interface.cpp" \
      "$src/libmf-$libmf_version/src_cpp/mf.cpp" -o "$libmf.tmp"; then
    mv "$libmf.tmp" "$libmf"
  else
    echo "bench-mf-scale: LIBMF could not be built; its row will say so" >&2
  fi
  rm -rf "$src"
fi
export EBBFLOW_LIBMF="$libmf"

# Spark MLlib ALS: pyspark (it brings Spark's jars; Java 17 runs them) in a venv of its own, so
# the test venv stays small. Created once, cached by this list's hash.
# pyarrow 26 needs NumPy 2 (with 1.26.4 pinned here, the Spark row failed to import pyarrow).
# shellcheck source=lib/bench-venv.sh
source scripts/lib/bench-venv.sh
spark_python="$(cached_venv spark-venv "pyspark==4.0.1 pyarrow==26.0.1 numpy==2.4.6" bench-mf-scale)"
if [[ -n "$spark_python" ]] && command -v java >/dev/null; then
  export EBBFLOW_SPARK_PYTHON="$spark_python"
fi

echo "==> cargo build --release -p ebbflow-runtime --bin ebbflow-mf-scale" >&2
cargo build --release --locked -q -p ebbflow-runtime --bin ebbflow-mf-scale
exec "$CARGO_TARGET_DIR/release/ebbflow-mf-scale" --python "$python" "$@"
