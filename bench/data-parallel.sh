#!/usr/bin/env bash
# Data parallel over MPI on this machine (issue 20): per example, one process against 2 and 4
# ranks (`mpirun -np N dmc run --data-parallel`) with the same global batch: each rank's planned and
# measured arena and its share of the optimizer state, the bytes rank 0 sent a step against the
# plan's model of them (`dmc_plan::shard::sent_bytes`), and the step time. Every process gets the
# same cores in all: one process 2 threads, 2 ranks 1 thread each; 4 ranks on 2 cores share them
# (their memory is what that row is for, not their time). Needs Open MPI (`apt install openmpi-bin`).
# Usage: bench/data-parallel.sh [path/to/dmc] [example ...]   (default: target/release/dmc, all three)
set -euo pipefail
DMC=${1:-target/release/dmc}
shift || true
cd "$(dirname "$0")/.."
examples=${*:-mlp resnet_small deep_convnet}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
flags_for() {
  case $1 in
    deep_convnet) echo "--steps 6" ;;
    resnet_small) echo "--steps 40 --batch 32" ;;
    *) echo "--steps 60" ;;
  esac
}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
field() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])" "$1" "$2"; }
echo "| example | ranks | batch per rank | optimizer state per rank | planned arena | measured arena | sent per step (model) | ms/step |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|"
for e in $examples; do
  f=$(flags_for "$e")
  for n in 1 2 4; do
    j="$tmp/$e-$n.json"
    if [ "$n" = 1 ]; then
      # shellcheck disable=SC2086
      out=$("$DMC" run "examples/$e.dm" $f -q --device cpu --summary-json "$j" 2>/dev/null)
    else
      threads=1
      # shellcheck disable=SC2086
      out=$(mpirun --oversubscribe -np "$n" -x RAYON_NUM_THREADS=$threads "$DMC" run "examples/$e.dm" $f -q --device cpu --summary-json "$j" --data-parallel 2>/dev/null)
    fi
    line=$(grep '^data parallel:' <<<"$out" || true)
    state=$(sed -n 's/.* and \(.*\) of the \(.*\) optimizer state.*/\1 of \2/p' <<<"$line")
    sent=$(sed -n 's/.*rank 0 sent \(.*\) a step (the plan.s model: \([^,]*\),.*/\1 (\2)/p' <<<"$line")
    [ "$n" = 1 ] && state="all of it" && sent="-"
    batch=$(grep -o 'batch [0-9]*' <<<"$("$DMC" plan "examples/$e.dm" $( [ "$n" = 1 ] || echo "--data-parallel $n") $(grep -o -- '--batch [0-9]*' <<<"$f" || true) 2>/dev/null | head -1)" | head -1 | cut -d' ' -f2)
    printf '| %s | %s | %s | %s | %s | %s | %s | %.1f |\n' "$e" "$n" "$batch" "$state" \
      "$(field "$j" planned_arena_bytes)" "$(field "$j" measured_arena_bytes)" "$sent" "$(field "$j" ms_per_step)"
  done
done
