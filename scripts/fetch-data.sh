#!/usr/bin/env bash
# Fetches the real data sets the runtime's apps and quality tests use, from PyPI wheels that ship
# them, into DEST (default $HOME/.cache/ebbflow/data). Idempotent and cached: files already present
# are kept. Prints the data directory as its only stdout line, so callers can do
#   export EBBFLOW_DATA_DIR="$(scripts/fetch-data.sh)"
#
# The data is never committed: MovieLens' license forbids redistribution.
#   ml-100k.inter                  recbole==1.2.1   recbole/dataset_example/ml-100k/
#   reuters.ldac/.tokens/.titles   lda==3.0.2       lda/tests/
#   digits.csv.gz                  scikit-learn     sklearn/datasets/data/
set -euo pipefail
dest="${1:-${EBBFLOW_DATA_DIR:-$HOME/.cache/ebbflow/data}}"
mkdir -p "$dest"
dest="$(cd "$dest" && pwd)"
wheels="$dest/wheels"
python="${PYTHON:-python3}"

# fetch WHEEL_SPEC MEMBER... : downloads the wheel once, extracts the members flat into $dest.
fetch() {
    local spec="$1"
    shift
    local missing=0 member
    for member in "$@"; do
        [[ -s "$dest/$(basename "$member")" ]] || missing=1
    done
    [[ "$missing" == 1 ]] || return 0
    local name="${spec%%==*}"
    local dir="$wheels/$name"
    mkdir -p "$dir"
    if ! compgen -G "$dir/*.whl" >/dev/null; then
        echo "==> pip download $spec" >&2
        "$python" -m pip download --quiet --disable-pip-version-check --no-deps \
            --only-binary=:all: --python-version 3.11 --platform manylinux2014_x86_64 \
            --platform any -d "$dir" "$spec" >&2
    fi
    local wheel
    wheel="$(compgen -G "$dir/*.whl" | head -n1)"
    "$python" - "$wheel" "$dest" "$@" <<'PY'
import os, sys, zipfile
wheel, dest, members = sys.argv[1], sys.argv[2], sys.argv[3:]
with zipfile.ZipFile(wheel) as archive:
    for member in members:
        target = os.path.join(dest, os.path.basename(member))
        with archive.open(member) as src, open(target + ".part", "wb") as out:
            out.write(src.read())
        os.replace(target + ".part", target)
PY
}

fetch recbole==1.2.1 recbole/dataset_example/ml-100k/ml-100k.inter
fetch lda==3.0.2 lda/tests/reuters.ldac lda/tests/reuters.tokens lda/tests/reuters.titles
fetch scikit-learn==1.5.2 sklearn/datasets/data/digits.csv.gz
echo "$dest"
