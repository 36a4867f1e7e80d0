#!/usr/bin/env bash
# Where dmc's CPU time goes, per kernel function: builds dmc with line tables (target/profile-build),
# records `dmc run` under `perf record --call-graph dwarf` and aggregates with bench/perf_kernels.py.
#   bench/profile.sh examples/deep_convnet.dm 1 [extra dmc run args, e.g. --data bench/out/deep_convnet/data.safetensors]
# Needs perf (linux-tools). Setup (compile, init, data) is in the profile too; use few steps of a big net, or many
# of a small one, so that the steps dominate.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
prog="$1"; steps="${2:-1}"; shift 2 || true
(cd "$root" && CARGO_PROFILE_RELEASE_DEBUG=line-tables-only cargo build --release -q --target-dir target/profile-build)
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
perf record -q -o "$tmp/perf.data" -F "${PERF_FREQ:-97}" --call-graph dwarf,16384 -- \
  "$root/target/profile-build/release/dmc" run "$prog" --steps "$steps" -q "$@"
perf script -i "$tmp/perf.data" -F comm,tid,ip,sym 2>/dev/null | python3 "$here/perf_kernels.py"
