#!/usr/bin/env bash
# A/B of CPU training speed between two dmc binaries, interleaved in one run so both see the same
# machine load: median ms/step of `dmc run --device cpu` per example over ROUNDS rounds.
# Usage: bench/cpu-ab.sh BASE_DMC NEW_DMC [ROUNDS]
# e.g. git worktree add /tmp/base <rev> && (cd /tmp/base && CARGO_TARGET_DIR=/tmp/base-target cargo build --release)
#      bench/cpu-ab.sh /tmp/base-target/release/dmc target/release/dmc 3
set -euo pipefail
cd "$(dirname "$0")/.."
base=$1 new=$2 rounds=${3:-3}
cases=("mlp 300" "resnet_small 200" "seed 3" "deep_convnet 2")
ms() { "$1" run "examples/$2.dm" --steps "$3" --device cpu -q 2>&1 | grep -o '[0-9.]* ms/step' | cut -d' ' -f1; }
median() { sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
printf '%-14s %6s %14s %14s %8s\n' example steps "base ms/step" "new ms/step" new/base
for c in "${cases[@]}"; do
  set -- $c
  b=() n=()
  for _ in $(seq "$rounds"); do b+=("$(ms "$base" "$1" "$2")"); n+=("$(ms "$new" "$1" "$2")"); done
  mb=$(printf '%s\n' "${b[@]}" | median) mn=$(printf '%s\n' "${n[@]}" | median)
  awk -v e="$1" -v s="$2" -v b="$mb" -v n="$mn" 'BEGIN { printf "%-14s %6s %14.1f %14.1f %7.2fx\n", e, s, b, n, n / b }'
done
