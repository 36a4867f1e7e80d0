#!/usr/bin/env bash
# Streaming (issue 13) on the CPU backend, in one run: the seed network resident and under caps that
# its 826 MB of parameters do not fit, interleaved REPS times (median of each): the arena, the host
# store, the bytes copied each way per step, the CPU step time against the resident step's, and the
# losses (which must be the same). Prints one markdown table.
#
#   bench/streaming.sh                     # seed: resident, 256MB, 128MB; 3 reps of 5 steps
#   REPS=5 STEPS=10 CAPS="512MB 256MB" bench/streaming.sh
set -euo pipefail
cd "$(dirname "$0")/.."
DMC=${DMC:-target/release/dmc}
REPS=${REPS:-3}
STEPS=${STEPS:-5}
EX=${EX:-seed}
CAPS=${CAPS:-"256MB 128MB"}
if [ "$DMC" = target/release/dmc ] && [ -z "${NO_BUILD:-}" ]; then
    cargo build --release --bin dmc >&2
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
field() { # json-file python-expression
    python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print($2)" "$1"
}
run() { # tag flags... -> appends "ms loss" to $work/tag
    local tag=$1
    shift
    "$DMC" run "examples/$EX.dm" --steps "$STEPS" "$@" >"$work/out" 2>&1
    local ms loss
    ms=$(sed -n 's/.*, \([0-9.]*\) ms\/step.*/\1/p' "$work/out" | head -1)
    loss=$(sed -n 's/.*final loss \([0-9.]*\),.*/\1/p' "$work/out" | head -1)
    measured=$(sed -n 's/^memory: .*(arena \([0-9.]*\) MiB.*/\1/p' "$work/out" | head -1)
    echo "$ms $loss $measured" >>"$work/$tag"
}
median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
for _ in $(seq "$REPS"); do
    run resident
    for cap in $CAPS; do run "$cap" --vram-cap "$cap"; done
done
base=$(cut -d' ' -f1 "$work/resident" | median)
echo "| $EX | planned arena (B) | measured arena (MiB) | host store (B) | copied in / written back per step (B) | CPU ms/step | vs resident | final loss |"
echo "|---|---:|---:|---:|---:|---:|---:|---|"
for tag in resident $CAPS; do
    if [ "$tag" = resident ]; then flags=(); else flags=(--vram-cap "$tag"); fi
    "$DMC" plan "examples/$EX.dm" "${flags[@]}" --json >"$work/p.json"
    arena=$(field "$work/p.json" "r['arena_bytes']")
    host=$(field "$work/p.json" "(r.get('streaming') or {}).get('totals', {}).get('host_store', 0)")
    moved=$(field "$work/p.json" "'{:,} / {:,}'.format(*(lambda t: (t.get('host_to_device', 0), t.get('device_to_host', 0)))((r.get('streaming') or {}).get('totals', {})))")
    ms=$(cut -d' ' -f1 "$work/$tag" | median)
    loss=$(cut -d' ' -f2 "$work/$tag" | sort -u | tr '\n' ' ')
    measured=$(cut -d' ' -f3 "$work/$tag" | median)
    ratio=$(python3 -c "print(f'{$ms / $base:.2f}x')")
    comma() { python3 -c "print(f'{int($1):,}')"; }
    printf '| %s | %s | %s | %s | %s | %s | %s | %s|\n' "$tag" "$(comma "$arena")" "$measured" "$(comma "$host")" "$moved" "$ms" "$ratio" "$loss"
done
