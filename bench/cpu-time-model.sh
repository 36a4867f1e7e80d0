#!/usr/bin/env bash
# The CPU time model against the CPU backend (issue 21): every example at every cap of its sweep.
# The caps are `dmc plan --sweep`'s 12 points (from the smallest feasible cap to the arena without
# recomputation); at each, `dmc run --vram-cap CAP --profile` measures the step (each kernel's
# median time over the steps after the first, summed) beside the model's prediction for the same
# plan at this machine's calibrated rates. Each point is run twice and the faster run kept: this
# machine's speed moves by up to 1.5x from one minute to the next (the same plan measured 0.28 and
# 0.47 ms a step minutes apart), and the faster of two is the less disturbed. One run of unet first, untimed: the first seconds of
# work after a build or an idle spell run slower on this machine. The rates are calibrated afresh
# for each point (a new cache directory: dmc's ~2 s built-in calibration, on programs none of
# which is an example, runs right before the point's first run), so the model and the
# measurements see the machine in the same state: on this 2-vCPU machine the second thread comes
# and goes, the same binary measuring mlp at 289, 551, 469 and 302 µs a step within minutes
# (`DMC_CPU_RATES=<file>` to reuse one calibration instead).
# Usage: bench/cpu-time-model.sh [path/to/dmc] [example ...]   (default: target/release/dmc, all)
set -euo pipefail
DMC=${1:-target/release/dmc}
shift || true
cd "$(dirname "$0")/.."
cache_root=$(mktemp -d)
trap 'rm -rf "$cache_root"' EXIT
examples=${*:-mlp bn_cnn autoencoder_classifier resnet_small unet mobilenet resnet18 seed deep_convnet gpt}
steps_for() {
  case $1 in
    seed | gpt) echo 4 ;;
    deep_convnet) echo 3 ;;
    resnet18) echo 8 ;;
    resnet_small | unet | mobilenet) echo 20 ;;
    *) echo 60 ;;
  esac
}
DMC_CACHE_DIR=$cache_root "$DMC" run examples/unet.dm --steps 60 -q >/dev/null 2>&1
echo "| example | cap (B) | measured ms/step | predicted ms/step | measured/predicted |"
echo "|---|---:|---:|---:|---:|"
summary=$(mktemp)
for e in $examples; do
  s=$(steps_for "$e")
  caps=$(DMC_CACHE_DIR=$cache_root "$DMC" plan "examples/$e.dm" --sweep | grep -E '^ +[0-9,]+ ' | awk '{gsub(/,/, "", $1); print $1}')
  for c in none $caps; do
    cap=()
    [ "$c" = none ] || cap=(--vram-cap "$c")
    row=""
    export DMC_CACHE_DIR=$cache_root/$e-$c
    for _ in 1 2; do
      r=$("$DMC" run "examples/$e.dm" --steps "$s" "${cap[@]}" --profile -q 2>&1 | grep -E '^\| \*\*step' || true)
      # (the faster of the two runs: column 4 is the measured µs per step)
      if [ -n "$r" ] && { [ -z "$row" ] || awk -F'|' -v a="$r" -v b="$row" 'BEGIN {split(a, x, "|"); split(b, y, "|"); exit !(x[4] + 0 < y[4] + 0)}'; }; then
        row=$r
      fi
    done
    if [ -z "$row" ]; then
      echo "| $e | $c | failed | | |"
      continue
    fi
    awk -F'|' -v e="$e" -v c="$c" '{gsub(/ /, "", $4); gsub(/ /, "", $6);
      m = $4 / 1000; p = $6 / 1000;
      printf "| %s | %s | %.3f | %.3f | %.2fx |\n", e, (c == "none" ? "uncapped" : c), m, p, m / p}' <<<"$row" |
      tee -a "$summary"
  done
done
echo
awk -F'|' '{gsub(/[ x]/, "", $6); r = $6 + 0; if (r > hi || NR == 1) hi = r; if (r < lo || NR == 1) lo = r; n++}
  END {printf "%d plans: measured/predicted from %.2fx to %.2fx\n", n, lo, hi}' "$summary"
rm -f "$summary"
