#!/usr/bin/env bash
# Builds the operator and runtime images without a container engine (see scripts/oci-image.py):
#
#   scripts/build-images.sh [TAG]      # TAG defaults to the workspace version
#
# writes out/images/ebbflow-{operator,runtime}-TAG.oci.tar from a release build. With
# EBBFLOW_PYTHON set to a Python that has numpy (scripts/setup-python.sh prints one), it also
# writes out/images/ebbflow-runtime-python-TAG.oci.tar: the runtime image for Python apps (its
# `ebbflow` built with --features python, the CPython it links, numpy, the SDK, the examples). Push them with
#   skopeo copy oci-archive:out/images/ebbflow-runtime-TAG.oci.tar docker://REGISTRY/ebbflow-runtime:TAG
# (or `podman load` / `docker load` them) and point the chart at them: image.repository,
# runtimeImage.repository. The Dockerfile builds the same images with an engine.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
tag="${1:-$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)}"
cargo build --release --locked -p ebbflow-operator -p ebbflow-job --features ebbflow-operator/ec2 --bins
target="$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')"
SOURCE_DATE_EPOCH="${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}" \
    python3 scripts/oci-image.py --bin-dir "$target/release" --out out/images --tag "$tag"
if [[ -n "${EBBFLOW_PYTHON:-}" ]]; then
  site_packages="$("$EBBFLOW_PYTHON" -c 'import os, numpy; print(os.path.dirname(os.path.dirname(numpy.__file__)))')" ||
    { echo "build-images: error: EBBFLOW_PYTHON=$EBBFLOW_PYTHON cannot import numpy" >&2; exit 1; }
  # After the images above: this build's `ebbflow` replaces theirs in target/release (cargo keeps
  # both builds, so switching back recompiles nothing).
  cargo build --release --locked -p ebbflow-job --features python --bin ebbflow
  SOURCE_DATE_EPOCH="${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}" \
      python3 scripts/oci-image.py --python-bin "$target/release/ebbflow" --site-packages "$site_packages" \
      --sdk python/ebbflow --examples examples/python --out out/images --tag "$tag"
fi
