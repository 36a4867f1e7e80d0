#!/usr/bin/env bash
# The static performance model (issue 12), per example, in one run: the predicted step and the
# roofline floor on every GPU of the model's table, and for seed and deep_convnet the H200 kernels
# that take most of the step. Registers from NVRTC where it loads ($DMC_NVRTC), else estimated.
# Prints markdown tables for BENCHMARKS.md. No GPU needed.
#
#   bench/perf-model.sh
#   EXAMPLES="seed mlp" GPUS="H200 GTX960" bench/perf-model.sh
set -euo pipefail
cd "$(dirname "$0")/.."
DMC=${DMC:-target/release/dmc}
EXAMPLES=${EXAMPLES:-"seed deep_convnet resnet_small mlp"}
GPUS=${GPUS:-"H200 H100 A100 RTX4090 GTX960"}
TOP=${TOP:-6}
if [ "$DMC" = target/release/dmc ] && [ -z "${NO_BUILD:-}" ]; then
    cargo build --release --bin dmc >&2
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$DMC" --version
printf '\n| example | GPU | predicted ms/step | floor ms | x floor | launches | registers |\n|---|---|---:|---:|---:|---:|---|\n'
for ex in $EXAMPLES; do
    for g in $GPUS; do
        line=$("$DMC" compile "examples/$ex.dm" -o "$work/$ex" --perf --gpu "$g" | grep -o 'predicted step on .*')
        pred=$(sed -E 's/.*: ([0-9.]+) ms \(.*/\1/' <<<"$line")
        launches=$(sed -E 's/.*\(([0-9]+) launches.*/\1/' <<<"$line")
        floor=$(sed -E 's/.*roofline floor ([0-9.]+) ms.*/\1/' <<<"$line")
        ratio=$(sed -E 's/.*, ([0-9.]+)x it.*/\1/' <<<"$line")
        regs=$(sed -E 's/.*; (registers [^)]*\)?).*/\1/' <<<"$line")
        echo "| $ex | $g | $pred | $floor | $ratio | $launches | $regs |"
    done
done
for ex in seed deep_convnet; do
    case " $EXAMPLES " in *" $ex "*) ;; *) continue ;; esac
    printf '\n%s on the H200, the %s kernels with the most predicted time per step:\n\n' "$ex" "$TOP"
    printf '| kernel | runs | blocks | regs | /SM | waves | floor us | model us | x floor | bound | us per step |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|\n'
    "$DMC" compile "examples/$ex.dm" -o "$work/$ex" --perf --gpu H200 |
        awk '/^kernel /{t=1; next} /^step:/{t=0} t && NF>=15 {printf "%.1f\t| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %.1f |\n", $2*$13, $1,$2,$7,$8,$9,$11,$12,$13,$14,$15,$2*$13}' |
        sort -g -r | head -n "$TOP" | cut -f2-
done
