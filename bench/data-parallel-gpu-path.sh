#!/usr/bin/env bash
# The CUDA path of data parallel without a GPU (issue 20): per example, one CPU process against 2 MPI
# ranks on the emulated CUDA backend (`--device cuda-emu`: the generated CUDA C compiled by g++, the
# sharded steps' programs with their collectives over MPI where a GPU's go over NCCL), the same seed
# and global batch: the weights' relative L2 distance after the steps (all parameters and running
# statistics, bench/.venv's numpy + safetensors), and the performance model's H200 step for one
# process and for one rank of 2 (`dmc plan`: the rank's programs, collectives at NVLink 4's rate).
# The emulator's ms/step is not a GPU time and is not reported. Needs Open MPI and g++.
# Usage: bench/data-parallel-gpu-path.sh [path/to/dmc]
set -euo pipefail
DMC=${1:-target/release/dmc}
cd "$(dirname "$0")/.."
PY=${PY:-bench/.venv/bin/python}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
dist() {
  "$PY" - "$1" "$2" <<'PY'
import sys, numpy as np
from safetensors.numpy import load_file
a, b = load_file(sys.argv[1]), load_file(sys.argv[2])
assert a.keys() == b.keys()
x = np.concatenate([a[k].ravel().astype(np.float64) for k in sorted(a)])
y = np.concatenate([b[k].ravel().astype(np.float64) for k in sorted(b)])
print(f"{np.linalg.norm(x - y) / np.linalg.norm(y):.1e}")
PY
}
predict() { "$DMC" plan "$@" 2>/dev/null | grep -o 'predicted step on H200: [0-9.]* ms' | grep -o '[0-9.]* ms' || echo "?"; }
echo "| example | flags | steps | weights 2 emulated GPU ranks vs 1 CPU process (rel. L2) | model: H200 step, 1 process | model: H200 step, 1 rank of 2 |"
echo "|---|---|---:|---:|---:|---:|"
for spec in "mlp|--steps 5" "resnet_small|--steps 5" "bn_cnn|--steps 3 --batch 8" "deep_convnet|--steps 3 --batch 8 --lr 0.001"; do
  e=${spec%%|*}; f=${spec#*|}
  # shellcheck disable=SC2086
  "$DMC" run "examples/$e.dm" $f -q --device cpu --save "$tmp/$e-1.safetensors" >/dev/null 2>&1
  # shellcheck disable=SC2086
  mpirun --oversubscribe -np 2 -x RAYON_NUM_THREADS=1 "$DMC" run "examples/$e.dm" $f -q --device cuda-emu \
    --data-parallel --save "$tmp/$e-2.safetensors" >/dev/null 2>&1
  b=$(grep -o -- '--batch [0-9]*' <<<"$f" || true)
  # shellcheck disable=SC2086
  printf '| %s | `%s` | %s | %s | %s | %s |\n' "$e" "$f" "$(grep -o -- '--steps [0-9]*' <<<"$f" | cut -d' ' -f2)" \
    "$(dist "$tmp/$e-2.safetensors" "$tmp/$e-1.safetensors")" "$(predict "examples/$e.dm" $b)" \
    "$(predict "examples/$e.dm" $b --data-parallel 2)"
done
