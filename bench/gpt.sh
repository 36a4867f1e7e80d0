#!/usr/bin/env bash
# examples/gpt.dm vs the same GPT in PyTorch: loss parity (T 256) and training memory (T 1024); bench/gpt.py, tables in bench/out/gpt.md.
# Same environment as run.sh (BENCH_PYTHON, BENCH_VENV, TORCH_SPEC, PIP_ARGS, BENCH_NO_BUILD=1); run.sh makes the venv and builds, so this runs it with `--help` as a no-op.
set -euo pipefail; here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"; "$here/run.sh" --help >/dev/null; exec "${BENCH_PYTHON:-${BENCH_VENV:-$here/.venv}/bin/python}" "$here/gpt.py" "$@"
