#!/usr/bin/env bash
# Fusion (`fuse_epilogues`) vs `--no-fuse`, per example, in one run: kernels per step, the planned
# arena, the bytes the step's kernels move at least (each argument once: the report's model of
# global-memory traffic, the GPU's), and the CPU step time, fused and unfused interleaved (median
# of REPS runs of STEPS steps each). Prints one markdown table.
#
#   bench/fusion.sh                      # all examples, 3 reps of 5 steps
#   REPS=5 STEPS=10 EXAMPLES="mlp resnet_small" bench/fusion.sh
set -euo pipefail
cd "$(dirname "$0")/.."
DMC=${DMC:-target/release/dmc}
REPS=${REPS:-3}
STEPS=${STEPS:-5}
EXAMPLES=${EXAMPLES:-"mlp resnet_small deep_convnet seed"}
if [ "$DMC" = target/release/dmc ] && [ -z "${NO_BUILD:-}" ]; then
    cargo build --release --bin dmc >&2
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

field() { # json-file python-expression
    python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print($2)" "$1"
}
ms() { # example flags...
    local ex=$1
    shift
    "$DMC" run "examples/$ex.dm" --steps "$STEPS" "$@" 2>&1 | sed -n 's/.*, \([0-9.]*\) ms\/step.*/\1/p' | head -1
}
median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

echo "| example | kernels fused / unfused | arena fused / unfused (B) | bytes moved fused / unfused | CPU ms/step fused / unfused (ratio) |"
echo "|---|---:|---:|---:|---:|"
for ex in $EXAMPLES; do
    "$DMC" plan "examples/$ex.dm" --json >"$work/f.json"
    "$DMC" plan "examples/$ex.dm" --json --no-fuse >"$work/u.json"
    kf=$(field "$work/f.json" "r['traffic']['kernels']")
    ku=$(field "$work/u.json" "r['traffic']['kernels']")
    af=$(field "$work/f.json" "r['arena_bytes']")
    au=$(field "$work/u.json" "r['arena_bytes']")
    bf=$(field "$work/f.json" "r['traffic']['bytes']")
    bu=$(field "$work/u.json" "r['traffic']['bytes']")
    : >"$work/tf"
    : >"$work/tu"
    for _ in $(seq "$REPS"); do
        ms "$ex" >>"$work/tf"
        ms "$ex" --no-fuse >>"$work/tu"
    done
    tf=$(median <"$work/tf")
    tu=$(median <"$work/tu")
    ratio=$(python3 -c "print(f'{$tf/$tu:.2f}')")
    printf '| %s | %s / %s | %s / %s | %s / %s | %s / %s (%sx) |\n' \
        "$ex" "$kf" "$ku" "$af" "$au" "$bf" "$bu" "$tf" "$tu" "$ratio"
done
