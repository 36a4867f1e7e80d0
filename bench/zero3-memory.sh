#!/usr/bin/env bash
# Sharded parameters (ZeRO-3, issue 20) against sharded optimizer state alone (ZeRO-1): one rank's
# planned arena and the bytes it sends a step, at 1, 2 and 4 ranks, for a few examples (`dmc plan`:
# deterministic, no run). The CPU backend measures what it plans (tests/it/data_parallel_zero3.rs
# trains the ranks; `mpirun -np 2 dmc run ... --data-parallel --shard-parameters` prints both).
# Usage: bench/zero3-memory.sh [path/to/dmc] [example ...]
set -euo pipefail
DMC=${1:-target/release/dmc}
shift || true
cd "$(dirname "$0")/.."
examples=${*:-resnet_small resnet18 gpt deep_convnet seed}
arena() { "$DMC" plan "$@" | grep -oE 'arena [0-9.]+ [KMG]iB \([0-9,]+ B\)' | head -1 | grep -oE '\([0-9,]+' | tr -d '(,'; }
sent() { "$DMC" plan "$@" | grep -oE 'sends [0-9.]+ [KMG]?i?B' | head -1 | cut -d' ' -f2-; }
mib() { awk -v b="$1" 'BEGIN {printf "%.1f", b / 1048576}'; }
echo "| example | 1 process | 2 ranks ZeRO-1 | 2 ranks ZeRO-3 | 4 ranks ZeRO-1 | 4 ranks ZeRO-3 | sent a step at 4 ranks (ZeRO-1 / ZeRO-3) |"
echo "|---|---:|---:|---:|---:|---:|---:|"
# (the seed network's batch of 1 does not split: 4, as `--batch 4` on one process too)
extra() { case $1 in seed) echo "--batch 4" ;; esac; }
for e in $examples; do
  f=examples/$e.dm
  # shellcheck disable=SC2046
  set -- $(extra "$e")
  one=$(arena "$f" "$@")
  row="| $e | $(mib "$one") MiB"
  for n in 2 4; do
    z1=$(arena "$f" "$@" --data-parallel $n)
    z3=$(arena "$f" "$@" --data-parallel $n --shard-parameters)
    row="$row | $(mib "$z1") MiB | $(mib "$z3") MiB ($(awk -v a="$z3" -v b="$z1" 'BEGIN {printf "%.2f", a / b}')x)"
  done
  row="$row | $(sent "$f" "$@" --data-parallel 4) / $(sent "$f" "$@" --data-parallel 4 --shard-parameters) |"
  echo "$row"
done
