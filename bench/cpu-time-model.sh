#!/usr/bin/env bash
# The CPU time model against the CPU backend (issue 21): for every example, the measured step
# (`dmc run --profile`, mean of the steps after the first) and the model's prediction at this
# machine's calibrated rates; then deep_convnet at the caps of a 4-point sweep (predicted by
# `dmc plan --sweep`, measured by `dmc run --vram-cap`, 2 steps each: the floor takes minutes).
# Usage: bench/cpu-time-model.sh [path/to/dmc]   (default target/release/dmc)
set -euo pipefail
DMC=${1:-target/release/dmc}
cd "$(dirname "$0")/.."
echo "| example | measured ms/step | predicted ms/step | measured/predicted |"
echo "|---|---:|---:|---:|"
for e in mlp bn_cnn autoencoder_classifier resnet_small unet mobilenet resnet18 seed deep_convnet; do
  out=$("$DMC" run "examples/$e.dm" --steps 4 --profile -q 2>&1)
  row=$(grep -E '^\| \*\*step' <<<"$out")
  meas=$(awk -F'|' '{gsub(/ /,"",$4); print $4/1000}' <<<"$row")
  pred=$(awk -F'|' '{gsub(/ /,"",$6); print $6/1000}' <<<"$row")
  awk -v e="$e" -v m="$meas" -v p="$pred" 'BEGIN{printf "| %s | %.2f | %.2f | %.2fx |\n", e, m, p, m/p}'
done
echo
"$DMC" plan examples/deep_convnet.dm --sweep --points 4 | tee /tmp/dmc-sweep.txt
echo
echo "| cap (B) | predicted ms/step | measured ms/step |"
echo "|---:|---:|---:|"
grep -E '^ +[0-9,]+ ' /tmp/dmc-sweep.txt | while read -r cap _ _ _ _ _ _ pred _ _; do
  c=${cap//,/}
  meas=$("$DMC" run examples/deep_convnet.dm --steps 2 --vram-cap "$c" 2>&1 | sed -n 's/.*, \([0-9.]*\) ms\/step/\1/p')
  echo "| $cap | $pred | $meas |"
done
