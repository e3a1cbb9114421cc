#!/usr/bin/env bash
# Installs Prometheus from Debian's package for the tests that scrape real metrics. Idempotent:
# does nothing when `prometheus --version` already works. The Debian service is never started;
# tests run their own instance on 127.0.0.1 with a generated config. Prints the binary's path.
set -euo pipefail
die() { echo "setup-prometheus: error: $*" >&2; exit 1; }

if ! prometheus --version >/dev/null 2>&1; then
  command -v apt-get >/dev/null || die "prometheus is not installed and apt-get is not available"
  sudo=()
  ((EUID == 0)) || sudo=(sudo)
  echo "setup-prometheus: installing Debian's prometheus package" >&2
  # policy-rc.d exit 101 keeps the package's maintainer scripts from starting the service.
  policy=/usr/sbin/policy-rc.d
  created_policy=0
  if [[ ! -e "$policy" ]]; then
    printf '#!/bin/sh\nexit 101\n' | "${sudo[@]}" tee "$policy" >/dev/null
    "${sudo[@]}" chmod +x "$policy"
    created_policy=1
  fi
  cleanup() { if ((created_policy)); then "${sudo[@]}" rm -f "$policy"; fi; }
  trap cleanup EXIT
  export DEBIAN_FRONTEND=noninteractive
  "${sudo[@]}" apt-get update -qq >&2 || die "apt-get update failed"
  "${sudo[@]}" apt-get install -y -qq --no-install-recommends prometheus >&2 ||
    die "apt-get install prometheus failed"
  prometheus --version >/dev/null 2>&1 || die "prometheus still does not run after installing it"
fi
command -v prometheus
