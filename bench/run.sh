#!/usr/bin/env bash
# dmc vs PyTorch benchmark: makes a local venv (bench/.venv, gitignored) with torch, safetensors and numpy,
# builds dmc (release) and runs bench/bench.py with the given arguments.
#   bench/run.sh                         # every example on the CPU; tables in bench/out/results-cpu.md
#   bench/run.sh --only seed,mlp         # some examples
#   bench/run.sh --device cuda           # on a GPU (PyTorch on CUDA; dmc with --device cuda)
# Environment: BENCH_PYTHON (an interpreter with torch, safetensors, numpy: no venv), PYTHON (default python3), BENCH_VENV (default bench/.venv), TORCH_SPEC (default "torch"),
#              PIP_ARGS (extra pip arguments, e.g. an --index-url), BENCH_NO_BUILD=1 to skip cargo build.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
if [ -n "${BENCH_PYTHON:-}" ]; then
  # An interpreter that already has torch, safetensors and numpy (e.g. on a GPU machine): no venv.
  py="$BENCH_PYTHON"
else
  venv="${BENCH_VENV:-$here/.venv}"
  if [ ! -x "$venv/bin/python" ]; then
    "${PYTHON:-python3}" -m venv "$venv"
  fi
  if ! "$venv/bin/python" -c "import torch, safetensors, numpy" 2>/dev/null; then
    echo "installing ${TORCH_SPEC:-torch} safetensors numpy into $venv ..." >&2
    "$venv/bin/pip" install -q ${PIP_ARGS:-} "${TORCH_SPEC:-torch}" safetensors numpy
  fi
  py="$venv/bin/python"
fi
if [ "${BENCH_NO_BUILD:-0}" != 1 ]; then
  (cd "$root" && cargo build --release -q)
fi
exec "$py" "$here/bench.py" "$@"
