#!/usr/bin/env bash
# Coverage-guided fuzzing (issue 38) of what a hostile peer reaches: the frame and message
# decoders, a whole data-plane connection (the handshake, then every request handler) and the
# coordinator's admin API (runtime/src/fuzzing.rs), with AFL++ through cargo-afl on stable Rust.
# Installs cargo-afl and builds AFL++ once (cached), builds the targets instrumented in their own
# target directory, writes the seeds and runs each target for a number of executions:
#   scripts/fuzz.sh                              # 10 M executions per target: the recorded run
#   EBBFLOW_FUZZ_EXECS=30000 scripts/fuzz.sh     # the short run scripts/test.sh makes
#   scripts/fuzz.sh frames                       # one target
# Prints each target's executions, speed and coverage, and fails if one crashed or hung: the
# inputs are then under $EBBFLOW_CACHE/fuzz-out/<target>/default/{crashes,hangs}; each becomes
# a file under fuzz/regressions/<target>/, which runtime/tests/fuzz_regressions.rs replays.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="${EBBFLOW_CACHE:-$HOME/.cache/ebbflow}"
execs="${EBBFLOW_FUZZ_EXECS:-10000000}"
cargo_afl_version="0.18.2"
targets=("$@")
((${#targets[@]})) || targets=(frames connection admin)

# cargo-afl, built once per version.
afl_root="$cache/cargo-afl-$cargo_afl_version"
if [[ ! -x "$afl_root/bin/cargo-afl" ]]; then
  echo "fuzz.sh: installing cargo-afl $cargo_afl_version" >&2
  CARGO_TARGET_DIR="$cache/cargo-afl-build" cargo install --quiet --locked \
    cargo-afl --version "=$cargo_afl_version" --root "$afl_root"
  rm -rf "$cache/cargo-afl-build"
fi
export PATH="$afl_root/bin:$PATH"
# AFL++ itself (afl-fuzz and its runtime), built by cargo-afl once per rustc and cargo-afl.
rustc_id="$(rustc -vV | awk '/^release:/ { r = $2 } /^commit-hash:/ { h = substr($2, 1, 7) } END { print r "-" h }')"
afl_data="${XDG_DATA_HOME:-$HOME/.local/share}/afl.rs/rustc-$rustc_id/afl.rs-$cargo_afl_version"
if [[ ! -x "$afl_data/afl/bin/afl-fuzz" ]]; then
  echo "fuzz.sh: building AFL++ (cargo afl config --build)" >&2
  cargo afl config --build --force >&2
fi

# The targets, instrumented (the main workspace's target directory never sees these flags).
export CARGO_TARGET_DIR="$cache/fuzz-target"
(cd "$repo/fuzz" && cargo afl build --quiet --release --locked)
bin="$CARGO_TARGET_DIR/release"
seeds="$cache/fuzz-seeds"
rm -rf "$seeds" && "$bin/seeds" "$seeds"

# No core dumps to wait for, no CPU governor to check, no terminal UI; each instance on a core
# of its own is bound by afl-fuzz itself.
export AFL_NO_UI=1 AFL_SKIP_CPUFREQ=1 AFL_I_DONT_CARE_ABOUT_MISSING_CRASHES=1
export AFL_QUIET=1 AFL_NO_CRASH_README=1
failed=0
for target in "${targets[@]}"; do
  out="$cache/fuzz-out/$target"
  rm -rf "$out" && mkdir -p "$(dirname "$out")"
  start=$(date +%s)
  # -E: stop after about this many executions; -V: and in any case after an hour.
  cargo afl fuzz -i "$seeds/$target" -o "$out" -E "$execs" -V 3600 -- "$bin/$target" \
    >"$cache/fuzz-$target.log" 2>&1 || {
    echo "fuzz.sh: afl-fuzz on $target failed; its log:" >&2
    tail -n 30 "$cache/fuzz-$target.log" >&2
    exit 1
  }
  stats="$out/default/fuzzer_stats"
  stat() { awk -F' *: *' -v k="$1" '$1 == k { print $2 }' "$stats"; }
  echo "fuzz.sh: $target: $(stat execs_done) executions in $(($(date +%s) - start)) s" \
    "($(stat execs_per_sec)/s), edges found $(stat edges_found) of $(stat total_edges)," \
    "corpus $(stat corpus_count), crashes $(stat saved_crashes), hangs $(stat saved_hangs)"
  if (($(stat saved_crashes) > 0 || $(stat saved_hangs) > 0)); then
    echo "fuzz.sh: $target: inputs that crash or hang are in $out/default/crashes and hangs" >&2
    failed=1
  fi
done
exit "$failed"
