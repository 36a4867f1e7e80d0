#!/usr/bin/env bash
# The CUDA emulator's fiber switch: the x86-64 assembly switch vs ucontext (swapcontext), measured in
# the same run as the emulated launch time of every kernel of each example's training step (both thread
# orders). Usage: bench/emu-switch.sh [example ...]   (default: mlp resnet_small deep_convnet)
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet
DMC=target/release/dmc
examples=("$@")
[ ${#examples[@]} -gt 0 ] || examples=(mlp resnet_small deep_convnet)
launches() { # switch example -> seconds of emulated launches (second run: compiled kernels cached)
  DMC_EMU_SWITCH=$1 "$DMC" emu-check "examples/$2.dm" >/dev/null
  DMC_EMU_SWITCH=$1 "$DMC" emu-check "examples/$2.dm" | tail -1 | sed -E 's/.*launches ([0-9.]+) s.*/\1/'
}
printf '%-14s %12s %14s %8s\n' example "asm (s)" "ucontext (s)" ratio
for ex in "${examples[@]}"; do
  a=$(launches fast "$ex")
  u=$(launches ucontext "$ex")
  awk -v e="$ex" -v a="$a" -v u="$u" 'BEGIN { printf "%-14s %12s %14s %7.1fx\n", e, a, u, u / a }'
done
